"""Flawed-positive penalty (FAPO, issue 23): a generative judge reads each rollout whose final answer is CORRECT,
split into numbered steps, and names the earliest flawed step (``\\boxed{k}``) or ``\\boxed{-1}`` when the reasoning
holds; a correct rollout with a flawed step is a *flawed positive* and its reward is cut by the penalty λ.

``FlawedPositivePenalty`` is a reward term scoring −1 on a flawed positive and 0 elsewhere; its ``weight`` is λ on
the run's reward scale, so the summed reward is ``accuracy − λ·[flawed positive]``. FAPO's verifiable reward is ±1
with λ = 1 (a flawed positive lands at 0, midway between right and wrong); on our 0/1 accuracy the same midpoint is
λ = 1/2 — the same group-normalised advantages, since ±1 = 2·(0/1) − 1.

* correctness: ``verifier`` (a reward term, by default ``Accuracy``), a row is correct when its score is
  ``>= correct_at``. Only correct rows are sent to the judge (wrong ones are never penalised, as in FAPO).
* the judge prompt (``template``, fields ``{question}``, ``{ground_truth}``, ``{steps}``): the completion split
  by ``split`` (rlexp.rewards.process.split_steps) into steps numbered from 0 (``Step k: ...``).
* the verdict: group 1 of the LAST match of ``pattern`` (default ``\\boxed{<integer>}``); −1 = no flaw, k in
  [0, n_steps) = the earliest flawed step. Anything else (no match, an index out of range) is a FAILURE of the row:
  counted in ``reward/<term>/failures`` and not penalised (FAPO's code treats an unparsable verdict as not flawed).
* the judge model: as ``GenerativeJudge`` (rlexp.rewards.judges: ``initial`` = a frozen copy of the initial policy,
  ``policy``, or a model config); verdicts cached per (question, completion).

Metrics (``reward/<term>/...``): ``flawed_positive_frac`` (flawed positives / correct rows that parsed),
``penalty_mean`` (λ × the share of all rows penalised), ``positives`` (correct rows), ``judged`` (replies generated),
``cache_hits``, ``parsed_frac`` (of the judged rows)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from rlexp.core.registry import REWARDS
from rlexp.rewards.judges import JudgeBackend, compile_pattern
from rlexp.rewards.process import SPLIT_MODES, split_steps
from rlexp.rewards.reward_model import LRUCache, pair_key
from rlexp.rewards.terms import Accuracy, RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)

FLAW_TEMPLATE = (
    "Below is a math problem, its reference answer, and a solution written in numbered steps.\n\n"
    "Problem:\n{question}\n\n"
    "Reference answer:\n{ground_truth}\n\n"
    "Solution:\n{steps}\n\n"
    "Check the solution step by step. If a step contains an error (a wrong calculation, a guess, or a jump in the "
    "reasoning), give the number of the EARLIEST such step; if every step is sound, give -1. Put the number in "
    "\\boxed{{}}."
)
BOXED_INDEX = r"\\boxed\{\s*(-?\d+)\s*\}"


def number_steps(text: str, split: str = "paragraphs", tag_pattern: str | None = None) -> tuple[str, int]:
    """The completion as ``Step 0: ...`` lines (one per step of ``split``) and the number of steps (>= 1)."""
    spans = split_steps(text, split, tag_pattern) or [(0, len(text))]
    steps = [text[a:b] for a, b in spans]
    return "\n".join(f"Step {k}: {s}" for k, s in enumerate(steps)), len(steps)


def parse_flaw(reply: str, n_steps: int, pattern: str | re.Pattern = BOXED_INDEX) -> int | None:
    """The earliest flawed step named by ``reply`` (group 1 of the last match): −1 (no flaw) or k in [0, n_steps);
    None when nothing matches, the group is not an integer or k is out of range."""
    rx = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, re.I)
    matches = list(rx.finditer(reply or ""))
    if not matches:
        return None
    try:
        k = int((matches[-1].group(1) or "").strip())
    except ValueError:
        return None
    return k if k == -1 or 0 <= k < n_steps else None


@REWARDS.register
class FlawedPositivePenalty(RewardTerm):
    """−1 on a flawed positive (a correct rollout whose reasoning the judge finds flawed), else 0; ``weight`` = λ
    (module doc)."""

    def __init__(
        self,
        weight: float = 0.5,
        judge_model=None,
        device: str = "auto",
        verifier: RewardTerm | None = None,
        answer_format: str = "hash",
        correct_at: float = 1.0,
        template: str = FLAW_TEMPLATE,
        pattern: str = BOXED_INDEX,
        split: str = "paragraphs",
        tag_pattern: str | None = None,
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 8,
        seed: int = 0,
        system_prompt: str | None = None,
        reply_prefix: str = "",
        cache: int = 4096,
        question_key: str = "question",
        answer_key: str = "answer",
        generate: Callable[[list[str]], list[str]] | None = None,
    ):
        super().__init__(weight)
        if self.weight < 0:
            raise ValueError(f"FlawedPositivePenalty.weight={weight}: the penalty λ must be >= 0 (the term scores -1)")
        if split not in SPLIT_MODES:
            raise ValueError(f"FlawedPositivePenalty.split={split!r}: one of {list(SPLIT_MODES)}")
        fields = {"question": "q", "ground_truth": "g", "steps": "s"}
        try:
            template.format(**fields)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"FlawedPositivePenalty.template: a field other than {sorted(fields)} ({e!r})") from e
        if "{steps}" not in template:
            raise ValueError("FlawedPositivePenalty.template has no {steps} field")
        if verifier is not None and not callable(verifier):
            raise ValueError(f"FlawedPositivePenalty.verifier={verifier!r}: a reward term (a _target_ node)")
        self.pattern = compile_pattern(pattern, "FlawedPositivePenalty.pattern")
        self.backend = JudgeBackend(
            judge_model, device, max_new_tokens, do_sample, temperature, top_p, batch_size, seed, system_prompt,
            reply_prefix, generate, "FlawedPositivePenalty",
        )  # fmt: skip
        self.verifier = verifier if verifier is not None else Accuracy(answer_format=answer_format)
        self.correct_at, self.template, self.split, self.tag_pattern = float(correct_at), template, split, tag_pattern
        self.question_key, self.answer_key = question_key, answer_key
        self.cache = LRUCache(cache)

    def bind_policy(self, model, tokenizer) -> None:
        self.backend.bind(model, tokenizer)

    def prompt(self, question: str, ground_truth: str, completion: str) -> tuple[str, int]:
        steps, n = number_steps(completion, self.split, self.tag_pattern)
        return self.template.format(question=question, ground_truth=ground_truth, steps=steps), n

    def score(self, sample: Sample) -> float:
        return self([sample]).scores[0]

    def __call__(self, samples: list[Sample]) -> TermResult:
        n = len(samples)
        if not n:
            return TermResult([], [])
        if self.backend.live:
            self.cache.clear()
        checked = self.verifier(samples)
        correct = [not f and s >= self.correct_at for s, f in zip(checked.scores, checked.failures or [False] * n)]
        rec = [s.record or {} for s in samples]
        questions = [str(r.get(self.question_key, s.prompt)) for r, s in zip(rec, samples)]
        keys = [pair_key(q, s.completion) for q, s in zip(questions, samples)]
        verdicts: list = [self.cache.get(k) if c else None for k, c in zip(keys, correct)]
        todo = [i for i in range(n) if correct[i] and verdicts[i] is LRUCache.MISS]
        hits = sum(correct) - len(todo)
        if todo:
            if self.backend.kind != "fixed":
                self.backend.model()  # no judge model to hand: a configuration error, raised
            asked = [
                self.prompt(questions[i], str(rec[i].get(self.answer_key, "")), samples[i].completion) for i in todo
            ]
            try:
                replies = self.backend([p for p, _ in asked])
            except Exception as e:  # generation failed on the batch: every judged row a failure, the run goes on
                log.warning("reward FlawedPositivePenalty failed on a batch of %d: %r", len(todo), e)
                replies = [None] * len(todo)
            for i, (_, steps), r in zip(todo, asked, replies):
                verdicts[i] = None if r is None else parse_flaw(r, steps, self.pattern)
                if r is not None:
                    self.cache.put(keys[i], verdicts[i])
        failures = [c and v is None for c, v in zip(correct, verdicts)]
        flawed = [c and v is not None and v >= 0 for c, v in zip(correct, verdicts)]
        parsed = sum(c and v is not None for c, v in zip(correct, verdicts))
        positives = sum(correct)
        metrics = {
            "flawed_positive_frac": sum(flawed) / parsed if parsed else 0.0,
            "penalty_mean": self.weight * sum(flawed) / n,
            "positives": float(positives),
            "judged": float(len(todo)),
            "cache_hits": float(hits),
            "parsed_frac": parsed / positives if positives else 1.0,
        }
        return TermResult([-1.0 if f else 0.0 for f in flawed], failures, metrics=metrics)
