"""Reward terms. A term maps the samples of a batch (with their group) to one score each.

``RewardTerm.score(sample)`` scores one sample; ``__call__(samples)`` scores a list and, when a
sample raises, records the failure for that sample (score 0, flagged) instead of crashing the run.
Group-aware terms override ``__call__`` (they see every sample with its ``group``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from functools import cache

from rlexp.core.registry import REWARDS
from rlexp.data.reasoning_gym_compat import import_reasoning_gym
from rlexp.rewards.answers import choice_letter, extract_answer, math_equal

log = logging.getLogger(__name__)


@dataclass
class Sample:
    prompt: str
    completion: str
    record: dict
    group: int
    num_tokens: int
    truncated: bool
    completion_ids: list[int] | None = None  # the sampled token ids (without padding)


@dataclass
class TermResult:
    scores: list[float]
    failures: list[bool] = field(default_factory=list)  # the term raised on the sample (scored 0)
    missing: list[bool] = field(default_factory=list)  # the term returned None, "does not apply" (scored 0)
    # the term's own scalars for the step's metrics, logged as reward/<term name>/<key> (the code reward's
    # compile errors, timeouts and throughput); keys must not be mean, std or failures (the trainer's own)
    metrics: dict[str, float] = field(default_factory=dict)
    # per sample, (completion token index, reward) pairs paid at those tokens (a process reward's step scores at the
    # step ends); None: the term pays through its score only. A term that gives them pays through them: the reward
    # stage adds weight × them to batch.extras["token_rewards"] and its score column enters the outcome at weight 0
    token_rewards: list[list[tuple[int, float]]] | None = None


class RewardTerm:
    """Base class. ``weight`` multiplies the term in the total reward."""

    def __init__(self, weight: float = 1.0):
        self.weight = float(weight)

    def score(self, sample: Sample) -> float:
        raise NotImplementedError(f"{type(self).__name__} must implement score() or __call__()")

    def __call__(self, samples: list[Sample]) -> TermResult:
        scores, failures = [], []
        for s in samples:
            try:
                scores.append(float(self.score(s)))
                failures.append(False)
            except Exception as e:  # a failing sample is recorded, never a crashed run
                log.warning("reward %s failed on a sample: %r", type(self).__name__, e)
                scores.append(0.0)
                failures.append(True)
        return TermResult(scores, failures)


@cache
def _rg_scorer(task: str):
    return import_reasoning_gym().get_score_answer_fn(task)


def check_answer(answer: str | None, record: dict) -> float:
    """Score an extracted answer against a record's ground truth with the record's scorer."""
    if answer is None:
        return 0.0
    scorer = record.get("scorer", "math")
    if scorer == "reasoning_gym":
        entry = {"question": record["question"], "answer": record["answer"], "metadata": record["metadata"]}
        return float(_rg_scorer(record["metadata"]["source_dataset"])(answer, entry))
    if scorer == "math":
        return float(math_equal(answer, record["answer"]))
    if scorer == "exact":
        return float(answer.strip() == record["answer"].strip())
    if scorer == "choice":  # the multiple-choice view (rlexp.data.multiple_choice): the option, by letter or content
        meta = record.get("metadata") or {}
        return float(choice_letter(answer, meta.get("letters", "ABCD"), meta.get("options")) == record["answer"])
    if scorer == "sat":  # SAT problems (rlexp.data.sat): any assignment satisfying every clause
        from rlexp.rewards.sat import score_answer

        return score_answer(answer, record)
    if scorer == "qa":  # short factual answers (rlexp.data.search_facts, NQ/HotpotQA): SQuAD-normalised exact match
        from rlexp.rewards.search import exact_match, gold_answers

        return exact_match(answer, gold_answers(record))
    raise ValueError(f"unknown scorer {scorer!r} in record {record.get('id')}")


@REWARDS.register
class Accuracy(RewardTerm):
    """Correctness of the final answer: math-verify for math answers, the reasoning-gym scorer for
    its tasks. ``fallback_last_number`` scores the last number when no formatted answer is stated."""

    def __init__(self, weight: float = 1.0, answer_format: str = "hash", fallback_last_number: bool = True):
        super().__init__(weight)
        self.answer_format, self.fallback = answer_format, fallback_last_number

    def score(self, sample: Sample) -> float:
        ans = extract_answer(sample.completion, self.answer_format, fallback_last_number=self.fallback)
        return check_answer(ans, sample.record)


_TAG_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)


@REWARDS.register
class Format(RewardTerm):
    """1 when the completion follows the answer convention, else 0.

    ``hash``: the last non-empty line is ``#### <answer>``; ``tag``: ``<think>…</think><answer>…</answer>``
    and nothing else (DeepSeek-R1, 2025); ``boxed``: a non-empty ``\\boxed{…}``. With ``require_end`` a
    completion cut at ``max_new_tokens`` scores 0: it has no end, so it does not end with the answer (the
    default prompt's instruction), which stops a policy from earning the bonus by repeating ``#### <answer>``
    lines up to the cap. With ``only_correct`` the bonus goes only to a completion whose formatted answer is
    also correct: a group whose answers are all wrong then has no reward spread, instead of one that the group
    normalisation blows up to unit advantages for the format alone (which taught SmolLM2 to answer
    ``#### <guess>`` and lose its accuracy, issue 30)."""

    def __init__(
        self,
        weight: float = 1.0,
        answer_format: str = "hash",
        require_end: bool = False,
        only_correct: bool = False,
    ):
        super().__init__(weight)
        self.answer_format = answer_format
        self.require_end = require_end
        self.only_correct = only_correct

    def score(self, sample: Sample) -> float:
        if self.require_end and sample.truncated:
            return 0.0
        if self.only_correct:
            stated = extract_answer(sample.completion, self.answer_format, fallback_last_number=False)
            if stated is None or not check_answer(stated, sample.record):
                return 0.0
        text = sample.completion.strip()
        if self.answer_format == "hash":
            lines = [l for l in text.splitlines() if l.strip()]
            return float(bool(lines) and re.fullmatch(r"\s*####\s*\S.*", lines[-1]) is not None)
        if self.answer_format == "tag":
            return float(_TAG_FORMAT.match(text) is not None)
        if self.answer_format == "boxed":
            return float(extract_answer(text, "boxed") is not None)
        raise ValueError(f"reward format answer_format={self.answer_format!r} is not one of hash, tag, boxed")


ABSTAIN_PATTERNS = (
    r"\bi (?:do not|don't) know\b",
    r"\bi am not sure\b",
    r"\bi'm not sure\b",
    r"\bcannot (?:be )?(?:determined|answer(?:ed)?)\b",
    r"\bunable to (?:answer|determine)\b",
)


@REWARDS.register
class Truthfulness(RewardTerm):
    """TruthRL's ternary reward ("TruthRL: Incentivizing Truthful LLMs via Reinforcement Learning", 2025): +1 for a
    correct answer, 0 for an abstention, −1 for a wrong one (a hallucination). An abstention is a completion whose
    stated answer (or, without one, whose text) matches one of ``abstain_patterns`` (case-insensitive regular
    expressions: "I don't know" and the like). Correctness as ``Accuracy``."""

    def __init__(
        self,
        weight: float = 1.0,
        answer_format: str = "hash",
        fallback_last_number: bool = False,
        abstain_patterns: tuple[str, ...] | list[str] = ABSTAIN_PATTERNS,
        correct: float = 1.0,
        abstain: float = 0.0,
        wrong: float = -1.0,
    ):
        super().__init__(weight)
        self.answer_format, self.fallback = answer_format, fallback_last_number
        try:
            self.abstain_re = [re.compile(p, re.I) for p in abstain_patterns]
        except re.error as e:
            raise ValueError(f"reward term Truthfulness.abstain_patterns: {e}") from e
        self.values = (float(correct), float(abstain), float(wrong))

    def abstains(self, completion: str) -> bool:
        stated = extract_answer(completion, self.answer_format, fallback_last_number=False)
        text = stated if stated is not None else completion
        return any(p.search(text) for p in self.abstain_re)

    def score(self, sample: Sample) -> float:
        correct, abstain, wrong = self.values
        if self.abstains(sample.completion):
            return abstain
        ans = extract_answer(sample.completion, self.answer_format, fallback_last_number=self.fallback)
        return correct if check_answer(ans, sample.record) >= 1.0 else wrong
