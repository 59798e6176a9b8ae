"""AdaCoT's CoT-triggering penalty ("AdaCoT: Pareto-Optimal Adaptive Chain-of-Thought Triggering via Reinforcement
Learning", Lou et al., 2025; arXiv 2505.11896).

AdaCoT lets the model decide per query whether to reason (a non-empty ``<think>`` block) or answer directly (an
empty or absent one), and shapes that decision with a penalty on the reward, restated from the paper (§2.2):

    R(x, r) = R_base(x, r) − α1·P_miss(x, r) − α2·P_over(x, r) − γ·P_fmt(r)

P_miss = 1 when the query needed CoT and the response did not reason, P_over = 1 when it reasoned without need,
P_fmt = 1 for a malformed response; "needed" is a per-query label (the paper's auxiliary-model labelling). Moving
α1, α2 traces the performance / triggering-rate Pareto front.

Here ``CotTriggerPenalty`` is the −(α1·P_miss + α2·P_over) part as one reward term (weight 1: the coefficients are
its own settings); R_base is the accuracy term and γ·P_fmt the ``Format`` term (a bonus γ for a well-formed response
is −γ·P_fmt up to the constant γ). Without a necessity label (``needs_cot_key`` null, or a record without it) a
query counts as not needing CoT: the penalty is α2 whenever the response reasons, the plain "penalty when reasoning
is triggered". With the label (a truthy ``record[needs_cot_key]``) both parts act.

"CoT triggered" (``cot_triggered``): the response opens a ``<think>`` block (after optional white space) whose
content is non-empty; ``<think></think>`` or no block at all is a direct answer.
"""

from __future__ import annotations

from rlexp.core.registry import REWARDS
from rlexp.rewards.terms import RewardTerm, Sample


def reasoning_part(completion: str, open_tag: str = "<think>", close_tag: str = "</think>") -> str | None:
    """The text inside the completion's opening reasoning block (up to ``close_tag``, or to an ``<answer>`` tag or
    the end when it is never closed); None when the completion does not open with ``open_tag``."""
    stripped = completion.lstrip()
    if not stripped.startswith(open_tag):
        return None
    body = stripped[len(open_tag) :]
    end = body.find(close_tag)
    if end < 0:
        end = body.find("<answer>")
    return body if end < 0 else body[:end]


def cot_triggered(completion: str, open_tag: str = "<think>", close_tag: str = "</think>") -> bool:
    """The completion reasons: its opening reasoning block has non-blank content."""
    part = reasoning_part(completion, open_tag, close_tag)
    return part is not None and part.strip() != ""


def trigger_penalty(triggered: bool, needed: bool, alpha_miss: float, alpha_over: float) -> float:
    """−(α1·P_miss + α2·P_over): −α1 for a needed CoT left out, −α2 for an unneeded one, else 0."""
    if triggered and not needed:
        return -alpha_over
    if needed and not triggered:
        return -alpha_miss
    return 0.0


@REWARDS.register
class CotTriggerPenalty(RewardTerm):
    """AdaCoT's triggering penalty (module doc) as a reward term: ``alpha_over`` (α2) when the response reasons without
    need, ``alpha_miss`` (α1) when a query labelled as needing CoT (``record[needs_cot_key]`` truthy) is answered
    directly. The score is the (non-positive) penalty; keep ``weight`` 1 and move the α's."""

    def __init__(
        self,
        weight: float = 1.0,
        alpha_over: float = 0.1,
        alpha_miss: float = 0.1,
        needs_cot_key: str | None = None,
        open_tag: str = "<think>",
        close_tag: str = "</think>",
    ):
        super().__init__(weight)
        if alpha_over < 0 or alpha_miss < 0:
            raise ValueError(
                f"reward term CotTriggerPenalty: alpha_over={alpha_over} and alpha_miss={alpha_miss} must be >= 0"
            )
        self.alpha_over, self.alpha_miss = float(alpha_over), float(alpha_miss)
        self.needs_cot_key = needs_cot_key
        self.open_tag, self.close_tag = open_tag, close_tag

    def score(self, sample: Sample) -> float:
        needed = bool(sample.record.get(self.needs_cot_key, False)) if self.needs_cot_key else False
        triggered = cot_triggered(sample.completion, self.open_tag, self.close_tag)
        return trigger_penalty(triggered, needed, self.alpha_miss, self.alpha_over)
