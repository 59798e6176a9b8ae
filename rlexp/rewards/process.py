"""Process rewards (issue 23): a completion cut into steps, each step scored by a process reward model (PRM), the step
scores aggregated into one sequence score and, on request, paid at the step ends as token-level rewards.

The parts, each usable alone:

* ``split_steps(text, mode)`` — the steps of a completion as character spans ``(start, end)`` of their stripped text:
  ``lines`` (each non-blank line), ``paragraphs`` (blocks between blank lines, ``\\n\\n``: PROF's and Qwen2.5-Math-PRM's
  step separator), ``sentences`` (ended by ``.``/``!``/``?`` before white space or the end, or by a line break; a
  decimal point is no end), ``tagged`` (a regular expression: with a ``(?P<step>…)`` group every match's group is a
  step, ``<step>…</step>``; without one every match starts a step that runs to the next, ``Step 1:`` … — text before
  the first tag is a step too when it is not blank). A text with no separator is one step; a blank text has none.
* ``token_positions(tokenizer, ids, text, ends)`` — the completion token at which each step ends: the sampled ids
  decoded incrementally (prefix decodes, binary-searched per step end: exact for the tokens the policy sampled, any
  tokenizer); where the ids are absent or do not decode to the text, the fast tokenizer's offsets on the re-tokenised
  text instead (the token that holds the step's last character).
* ``aggregate_steps(scores, how)`` — ``min`` | ``product`` | ``last`` | ``mean`` of the step scores; no step → None.
* ``merge_thoughts(ends, scores, threshold)`` — TP-GRPO's "thought" units: maximal runs of consecutive steps on the
  same side of ``threshold`` (judged right / wrong) merged into one unit, scored by the mean of its steps and ending
  where its last step ends (the merge is the paper's; the unit's score and threshold are ours).
* Step scorers: anything with ``score_steps(question, steps) -> list[float] | None`` (``StepScorer``; a generative
  judge with a step prompt can implement it), optionally ``score_batch(questions, steps_lists)``. ``PRMScorer`` is a
  PRM checkpoint in one of two conventions:

  - ``math_shepherd`` (Math-Shepherd, Wang et al. 2024; ``peiyi9979/math-shepherd-mistral-7b-prm``): a causal LM;
    the input is ``"{question} {steps}"`` with a step tag (``" ки"``) after each step; a step's score is
    P(good) / (P(good) + P(bad)) of the next-token logits at the tag, good/bad = ``"+"`` / ``"-"``;
  - ``qwen_prm`` (Qwen2.5-Math-PRM, Zhang et al. 2025; the PRM PROF uses): a token-classification head (2 labels);
    the chat template over (system, question, the steps joined and ended by ``"<extra_0>"``); a step's score is the
    softmax's label-1 probability at its ``<extra_0>``. The checkpoint's own modelling code needs
    ``trust_remote_code: true``; without it ``AutoModelForTokenClassification`` loads the path (what the tests use).
    Not checked against the released 7B checkpoint (no network here).

  Both are batched (right padding), run on their own device and dtype, and find each tag through the tokenizer's
  offset mapping, so a tag of several tokens works (the score is read at the tag's last token).
* ``ProcessReward`` — the reward term: split, score (cached per (prompt, completion), with a hit counter), aggregate
  into the term's value; with ``dense: true`` the step scores are also paid at the step ends' tokens
  (``TermResult.token_rewards`` → ``batch.extras["token_rewards"]``, REINFORCE++ and GAE consume them) and the term's
  column enters the outcome reward at weight 0 (its weight multiplies the token rewards instead: no double count).
  A row whose scoring fails is a failure (``reward/<term>/failures``), never a crash.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from rlexp.core.registry import REWARDS
from rlexp.rewards.answers import ANSWER_FORMATS, extract_answer
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)

SPLIT_MODES = ("lines", "sentences", "paragraphs", "tagged")
DEFAULT_TAG_PATTERN = r"(?im)^[ \t]*step[ \t]*\d+[ \t]*[:.]"
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)|\n")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")


def _stripped(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The span of ``text[start:end]`` without its surrounding white space; None when blank."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def _pieces(text: str, cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The non-blank stripped spans between the separator spans ``cuts`` (in order)."""
    spans, at = [], 0
    for a, b in cuts:
        s = _stripped(text, at, a)
        if s:
            spans.append(s)
        at = b
    s = _stripped(text, at, len(text))
    if s:
        spans.append(s)
    return spans


def split_steps(text: str, mode: str = "paragraphs", pattern: str | None = None) -> list[tuple[int, int]]:
    """The steps of ``text`` as character spans (see the module docstring for the modes)."""
    if mode == "lines":
        return _pieces(text, [(m.start(), m.end()) for m in re.finditer(r"\n", text)])
    if mode == "paragraphs":
        return _pieces(text, [(m.start(), m.end()) for m in _PARAGRAPH_BREAK.finditer(text)])
    if mode == "sentences":
        # the end marks stay with their sentence: cut after them
        return _pieces(text, [(m.end(), m.end()) for m in _SENTENCE_END.finditer(text)])
    if mode == "tagged":
        rx = re.compile(pattern or DEFAULT_TAG_PATTERN)
        if "step" in rx.groupindex:
            spans = [_stripped(text, m.start("step"), m.end("step")) for m in rx.finditer(text) if m.group("step")]
            spans = [s for s in spans if s]
            if spans:
                return spans
            return _pieces(text, [])
        starts = [m.start() for m in rx.finditer(text)]
        bounds = [0, *[s for s in starts if s > 0], len(text)]
        spans = [_stripped(text, a, b) for a, b in zip(bounds, bounds[1:])]
        return [s for s in spans if s]
    raise ValueError(f"process reward split={mode!r} is not one of {list(SPLIT_MODES)}")


AGGREGATIONS = ("min", "product", "last", "mean")


def aggregate_steps(scores: Sequence[float], how: str = "min") -> float | None:
    """One sequence score from the step scores: ``min``, ``product``, ``last`` or ``mean``; None without steps."""
    if how not in AGGREGATIONS:
        raise ValueError(f"process reward aggregate={how!r} is not one of {list(AGGREGATIONS)}")
    if not scores:
        return None
    if how == "min":
        return float(min(scores))
    if how == "product":
        return float(math.prod(scores))
    if how == "last":
        return float(scores[-1])
    return float(sum(scores) / len(scores))


def merge_thoughts(ends: Sequence[int], scores: Sequence[float], threshold: float = 0.5):
    """TP-GRPO's thought units: runs of consecutive steps judged alike (score >= ``threshold`` or not) merged; each
    unit ends where its last step ends and scores the mean of its steps. Returns (ends, scores) of the units."""
    out_ends: list[int] = []
    out_scores: list[float] = []
    run: list[float] = []
    for k, (e, s) in enumerate(zip(ends, scores)):
        run.append(float(s))
        last = k == len(scores) - 1
        if last or (scores[k + 1] >= threshold) != (s >= threshold):
            out_ends.append(e)
            out_scores.append(sum(run) / len(run))
            run = []
    return out_ends, out_scores


def token_positions(tokenizer, ids: Sequence[int] | None, text: str, ends: Sequence[int]) -> list[int]:
    """The index in ``ids`` (the completion's sampled tokens) of the token holding each step end (a character offset
    into ``text``; see the module docstring for the two ways)."""
    ids = list(ids or [])
    if not ends:
        return []
    if ids and tokenizer.decode(ids, skip_special_tokens=True) == text:
        cache: dict[int, int] = {}

        def length(k: int) -> int:  # characters the first k tokens decode to
            if k not in cache:
                cache[k] = len(tokenizer.decode(ids[:k], skip_special_tokens=True))
            return cache[k]

        out, lo = [], 1
        for e in ends:
            a, b = lo, len(ids)
            while a < b:  # the smallest k with length(k) >= e
                mid = (a + b) // 2
                if length(mid) >= e:
                    b = mid
                else:
                    a = mid + 1
            out.append(a - 1)
            lo = a
        return out
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    limit = (len(ids) if ids else len(offsets)) - 1
    out = []
    for e in ends:
        pos = max((i for i, (a, b) in enumerate(offsets) if a < e and b > a), default=0)
        out.append(max(0, min(pos, limit)))
    return out


@runtime_checkable
class StepScorer(Protocol):
    """What ``ProcessReward`` needs from a step scorer (a PRM checkpoint, or a generative judge with a step prompt):
    one score in [0, 1] per step, or None when the steps cannot be scored (counted as the row's failure). A scorer may
    also offer ``score_batch(questions, steps_lists) -> list[list[float] | None]`` to score many rows at once."""

    def score_steps(self, question: str, steps: list[str]) -> list[float] | None: ...


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STYLES = ("math_shepherd", "qwen_prm")
QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
_PRMS: dict[tuple, tuple] = {}


def _device(device: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)


def load_prm(path: str, style: str, device: torch.device, dtype: torch.dtype, trust_remote_code: bool = False):
    """The frozen PRM and its tokenizer, loaded once per (path, style, device, dtype) and kept for the process."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    key = (str(path), style, str(device), str(dtype), bool(trust_remote_code))
    if key not in _PRMS:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        if style == "math_shepherd":
            cls = AutoModelForCausalLM
        else:
            cls = AutoModel if trust_remote_code else AutoModelForTokenClassification
        model = cls.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
        model.to(device).eval().requires_grad_(False)
        _PRMS[key] = (model, tok)
    return _PRMS[key]


class PRMScorer:
    """A PRM checkpoint as a step scorer (conventions in the module docstring). ``model``: a path or hub id;
    ``loaded``: an already loaded (model, tokenizer) instead (tests)."""

    def __init__(
        self,
        model: str | None = None,
        style: str = "math_shepherd",
        step_tag: str = " ки",
        good_token: str = "+",
        bad_token: str = "-",
        template: str = "{question} {steps}",
        step_join: str = "\n",
        system_prompt: str = QWEN_SYSTEM,
        device: str = "auto",
        dtype: str = "float32",
        batch_size: int = 8,
        max_length: int = 4096,
        trust_remote_code: bool = False,
        loaded: tuple | None = None,
    ):
        if style not in STYLES:
            raise ValueError(f"style={style!r} is not one of {list(STYLES)}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not one of {list(DTYPES)}")
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size={batch_size} and max_length={max_length} must be >= 1")
        if "{steps}" not in template:
            raise ValueError(f"template={template!r} has no {{steps}} field")
        if not step_tag:
            raise ValueError("step_tag is empty: the PRM reads each step's score at its tag")
        self.style, self.template, self.step_join, self.system = style, template, step_join, system_prompt
        self.step_tag = step_tag if style == "math_shepherd" else "<extra_0>"
        self.batch_size, self.max_length = int(batch_size), int(max_length)
        if loaded is None:
            if not model:
                raise ValueError("model is not set: a PRM checkpoint path or hub id")
            loaded = load_prm(model, style, _device(device), DTYPES[dtype], trust_remote_code)
        self.model, self.tokenizer = loaded
        self.device = next(self.model.parameters()).device
        if style == "math_shepherd":
            good, bad = self._single_token(good_token, "good_token"), self._single_token(bad_token, "bad_token")
            self.candidates = torch.tensor([good, bad])
            if good == bad:
                raise ValueError(f"good_token={good_token!r} and bad_token={bad_token!r} are the same token")

    def _single_token(self, word: str, key: str) -> int:
        ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"{key}={word!r} is {len(ids)} tokens for the PRM's tokenizer: it must be one token")
        return int(ids[0])

    def render(self, question: str, steps: list[str]) -> tuple[str, list[int]]:
        """The PRM's input text and the character offset where each step's tag ends."""
        if self.style == "qwen_prm":
            body = "".join(s.strip() + self.step_tag for s in steps)
            msgs = [
                {"role": "system", "content": self.system},
                {"role": "user", "content": question},
                {"role": "assistant", "content": body},
            ]
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
            at = text.rfind(body)
            if at < 0:
                raise ValueError("the chat template changed the steps' text: cannot find the step tags")
            ends, off = [], at
            for s in steps:
                off += len(s.strip()) + len(self.step_tag)
                ends.append(off)
            return text, ends
        head, tail = self.template.split("{steps}", 1)
        head = head.format(question=question)
        parts, ends, off = [], [], len(head)
        for k, s in enumerate(steps):
            piece = (self.step_join if k else "") + s.strip() + self.step_tag
            parts.append(piece)
            off += len(piece)
            ends.append(off)
        return head + "".join(parts) + tail.format(question=question), ends

    @torch.no_grad()
    def score_batch(self, questions: Sequence[str], steps_lists: Sequence[list[str]]) -> list[list[float] | None]:
        """Each row's step scores (None for a row that cannot be scored: no step, or longer than ``max_length``)."""
        out: list[list[float] | None] = [None] * len(questions)
        rows = []
        for i, (q, steps) in enumerate(zip(questions, steps_lists)):
            if steps:
                text, ends = self.render(q, list(steps))
                rows.append((i, text, ends))
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "right"
        try:
            for k in range(0, len(rows), self.batch_size):
                chunk = rows[k : k + self.batch_size]
                enc = self.tokenizer(
                    [t for _, t, _ in chunk], return_tensors="pt", padding=True, return_offsets_mapping=True
                )
                offsets = enc.pop("offset_mapping")
                keep = [r for r in range(len(chunk)) if int(enc["attention_mask"][r].sum()) <= self.max_length]
                for r in set(range(len(chunk))) - set(keep):
                    log.warning(
                        "PRM input of row %d is longer than max_length=%d: not scored", chunk[r][0], self.max_length
                    )
                if not keep:
                    continue
                width = min(int(enc["attention_mask"][keep].sum(-1).max()), enc["input_ids"].shape[1])
                ids = enc["input_ids"][keep, :width].to(self.device)
                mask = enc["attention_mask"][keep, :width].to(self.device)
                res = self.model(input_ids=ids, attention_mask=mask)
                logits = (res.logits if hasattr(res, "logits") else res[0]).float()
                if self.style == "math_shepherd":
                    probs = torch.softmax(logits[..., self.candidates.to(logits.device)], -1)[..., 0]
                else:
                    probs = torch.softmax(logits[..., :2], -1)[..., 1]
                probs = probs.cpu()
                for j, r in enumerate(keep):
                    i, _, ends = chunk[r]
                    starts, stops = offsets[r, :width, 0].tolist(), offsets[r, :width, 1].tolist()
                    valid = enc["attention_mask"][r, :width].tolist()
                    # the tokens with text, by start: a tag's score is read at the last token starting before its end
                    toks = [t for t in range(width) if valid[t] and stops[t] > starts[t]]
                    firsts = [starts[t] for t in toks]
                    at = [bisect.bisect_left(firsts, e) - 1 for e in ends]
                    if any(a < 0 for a in at):
                        continue
                    pos = [toks[a] for a in at]
                    out[i] = [float(probs[j, p]) for p in pos]
        finally:
            self.tokenizer.padding_side = side
        return out

    def score_steps(self, question: str, steps: list[str]) -> list[float] | None:
        return self.score_batch([question], [steps])[0]


UNITS = ("step", "thought")


@REWARDS.register
class ProcessReward(RewardTerm):
    """A process reward: the completion split into steps (``split``, ``tag_pattern``; at most ``max_steps``, the rest
    merged into the last), each step scored by a PRM (``model``: a checkpoint path or hub id, with ``style``, tags,
    device, dtype, batch size; or ``scorer``: any ``StepScorer``), the scores (or TP-GRPO's thought units,
    ``unit: thought``) ``aggregate``d into the term's value. ``dense: true`` also pays each step's (unit's) score at
    its last token (``TermResult.token_rewards``) and takes the term out of the outcome reward (weight 0 there, its
    weight on the token rewards): for REINFORCE++ and GAE. Step scores are cached per (prompt, completion)
    (``cache_size`` rows, least recently used dropped; ``reward/<term>/cache_hits`` per step, ``step_scores`` for
    stages such as PROF's filter). A completion with no step is "does not apply" (missing, scored 0); a row the
    scorer cannot score is a failure."""

    judges_correctness = True  # scores in [0, 1]: the run logs its agreement with the accuracy term

    def __init__(
        self,
        weight: float = 1.0,
        model: str | None = None,
        scorer: StepScorer | None = None,
        split: str = "paragraphs",
        tag_pattern: str | None = None,
        aggregate: str = "min",
        dense: bool = False,
        unit: str = "step",
        threshold: float = 0.5,
        max_steps: int = 64,
        question_key: str = "question",
        cache_size: int = 4096,
        style: str = "math_shepherd",
        step_tag: str = " ки",
        good_token: str = "+",
        bad_token: str = "-",
        template: str = "{question} {steps}",
        step_join: str = "\n",
        system_prompt: str = QWEN_SYSTEM,
        device: str = "auto",
        dtype: str = "float32",
        batch_size: int = 8,
        max_length: int = 4096,
        trust_remote_code: bool = False,
        require_answer: str | None = None,
    ):
        super().__init__(weight)
        if split not in SPLIT_MODES:
            raise ValueError(f"split={split!r} is not one of {list(SPLIT_MODES)}")
        if tag_pattern is not None:
            try:
                re.compile(tag_pattern)
            except re.error as e:
                raise ValueError(f"tag_pattern={tag_pattern!r}: {e}") from e
        if aggregate not in AGGREGATIONS:
            raise ValueError(f"aggregate={aggregate!r} is not one of {list(AGGREGATIONS)}")
        if unit not in UNITS:
            raise ValueError(f"unit={unit!r} is not one of {list(UNITS)}")
        if max_steps < 1 or cache_size < 0:
            raise ValueError(f"max_steps={max_steps} must be >= 1 and cache_size={cache_size} >= 0")
        if scorer is None:
            if not model:
                raise ValueError(
                    "model is null: no process reward model is set. Give a PRM checkpoint (a local path or hub id, "
                    "e.g. model=peiyi9979/math-shepherd-mistral-7b-prm with style=math_shepherd, or "
                    "Qwen/Qwen2.5-Math-PRM-7B with style=qwen_prm trust_remote_code=true) in this term's `model` "
                    "(reward.terms.<name>.model)"
                )
            scorer = PRMScorer(
                model,
                style=style,
                step_tag=step_tag,
                good_token=good_token,
                bad_token=bad_token,
                template=template,
                step_join=step_join,
                system_prompt=system_prompt,
                device=device,
                dtype=dtype,
                batch_size=batch_size,
                max_length=max_length,
                trust_remote_code=trust_remote_code,
            )
        if not hasattr(scorer, "score_steps"):
            raise ValueError(f"scorer {type(scorer).__name__} has no score_steps(question, steps)")
        self.scorer = scorer
        self.split, self.tag_pattern, self.aggregate = split, tag_pattern, aggregate
        self.dense, self.unit, self.threshold = bool(dense), unit, float(threshold)
        self.max_steps, self.question_key, self.cache_size = int(max_steps), question_key, int(cache_size)
        if require_answer is not None and require_answer not in ANSWER_FORMATS:
            raise ValueError(f"require_answer={require_answer!r} is not null or one of {list(ANSWER_FORMATS)}")
        self.require_answer = require_answer
        self.cache: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self.cache_hits = 0  # over the term's life
        self.tokenizer = None  # the policy's tokenizer, for dense token positions (bind_tokenizer)

    def bind_policy(self, model, tokenizer) -> None:
        """The trainer's policy, for a scorer that judges with it or its initial copy (``StepJudge``)."""
        if hasattr(self.scorer, "bind"):
            self.scorer.bind(model, tokenizer)

    def bind_tokenizer(self, tokenizer) -> None:
        """The policy's tokenizer (the run injects it): dense rewards find step ends among the sampled tokens."""
        self.tokenizer = tokenizer

    def spans(self, completion: str) -> list[tuple[int, int]]:
        spans = split_steps(completion, self.split, self.tag_pattern)
        if len(spans) > self.max_steps:
            spans = [*spans[: self.max_steps - 1], (spans[self.max_steps - 1][0], spans[-1][1])]
        return spans

    def step_scores(self, prompt: str, completion: str) -> list[float] | None:
        """The cached step scores of a scored row (None when it was not scored or has been dropped); no model call."""
        return self.cache.get((prompt, completion))

    def _remember(self, key: tuple[str, str], scores: list[float]) -> None:
        if self.cache_size == 0:
            return
        self.cache[key] = scores
        self.cache.move_to_end(key)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    def _score_rows(self, todo: list[tuple[str, list[str]]]) -> list[list[float] | None]:
        questions = [q for q, _ in todo]
        steps = [s for _, s in todo]
        if hasattr(self.scorer, "score_batch"):
            try:
                return list(self.scorer.score_batch(questions, steps))
            except Exception as e:  # the batch failed: score row by row so one bad row fails alone
                log.warning("reward ProcessReward: batched scoring failed (%r); scoring row by row", e)
        out = []
        for q, s in todo:
            try:
                out.append(self.scorer.score_steps(q, s))
            except Exception as e:
                log.warning("reward ProcessReward failed on a row: %r", e)
                out.append(None)
        return out

    def __call__(self, samples: list[Sample]) -> TermResult:
        if self.dense and self.tokenizer is None:
            raise RuntimeError(
                "ProcessReward.dense needs the policy's tokenizer to place step rewards at tokens "
                "(bind_tokenizer; the training run injects it)"
            )
        n = len(samples)
        spans = [self.spans(s.completion) for s in samples]
        per: list[list[float] | None] = [None] * n
        hits, todo, owners = 0, {}, {}
        gated = [False] * n
        if self.require_answer is not None:  # SPARK's format constraint: no stated answer, no process reward
            gated = [extract_answer(s.completion, self.require_answer) is None for s in samples]
        for i, s in enumerate(samples):
            if not spans[i] or gated[i]:
                per[i] = []
                continue
            key = (s.prompt, s.completion)
            if key in self.cache:
                self.cache.move_to_end(key)
                per[i] = self.cache[key]
                hits += 1
            elif key in todo:
                owners[key].append(i)
                hits += 1  # the same completion twice in the batch: scored once
            else:
                steps = [s.completion[a:b] for a, b in spans[i]]
                todo[key] = (str(s.record.get(self.question_key, s.prompt)), steps)
                owners[key] = [i]
        if todo:
            keys = list(todo)
            got = self._score_rows([todo[k] for k in keys])
            for key, scores in zip(keys, got):
                ok = scores is not None and len(scores) == len(todo[key][1])
                ok = ok and all(isinstance(x, (int, float)) and math.isfinite(x) for x in scores)
                if not ok:
                    continue  # a failure: per[i] stays None
                scores = [float(x) for x in scores]
                self._remember(key, scores)
                for i in owners[key]:
                    per[i] = scores
        self.cache_hits += hits
        values, failures, missing, tokens = [], [], [], []
        n_steps, step_sum, step_n = 0, 0.0, 0
        for i, s in enumerate(samples):
            scores = per[i]
            if scores is None:
                values.append(0.0)
                failures.append(True)
                missing.append(False)
                tokens.append([])
                continue
            ends = [b for _, b in spans[i]]
            if self.unit == "thought":
                ends, scores = merge_thoughts(ends, scores, self.threshold)
            n_steps += len(scores)
            step_sum, step_n = step_sum + sum(scores), step_n + len(scores)
            agg = aggregate_steps(scores, self.aggregate)
            values.append(0.0 if agg is None else agg)
            failures.append(False)
            missing.append(agg is None)
            placed = []
            if self.dense and scores:
                try:
                    placed = list(zip(token_positions(self.tokenizer, s.completion_ids, s.completion, ends), scores))
                except Exception as e:  # a row whose steps cannot be placed: recorded, the run goes on
                    log.warning("reward ProcessReward could not place step rewards on a row: %r", e)
                    values[-1], failures[-1], missing[-1] = 0.0, True, False
            tokens.append(placed)
        metrics = {
            "cache_hits": float(hits),
            "steps_mean": n_steps / max(1, n - sum(failures)),
            "step_score_mean": step_sum / step_n if step_n else 0.0,
        }
        if self.require_answer is not None:
            metrics["format_gated_frac"] = sum(gated) / max(1, n)
        if todo and getattr(self.scorer, "stats", None):  # a judge's own counts (asked, unparsed verdicts)
            metrics.update({f"judge_{k}": float(v) for k, v in self.scorer.stats.items()})
        if self.dense:  # step rewards placed at tokens, per row
            metrics["token_rewards_mean"] = sum(len(t) for t in tokens) / max(1, n)
        return TermResult(values, failures, missing, metrics, token_rewards=tokens if self.dense else None)
