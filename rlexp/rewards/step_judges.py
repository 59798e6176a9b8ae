"""Generative process judges (issue 23): an LLM judge as the step scorer of a process reward
(``rlexp.rewards.process.ProcessReward(scorer=StepJudge(...))``), so a PRM needs no trained checkpoint.

``StepJudge`` implements ``StepScorer`` (``score_steps`` / ``score_batch``) in one of two modes:

* ``per_step`` — one judge prompt per step (``step_template``: the question, the earlier steps, the step to check),
  the verdict ``Yes``/``No`` (``verdicts``). ``score_by: parse`` generates the reply and parses its LAST verdict
  (``pattern``); ``score_by: logits`` reads the verdict's probability instead, P(good) / (P(good) + P(bad)) of the
  next token after the prompt and ``reply_prefix`` (one forward per step, no generation, never unparsed: the
  reading GenRM-style verifiers use for "Yes" / "No").
* ``cot`` — PRM-CoT ("SPARK: Stepwise Process-Aware Rewards for Reference-Free Reinforcement Learning", Rahman et
  al., 2025, arXiv 2512.03244): one prompt with the numbered steps; the judge verifies them in one reply that ends
  each step's check with ``Step i: correct`` / ``Step i: incorrect`` (``cot_pattern``); a row whose reply misses
  a step's verdict is unparsed.

A row with an unparsed verdict scores None: the process reward counts it in ``reward/<term>/failures`` and goes on.
``stats`` holds the last call's ``asked`` (judge prompts), ``unparsed`` (replies without a usable verdict) and
``unparsed_rows``. The judge model is a ``JudgeBackend`` (``judge_model``: ``initial``, ``policy`` or a model
config); the process reward forwards the trainer's ``bind_policy`` to it. Templates are our wording.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence

import torch

from rlexp.rewards.judges import JudgeBackend, _check_template, compile_pattern

log = logging.getLogger(__name__)

STEP_TEMPLATE = (
    "You are checking one step of a solution.\n\n"
    "Question:\n{question}\n\n"
    "Earlier steps:\n{previous}\n\n"
    "Step to check:\n{step}\n\n"
    "Is this step correct? Reply 'Verdict: Yes' or 'Verdict: No'."
)
COT_TEMPLATE = (
    "Check a solution step by step.\n\n"
    "Question:\n{question}\n\n"
    "Solution:\n{steps}\n\n"
    "Verify each step in order. After checking step i, write the line 'Step i: correct' or 'Step i: incorrect'."
)
VERDICT_PATTERN = r"(?:verdict\s*[:=]\s*\**\s*)?\b(yes|no)\b"
COT_PATTERN = r"step\s*(\d+)\s*[:.)-]\s*\**\s*(correct|incorrect|right|wrong)\b"
STEP_VERDICTS = {"yes": 1.0, "no": 0.0, "correct": 1.0, "incorrect": 0.0, "right": 1.0, "wrong": 0.0}
MODES = ("per_step", "cot")
SCORE_BY = ("parse", "logits")


def parse_step_verdict(reply: str, pattern: re.Pattern, verdicts: Mapping[str, float]) -> float | None:
    """The value of the LAST verdict word ``pattern`` finds in ``reply``; None when there is none or it is unknown."""
    matches = list(pattern.finditer(reply or ""))
    if not matches:
        return None
    return verdicts.get(matches[-1].group(1).strip().lower())


def parse_cot_verdicts(
    reply: str, n_steps: int, pattern: re.Pattern, verdicts: Mapping[str, float]
) -> list[float] | None:
    """PRM-CoT: the verdict of each of steps 1..n_steps from ``Step i: correct|incorrect`` lines (the last line for
    a step counts: the judge may revise itself); None when a step has none or a step number is out of range only
    (extra numbers are ignored)."""
    found: dict[int, float] = {}
    for m in pattern.finditer(reply or ""):
        i = int(m.group(1))
        value = verdicts.get(m.group(2).strip().lower())
        if 1 <= i <= n_steps and value is not None:
            found[i] = value
    if len(found) < n_steps:
        return None
    return [found[i] for i in range(1, n_steps + 1)]


class StepJudge:
    """A generative judge scoring the steps of a solution (module doc). ``score_batch(questions, steps_lists)``
    returns, per row, one score in [0, 1] per step, or None when a verdict did not parse."""

    def __init__(
        self,
        judge_model=None,
        mode: str = "per_step",
        score_by: str = "parse",
        device: str = "auto",
        step_template: str = STEP_TEMPLATE,
        cot_template: str = COT_TEMPLATE,
        pattern: str = VERDICT_PATTERN,
        cot_pattern: str = COT_PATTERN,
        verdicts: Mapping[str, float] | None = None,
        good_token: str = " Yes",
        bad_token: str = " No",
        max_previous_chars: int = 2000,
        max_new_tokens: int = 16,
        batch_size: int = 8,
        seed: int = 0,
        system_prompt: str | None = None,
        reply_prefix: str = "Verdict:",
        generate: Callable[[list[str]], list[str]] | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"StepJudge.mode={mode!r} is not one of {list(MODES)}")
        if score_by not in SCORE_BY:
            raise ValueError(f"StepJudge.score_by={score_by!r} is not one of {list(SCORE_BY)}")
        if score_by == "logits" and mode != "per_step":
            raise ValueError("StepJudge.score_by=logits reads one verdict token per prompt: it needs mode=per_step")
        if score_by == "logits" and generate is not None:
            raise ValueError("StepJudge.score_by=logits reads the judge model's logits: give a model, not generate=")
        _check_template(step_template, {"question": "q", "previous": "p", "step": "s"}, "StepJudge.step_template")
        _check_template(cot_template, {"question": "q", "steps": "s"}, "StepJudge.cot_template")
        self.pattern = compile_pattern(pattern, "StepJudge.pattern")
        self.cot_pattern = compile_pattern(cot_pattern, "StepJudge.cot_pattern")
        if self.cot_pattern.groups < 2:
            raise ValueError(f"StepJudge.cot_pattern={cot_pattern!r} needs two groups: the step number, the verdict")
        table = STEP_VERDICTS if verdicts is None else verdicts
        self.verdicts = {str(k).lower(): float(v) for k, v in dict(table).items()}
        if not all(0.0 <= v <= 1.0 for v in self.verdicts.values()):
            raise ValueError(f"StepJudge.verdicts={dict(table)}: every value must be in [0, 1]")
        self.mode, self.score_by = mode, score_by
        self.step_template, self.cot_template = step_template, cot_template
        self.good_token, self.bad_token = good_token, bad_token
        self.max_previous_chars = int(max_previous_chars)
        self.backend = JudgeBackend(
            judge_model, device, max_new_tokens, False, 1.0, 1.0, batch_size, seed, system_prompt, reply_prefix,
            generate, "StepJudge",
        )  # fmt: skip
        self.batch_size = int(batch_size)
        self.stats: dict[str, float] = {}

    def bind(self, model, tokenizer, autocast_dtype=None) -> None:
        self.backend.bind(model, tokenizer, autocast_dtype)

    # ---- prompts ----------------------------------------------------------------------------------
    def step_prompts(self, question: str, steps: Sequence[str]) -> list[str]:
        """One prompt per step: the earlier steps (their last ``max_previous_chars``) and the step to check."""
        out = []
        for i, step in enumerate(steps):
            previous = "\n".join(steps[:i]) or "(none)"
            if len(previous) > self.max_previous_chars:
                previous = "…" + previous[-self.max_previous_chars :]
            out.append(self.step_template.format(question=question, previous=previous, step=step))
        return out

    def cot_prompt(self, question: str, steps: Sequence[str]) -> str:
        numbered = "\n".join(f"Step {i + 1}: {s}" for i, s in enumerate(steps))
        return self.cot_template.format(question=question, steps=numbered)

    # ---- scoring ----------------------------------------------------------------------------------
    def score_steps(self, question: str, steps: list[str]) -> list[float] | None:
        return self.score_batch([question], [steps])[0]

    def score_batch(self, questions: Sequence[str], steps_lists: Sequence[Sequence[str]]) -> list[list[float] | None]:
        if self.mode == "cot":
            texts = [self.cot_prompt(q, s) for q, s in zip(questions, steps_lists)]
            replies = self.backend(texts) if texts else []
            rows = [
                parse_cot_verdicts(r, len(s), self.cot_pattern, self.verdicts) for r, s in zip(replies, steps_lists)
            ]
            unparsed = sum(r is None for r in rows)
            self.stats = {"asked": float(len(texts)), "unparsed": float(unparsed), "unparsed_rows": float(unparsed)}
            return rows
        texts, owner = [], []
        for j, (q, s) in enumerate(zip(questions, steps_lists)):
            prompts = self.step_prompts(q, s)
            texts += prompts
            owner += [j] * len(prompts)
        if self.score_by == "logits":
            values: list[float | None] = self.verdict_probabilities(texts) if texts else []
        else:
            replies = self.backend(texts) if texts else []
            values = [parse_step_verdict(r, self.pattern, self.verdicts) for r in replies]
        rows: list[list[float] | None] = [[] for _ in steps_lists]
        for j, v in zip(owner, values):
            if rows[j] is not None:
                rows[j] = None if v is None else [*rows[j], float(v)]
        self.stats = {
            "asked": float(len(texts)),
            "unparsed": float(sum(v is None for v in values)),
            "unparsed_rows": float(sum(r is None for r in rows)),
        }
        return rows

    def _token_id(self, tok, text: str, key: str) -> int:
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"StepJudge.{key}={text!r} is {len(ids)} tokens for the judge's tokenizer: score_by=logits reads one "
                "token (try it with or without a leading space)"
            )
        return ids[0]

    @torch.no_grad()
    def verdict_probabilities(self, texts: Sequence[str]) -> list[float]:
        """P(good) / (P(good) + P(bad)) of the judge's next token after each chat-templated prompt and the reply
        prefix (left-padded batches of ``batch_size``)."""
        model, tok = self.backend.model()
        good = self._token_id(tok, self.good_token, "good_token")
        bad = self._token_id(tok, self.bad_token, "bad_token")
        system, prefix = self.backend.sampling["system_prompt"], self.backend.reply_prefix
        device = next(model.parameters()).device

        def render(q: str) -> str:
            if getattr(tok, "chat_template", None):
                msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]
                return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + prefix
            return q + prefix

        amp = (
            torch.autocast(device.type, dtype=self.backend._autocast)
            if self.backend._autocast not in (None, torch.float32)
            else contextlib.nullcontext()
        )
        side, out = tok.padding_side, []
        tok.padding_side = "left"
        try:
            for i in range(0, len(texts), self.batch_size):
                enc = tok([render(t) for t in texts[i : i + self.batch_size]], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(device)  # fmt: skip
                positions = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # left padding: real positions
                with amp:
                    logits = model(**enc, position_ids=positions).logits[:, -1, :].float()
                pair = torch.log_softmax(logits, -1)[:, [good, bad]]
                out += torch.softmax(pair, -1)[:, 0].tolist()
        finally:
            tok.padding_side = side
        return out
