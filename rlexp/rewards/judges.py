"""Generative judges (LLM-as-judge, issue 23): a causal LM reads a prompt holding the question and the answer(s) and
writes a verdict, parsed into a score.

* ``GenerativeJudge`` — a pointwise reward term: the judge grades each completion (``template``; by default on a
  1–10 scale, replying ``Score: N`` or ``<score>N</score>``), the last match of ``pattern`` in its reply is the grade,
  normalised from ``scale`` onto [0, 1] (``parse_score``; or mapped through ``verdicts``, a word -> value table, for a
  verdict such as ``correct``/``incorrect``). A reply with no grade, a malformed grade or one outside ``scale`` is a
  FAILURE of the term on that row (scored ``failure_score``, counted in ``reward/<term>/failures``), never a crash.
* ``PairwiseJudge`` — ``compare(question, a, b)``: P(a ≻ b) from the judge's ``Verdict: A | B | tie`` (1, 0, 1/2;
  ``parse_verdict``). Judges favour a position, so with ``swap`` (the default) the pair is also asked as (b, a) and the
  two verdicts averaged (``swap_average``: P in {0, 1/4, 1/2, 3/4, 1}); a pair whose verdict (either order, with
  ``swap``) does not parse is None. The preference family uses it as its model judge
  (``PairwisePreference(judge="model")``, rlexp.algorithms.group_stages.preference).

The judge model (``judge_model``): a ``model/`` config node (``${model}``: the run's own base model, loaded once and
frozen — the initial policy; or any other model entry), ``initial`` (a frozen copy of the policy taken when the
trainer binds the term, or at a stage's first call: the initial policy of a fresh run) or ``policy`` (the live policy:
the judge sees the current weights, under ``no_grad``; its cache then lives one call only). Generation goes through
``rlexp.data.generation.hf_sampler`` (the prompt chat-templated as a user turn; greedy unless ``do_sample``), batched
by ``batch_size``, on a forked RNG so the training run's random stream is not moved. The reply is pre-filled with
``reply_prefix`` (``Score:`` / ``Verdict:``): SmolLM2-135M asked for "Score: N" echoes the answer instead, but given
"Score:" it writes a number (set ``reply_prefix: ""`` to let a strong judge reason before its verdict). Verdicts are
cached per (question, completion) in an LRU (``cache`` entries). Templates and patterns are our own wording.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence

import torch

from rlexp.core.registry import REWARDS
from rlexp.models.copies import weights_copy
from rlexp.rewards.reward_model import LRUCache, pair_key
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)

POINTWISE_TEMPLATE = (
    "You are grading an answer to a question.\n\n"
    "Question:\n{question}\n\n"
    "Answer:\n{completion}\n\n"
    "Is the answer correct, complete and clearly stated? Grade it from 1 (wrong or useless) to 10 (correct and "
    "clear). End your reply with the line 'Score: N', N your grade."
)
# "Score: 7", "score = 7", "Score: **7**", "<score>7</score>": the number is the group
SCORE_PATTERN = r"(?:score\s*[:=]\s*\**\s*|<score>\s*)(-?\d+(?:\.\d+)?)"

PAIRWISE_TEMPLATE = (
    "Two answers to the same question follow.\n\n"
    "Question:\n{question}\n\n"
    "Answer A:\n{a}\n\n"
    "Answer B:\n{b}\n\n"
    "Which answer is better, A or B? Judge correctness first, then clarity. End your reply with the line "
    "'Verdict: A', 'Verdict: B' or 'Verdict: tie'."
)
VERDICT_PATTERN = r"(?:verdict\s*[:=]\s*\**\s*\[?\s*|<verdict>\s*)(A|B|tie)\b"
VERDICT_VALUES = {"a": 1.0, "b": 0.0, "tie": 0.5}
JUDGE_SOURCES = ("initial", "policy")


def compile_pattern(pattern: str, key: str) -> re.Pattern:
    """``pattern`` compiled case-insensitively; it must have a capturing group (the grade or verdict)."""
    try:
        rx = re.compile(pattern, re.I)
    except re.error as e:
        raise ValueError(f"{key}={pattern!r}: {e}") from e
    if rx.groups < 1:
        raise ValueError(f"{key}={pattern!r} has no capturing group: the grade or verdict must be group 1")
    return rx


def parse_score(
    text: str,
    pattern: str | re.Pattern = SCORE_PATTERN,
    scale: Sequence[float] = (1, 10),
    verdicts: Mapping[str, float] | None = None,
) -> float | None:
    """The judge's grade in [0, 1]: group 1 of the LAST match of ``pattern`` in ``text``, as a number normalised
    from ``scale`` = (lowest, highest) — (g − lowest) / (highest − lowest) — or, with ``verdicts``, the value of the
    (lower-cased) word. None when nothing matches (missing), the group is not a number / not a known word
    (malformed), or the number lies outside ``scale`` (out of range)."""
    rx = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, re.I)
    matches = list(rx.finditer(text or ""))
    if not matches:
        return None
    word = (matches[-1].group(1) or "").strip()
    if verdicts is not None:
        table = {str(k).lower(): float(v) for k, v in verdicts.items()}
        return table.get(word.lower())
    try:
        grade = float(word)
    except ValueError:
        return None
    lo, hi = float(scale[0]), float(scale[1])
    if not math.isfinite(grade) or not lo <= grade <= hi:
        return None
    return (grade - lo) / (hi - lo)


def parse_verdict(text: str, pattern: str | re.Pattern = VERDICT_PATTERN) -> float | None:
    """P(first answer ≻ second) from the LAST verdict in ``text``: A -> 1, B -> 0, tie -> 1/2; None without one."""
    rx = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, re.I)
    matches = list(rx.finditer(text or ""))
    return VERDICT_VALUES.get(matches[-1].group(1).strip().lower()) if matches else None


def swap_average(p_ab: float | None, p_ba: float | None) -> float | None:
    """P(a ≻ b) from the verdict asked as (a, b) and the one asked as (b, a): the mean of p_ab and 1 − p_ba (a judge
    that always answers "A" ties); None unless both parsed."""
    if p_ab is None or p_ba is None:
        return None
    return (p_ab + (1.0 - p_ba)) / 2.0


class JudgeBackend:
    """Where a judge's replies come from (module doc: ``judge_model``), and how they are generated; ``generate``: a
    ready ``texts -> replies`` function instead (tests)."""

    def __init__(
        self,
        judge_model=None,
        device: str = "auto",
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 8,
        seed: int = 0,
        system_prompt: str | None = None,
        reply_prefix: str = "",
        generate: Callable[[list[str]], list[str]] | None = None,
        owner: str = "GenerativeJudge",
    ):
        if generate is None and judge_model is None:
            raise ValueError(
                f"{owner}.judge_model is not set: 'initial' (a frozen copy of the initial policy), 'policy' (the live "
                "policy) or a model config (e.g. ${model}: the run's base model, frozen)"
            )
        if isinstance(judge_model, str) and judge_model not in JUDGE_SOURCES:
            raise ValueError(f"{owner}.judge_model={judge_model!r}: one of {JUDGE_SOURCES} or a model config")
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"{owner}: max_new_tokens ({max_new_tokens}) and batch_size ({batch_size}) must be >= 1")
        if do_sample and not (temperature > 0 and 0 < top_p <= 1):
            raise ValueError(f"{owner}: sampling needs temperature > 0 and top_p in (0, 1] ({temperature}, {top_p})")
        self.kind = "fixed" if generate is not None else (judge_model if isinstance(judge_model, str) else "config")
        self.cfg, self.device, self.owner = judge_model, device, owner
        self.sampling = dict(
            max_new_tokens=int(max_new_tokens),
            do_sample=bool(do_sample),
            temperature=float(temperature),
            top_p=float(top_p),
            batch_size=int(batch_size),
            seed=int(seed),
            system_prompt=system_prompt,
            reply_prefix=reply_prefix,
        )
        self.reply_prefix = reply_prefix
        self._generate = generate
        self._model = self._tok = None
        self._autocast = None

    @property
    def live(self) -> bool:
        """The judge is the live policy: its verdicts change as it trains (no cache across calls)."""
        return self.kind == "policy"

    def bind(self, model, tokenizer, autocast_dtype=None) -> None:
        """Give the judge the policy: ``policy`` judges with it; ``initial`` copies it once (frozen)."""
        if model is None:
            return
        if self.kind == "policy":
            self._model, self._tok, self._autocast = model, tokenizer, autocast_dtype
        elif self.kind == "initial" and self._model is None:
            self._model = weights_copy(model).eval().requires_grad_(False)
            self._tok, self._autocast = tokenizer, autocast_dtype

    def model(self):
        if self.kind == "config" and self._model is None:
            from rlexp.rewards.factuality import load_scorer  # frozen, loaded once per (config, device)

            self._model, self._tok = load_scorer(self.cfg, self.device)
        if self._model is None:
            raise RuntimeError(
                f"{self.owner}.judge_model={self.kind!r} judges with the policy, which it has not been given (the "
                "trainer binds it; outside training give a model config or call bind(model, tokenizer))"
            )
        return self._model, self._tok

    def __call__(self, texts: Sequence[str]) -> list[str]:
        """One reply per judge prompt (each sent as a user turn), starting with ``reply_prefix``."""
        if not texts:
            return []
        if self._generate is not None:
            return [self.reply_prefix + str(r) for r in self._generate(list(texts))]
        from rlexp.data.generation import hf_sampler

        model, tok = self.model()
        device = next(model.parameters()).device
        cuda = []
        if device.type == "cuda":
            cuda = [device.index if device.index is not None else torch.cuda.current_device()]
        amp = (
            torch.autocast(device.type, dtype=self._autocast)
            if self._autocast is not None and self._autocast != torch.float32
            else contextlib.nullcontext()
        )
        with torch.random.fork_rng(devices=cuda), amp, torch.no_grad():  # the run's random stream stays where it was
            replies = hf_sampler(model, tok, **self.sampling)(list(texts), 1)
        return [self.reply_prefix + r[0] for r in replies]


def _check_template(template: str, fields: dict, key: str) -> None:
    try:
        template.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{key}: the template has a field other than {sorted(fields)} ({e!r})") from e
    missing = [f for f in fields if "{" + f + "}" not in template]
    if missing:
        raise ValueError(f"{key} has no {', '.join('{' + f + '}' for f in missing)} field")


@REWARDS.register
class GenerativeJudge(RewardTerm):
    """Pointwise LLM-as-judge: the judge model's grade of each completion, in [0, 1] (module doc); a verdict that
    does not parse is a failure of the row (``reward/<term>/failures``), scored ``failure_score``. Metrics:
    ``parsed_frac``, ``cache_hits``, ``judged`` (replies generated this step)."""

    judges_correctness = True  # scores in [0, 1]: the run logs its agreement with the accuracy term

    def __init__(
        self,
        weight: float = 1.0,
        judge_model=None,
        policy: bool = False,
        device: str = "auto",
        template: str = POINTWISE_TEMPLATE,
        pattern: str = SCORE_PATTERN,
        scale: Sequence[float] = (1, 10),
        verdicts: Mapping[str, float] | None = None,
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 8,
        seed: int = 0,
        system_prompt: str | None = None,
        reply_prefix: str = "Score:",
        failure_score: float = 0.0,
        cache: int = 4096,
        question_key: str = "question",
        generate: Callable[[list[str]], list[str]] | None = None,
    ):
        super().__init__(weight)
        if policy:
            if judge_model not in (None, "policy"):
                raise ValueError(f"GenerativeJudge.policy=true judges with the live policy, not {judge_model!r}")
            judge_model = "policy"
        _check_template(template, {"question": "q", "completion": "c"}, "GenerativeJudge.template")
        self.pattern = compile_pattern(pattern, "GenerativeJudge.pattern")
        scale = tuple(float(x) for x in scale)
        if verdicts is None and not (len(scale) == 2 and scale[0] < scale[1]):
            raise ValueError(f"GenerativeJudge.scale={list(scale)}: [lowest, highest] with lowest < highest")
        if verdicts is not None and not all(0.0 <= float(v) <= 1.0 for v in dict(verdicts).values()):
            raise ValueError(f"GenerativeJudge.verdicts={dict(verdicts)}: every value must be in [0, 1]")
        self.backend = JudgeBackend(
            judge_model, device, max_new_tokens, do_sample, temperature, top_p, batch_size, seed, system_prompt,
            reply_prefix, generate, "GenerativeJudge",
        )  # fmt: skip
        self.template, self.scale = template, scale
        self.verdicts = None if verdicts is None else {str(k): float(v) for k, v in dict(verdicts).items()}
        self.failure_score, self.question_key = float(failure_score), question_key
        self.cache = LRUCache(cache)

    def bind_policy(self, model, tokenizer) -> None:
        """Called by the trainer with the policy (``initial``: copied now, before the first update; ``policy``)."""
        self.backend.bind(model, tokenizer)

    def prompt(self, question: str, completion: str) -> str:
        return self.template.format(question=question, completion=completion)

    def grade(self, reply: str) -> float | None:
        return parse_score(reply, self.pattern, self.scale, self.verdicts)

    def score(self, sample: Sample) -> float:
        return self([sample]).scores[0]

    def __call__(self, samples: list[Sample]) -> TermResult:
        if not samples:
            return TermResult([], [])
        if self.backend.live:  # the judge moves with training: a verdict holds for this call only
            self.cache.clear()
        questions = [str(s.record.get(self.question_key, s.prompt)) if s.record else s.prompt for s in samples]
        keys = [pair_key(q, s.completion) for q, s in zip(questions, samples)]
        grades: list = [self.cache.get(k) for k in keys]
        hits = sum(g is not LRUCache.MISS for g in grades)
        todo = [i for i, g in enumerate(grades) if g is LRUCache.MISS]
        if todo:
            if self.backend.kind != "fixed":
                self.backend.model()  # no judge model to hand: a configuration error, raised
            try:
                replies = self.backend([self.prompt(questions[i], samples[i].completion) for i in todo])
            except Exception as e:  # generation failed on the batch: every row a failure, the run goes on
                log.warning("reward GenerativeJudge failed on a batch of %d: %r", len(todo), e)
                replies = [None] * len(todo)
            for i, r in zip(todo, replies):
                grades[i] = None if r is None else self.grade(r)
                if r is not None:
                    self.cache.put(keys[i], grades[i])  # a reply that does not parse stays a failure (greedy)
        failures = [g is None for g in grades]
        metrics = {
            "parsed_frac": 1.0 - sum(failures) / len(samples),
            "cache_hits": float(hits),
            "judged": float(len(todo)),
        }
        return TermResult([self.failure_score if g is None else float(g) for g in grades], failures, metrics=metrics)


class PairwiseJudge:
    """Pairwise LLM-as-judge (module doc): ``compare(question, a, b)`` -> P(a ≻ b) or None; ``compare_many`` asks
    a list of pairs in batched generations. ``stats`` holds the last call's ``asked`` (replies generated),
    ``unparsed`` (replies without a verdict) and ``cache_hits``."""

    def __init__(
        self,
        judge_model=None,
        device: str = "auto",
        template: str = PAIRWISE_TEMPLATE,
        pattern: str = VERDICT_PATTERN,
        swap: bool = True,
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 8,
        seed: int = 0,
        system_prompt: str | None = None,
        reply_prefix: str = "Verdict:",
        cache: int = 4096,
        generate: Callable[[list[str]], list[str]] | None = None,
        owner: str = "PairwiseJudge",
    ):
        _check_template(template, {"question": "q", "a": "a", "b": "b"}, f"{owner}.template")
        self.pattern = compile_pattern(pattern, f"{owner}.pattern")
        self.backend = JudgeBackend(
            judge_model, device, max_new_tokens, do_sample, temperature, top_p, batch_size, seed, system_prompt,
            reply_prefix, generate, owner,
        )  # fmt: skip
        self.template, self.swap = template, bool(swap)
        self.cache = LRUCache(cache)
        self.stats: dict[str, float] = {}

    def bind(self, model, tokenizer, autocast_dtype=None) -> None:
        self.backend.bind(model, tokenizer, autocast_dtype)

    def prompt(self, question: str, a: str, b: str) -> str:
        return self.template.format(question=question, a=a, b=b)

    def compare(self, question: str, a: str, b: str) -> float | None:
        return self.compare_many([(question, a, b)])[0]

    def compare_many(self, triples: Sequence[tuple[str, str, str]]) -> list[float | None]:
        """P(a ≻ b) for each (question, a, b); None where the verdict did not parse."""
        if self.backend.live:
            self.cache.clear()
        # with swap both orders are asked, so P(b ≻ a) = 1 − P(a ≻ b): one cache entry per unordered pair
        flip = [self.swap and b < a for _, a, b in triples]
        keys = [pair_key("pair", q, *((b, a) if f else (a, b))) for (q, a, b), f in zip(triples, flip)]
        found: list = [self.cache.get(k) for k in keys]
        todo = sorted({k for k, v in zip(keys, found) if v is LRUCache.MISS})
        first = {k: (q, *((b, a) if f else (a, b))) for (q, a, b), f, k in zip(triples, flip, keys)}
        texts = [self.prompt(*first[k]) for k in todo]
        if self.swap:
            texts += [self.prompt(first[k][0], first[k][2], first[k][1]) for k in todo]
        try:
            replies = self.backend(texts) if texts else []
        except Exception as e:  # generation failed: every pair of the call without a verdict, the run goes on
            log.warning("PairwiseJudge failed on %d prompts: %r", len(texts), e)
            replies = [""] * len(texts)
        verdicts = [parse_verdict(r, self.pattern) for r in replies]
        results = {k: v for k, v in zip(keys, found) if v is not LRUCache.MISS}
        n = len(todo)
        for j, k in enumerate(todo):
            p = swap_average(verdicts[j], verdicts[n + j]) if self.swap else verdicts[j]
            self.cache.put(k, p)
            results[k] = p
        self.stats = {
            "asked": float(len(texts)),
            "unparsed": float(sum(v is None for v in verdicts)),
            "cache_hits": float(sum(v is not LRUCache.MISS for v in found)),
        }
        return [None if results[k] is None else (1.0 - results[k] if f else results[k]) for k, f in zip(keys, flip)]
