"""TP-GRPO's thought units (Stage I of "Good Learners Think Their Thinking: Generative PRM Makes Large Reasoning Model
More Efficient Math Learner", He, Mu, Liao, Cao, Liu, Qin; 2025; arXiv 2507.23317; ICLR 2026 as "Smarter Not Harder:
Generative Process Evaluation with Intrinsic-Signal Driving and Ability-Adaptive Reward Shaping"; code
github.com/cs-holder/tp_grpo, not stored here).

Each completion's steps (the process reward term's split and cached step scores) are judged right (score >=
``threshold``) or wrong; the last step holds the final answer, so its label is the outcome (a correct solution's
answer is right; in a wrong solution the answer's steps are the ones "adopted into the wrong answer", TP-GRPO's
conservative assumption); then maximal runs of consecutive steps with the same label are merged into thoughts
(``rlexp.rewards.process.merge_thoughts``'s rule). The stage marks each thought but the last at its last token in
``batch.extras["thought_labels"]`` (N, T): +1 judged right, −1 judged wrong; ``batch.extras["thought_correct"]``
(N,) holds the outcome (``outcome_term`` >= ``correct_min``). The TP-GRPO advantage
(``rlexp.algorithms.advantages.thought_process.tp_grpo``) turns them into the capability-adaptive process rewards.

The paper judges steps with an intrinsic-signal GenPRM (reflection positioning and error tracing in correct
solutions, answer matching in wrong ones); here any step scorer of the process term stands in (a PRM, a
``StepJudge``): in a wrong solution, a step judged wrong plays "matching the wrong answer" and one judged right
"uncertain". A row the process term could not score, or a term without step scores, is one thought (the outcome
alone). The process term leaves the reward (weight 0, its column still logged) unless ``blend: true``.

Metrics: ``tp_grpo/thoughts_mean`` (thoughts per row), ``tp_grpo/multi_thought_frac`` (rows with two thoughts or
more: rows the process reward reaches), ``tp_grpo/wrong_thought_frac`` (marked thoughts judged wrong)."""

from __future__ import annotations

import logging

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.process import token_positions

log = logging.getLogger(__name__)

THOUGHT_LABELS = "thought_labels"  # (N, T): +1 / −1 at the last token of each thought but the row's last
THOUGHT_CORRECT = "thought_correct"  # (N,) 1.0 where the outcome is correct


def thought_units(scores: list[float], ends: list[int], correct: bool, threshold: float = 0.5):
    """(ends, labels) of a row's thoughts: steps labelled +1 (score >= ``threshold``) or −1, the last step labelled
    by the outcome, runs of one label merged (each thought ends where its last step ends)."""
    if not scores:
        return [], []
    marks = [1 if s >= threshold else -1 for s in scores]
    marks[-1] = 1 if correct else -1
    units, labels = [], []
    for k, (e, m) in enumerate(zip(ends, marks)):
        if k + 1 == len(marks) or marks[k + 1] != m:  # a run of one label ends here
            units.append(e)
            labels.append(m)
    return units, labels


@GROUP_STAGES.register
class ThoughtUnits:
    """Group stage: TP-GRPO's thought units (module docstring) for the ``tp_grpo`` advantage. ``process_term``: the
    process reward term (``ProcessReward``: its split and cached step scores); ``outcome_term``: the verifiable
    reward a row is correct by (``>= correct_min``)."""

    needs_reference = False

    def __init__(
        self,
        process_term: str = "prm",
        outcome_term: str = "accuracy",
        correct_min: float = 1.0,
        threshold: float = 0.5,
        blend: bool = False,
    ):
        self.process_term, self.outcome_term = process_term, outcome_term
        self.correct_min, self.threshold, self.blend = float(correct_min), float(threshold), bool(blend)

    def step_layout(self, batch: RolloutBatch, ctx) -> list[tuple[list[float], list[int]] | None]:
        """Each row's (step scores, step end offsets), None where there are none (one thought)."""
        term = (getattr(ctx, "reward_terms", None) or {}).get(self.process_term)
        if term is None or not (hasattr(term, "step_scores") and hasattr(term, "spans")):
            return [None] * len(batch)
        out = []
        for p, c in zip(batch.prompts, batch.completions):
            scores = term.step_scores(p, c)
            spans = term.spans(c)
            out.append((list(scores), [b for _, b in spans]) if scores and len(scores) == len(spans) else None)
        return out

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        for key, name in (("process_term", self.process_term), ("outcome_term", self.outcome_term)):
            if name not in batch.reward_names:
                raise KeyError(
                    f"algorithm.group_stages: ThoughtUnits.{key}={name!r} is not a reward term (terms: "
                    f"{batch.reward_names}); TP-GRPO needs a process reward and a verifiable outcome: e.g. "
                    "reward=judge_prm (a step judge) or reward=accuracy_prm (a PRM in reward.terms.prm.model)"
                )
        j = batch.reward_names.index(self.process_term)
        w = float(batch.reward_weights[j]) if batch.reward_weights is not None else 0.0
        if not self.blend and w != 0.0:  # the process reward enters through the thoughts, not the outcome
            batch.reward = batch.reward - w * batch.rewards[:, j]
            batch.reward_weights = batch.reward_weights.clone()
            batch.reward_weights[j] = 0.0
        n, width = batch.completion_ids.shape
        correct = batch.term(self.outcome_term).float() >= self.correct_min
        labels = torch.zeros(n, width, dtype=torch.float32)
        layout = self.step_layout(batch, ctx) if n else []
        tokenizer = getattr(ctx, "tokenizer", None)
        lengths = batch.completion_mask.sum(-1).tolist()
        n_units, multi, marked, wrong = 0, 0, 0, 0
        for i, row in enumerate(layout):
            if row is None:
                n_units += 1
                continue
            ends, labs = thought_units(row[0], row[1], bool(correct[i]), self.threshold)
            n_units += len(ends)
            if len(ends) < 2:
                continue
            if tokenizer is None:
                raise RuntimeError("ThoughtUnits places thought rewards at tokens: it needs ctx.tokenizer")
            ids = batch.completion_ids[i, : int(lengths[i])].tolist()
            try:
                pos = token_positions(tokenizer, ids, batch.completions[i], ends[:-1])
            except Exception as e:  # a row whose thoughts cannot be placed: one thought, the run goes on
                log.warning("ThoughtUnits could not place the thoughts of row %d: %r", i, e)
                continue
            multi += 1
            for t, lab in zip(pos, labs[:-1]):
                labels[i, t] += float(lab)  # two thoughts ending on one token: their rewards add, as in the sum
                marked += 1
                wrong += lab < 0
        batch.extras[THOUGHT_LABELS] = labels.to(batch.completion_ids.device)
        batch.extras[THOUGHT_CORRECT] = correct.float().to(batch.completion_ids.device)
        batch.stats.update(
            {
                "tp_grpo/thoughts_mean": n_units / max(1, n),
                "tp_grpo/multi_thought_frac": multi / max(1, n),
                "tp_grpo/wrong_thought_frac": wrong / marked if marked else 0.0,
            }
        )
        return batch
