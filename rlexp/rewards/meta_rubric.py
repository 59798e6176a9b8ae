"""A judge whose rubric evolves during training (issue 23): MPO, "Toward Evaluative Thinking: Meta Policy
Optimization with Evolving Reward Models" (Kim, Park, Raheja, Kang, 2025, arXiv 2504.20157). In MPO a meta reward
model watches the training context — the task prompt, the policy's sampled generations with the scores the reward
model gave them, and the reward model's current evaluation prompt (its rubric) — and at points during RL rewrites that
rubric (meta-analysis, refinement, merging), so that a policy that found a loophole in the rubric stops being paid
for it (reward hacking) and the rubric grows more specific to what the policy now writes.

``MetaRubricJudge`` is a ``GenerativeJudge`` (rlexp.rewards.judges) whose ``template`` holds a ``{rubric}`` field
beside ``{question}`` and ``{completion}``. It keeps the rows it judged since the last update; after every
``update_every``-th call (one call per training step; an extra rollout, e.g. dynamic sampling's, also counts) it asks
the meta judge — by default the judge's own frozen model, with ``meta_template`` — to refine the rubric: the meta
prompt shows the current rubric and ``meta_samples`` of those rows (half the best-graded, half the worst: a hack
shows among the best) with their grades, and asks for the new rubric between ``<rubric>`` and ``</rubric>``. A reply
without a closed rubric of at least ``min_rubric_chars`` (and at most ``max_rubric_chars``) characters, or a failed
generation, keeps the old rubric and counts as a meta failure. A new rubric clears the verdict cache (the grades
depend on it) and takes effect from the next call.

Metrics (``reward/<term>/<key>``, beside the judge's own): ``rubric_version`` (0: the initial rubric),
``rubric_updates`` and ``meta_failures`` (cumulative), ``meta_calls`` (cumulative), ``rubric_chars``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from rlexp.core.registry import REWARDS
from rlexp.rewards.judges import GenerativeJudge, JudgeBackend, _check_template
from rlexp.rewards.terms import Sample, TermResult

log = logging.getLogger(__name__)

RUBRIC_TEMPLATE = (
    "You are grading an answer to a question.\n\n"
    "Rubric:\n{rubric}\n\n"
    "Question:\n{question}\n\n"
    "Answer:\n{completion}\n\n"
    "Grade the answer by the rubric from 1 (worst) to 10 (best). End your reply with the line 'Score: N', N your "
    "grade."
)
INITIAL_RUBRIC = (
    "A good answer is correct, reasons step by step without padding, and states its final answer clearly on the "
    "last line."
)
META_TEMPLATE = (
    "You oversee a grader that scores a student's answers with a rubric. A student trained on these scores may "
    "learn to exploit the rubric: to earn high grades with answers that are not actually good.\n\n"
    "Current rubric:\n{rubric}\n\n"
    "Recent answers with the grades they received (0 = worst, 1 = best):\n\n{samples}\n\n"
    "Find where the grades reward answers that are not good (loopholes, padding, format tricks) or punish good "
    "ones, and write an improved rubric that closes those gaps while keeping what works. Reply with the complete "
    "new rubric between <rubric> and </rubric>."
)
SAMPLE_TEMPLATE = "[{k}] grade {grade}\nQuestion: {question}\nAnswer: {completion}"


def select_rows(rows: Sequence[tuple[str, str, float | None]], k: int) -> list[tuple[str, str, float | None]]:
    """Up to ``k`` distinct rows for the meta prompt: the ceil(k/2) best-graded, then the floor(k/2) worst (rows
    without a grade count as the worst); in that order, best first."""
    seen, uniq = set(), []
    for r in rows:
        if (r[0], r[1]) not in seen:
            seen.add((r[0], r[1]))
            uniq.append(r)
    order = sorted(range(len(uniq)), key=lambda i: (-(uniq[i][2] if uniq[i][2] is not None else -1.0), i))
    if len(uniq) <= k:
        return [uniq[i] for i in order]
    top = order[: (k + 1) // 2]
    bottom = order[len(order) - k // 2 :] if k // 2 else []
    return [uniq[i] for i in top + bottom]


def parse_rubric(reply: str, min_chars: int, max_chars: int) -> str | None:
    """The rubric in the meta reply: the text between the last ``<rubric>`` before the last ``</rubric>`` and that
    ``</rubric>``, stripped; None when there is no closed rubric or its length is outside [min_chars, max_chars]."""
    text = reply or ""
    end = text.lower().rfind("</rubric>")
    start = text.lower().rfind("<rubric>", 0, end) if end >= 0 else -1
    if start < 0:
        return None
    rubric = text[start + len("<rubric>") : end].strip()
    return rubric if min_chars <= len(rubric) <= max_chars else None


@REWARDS.register
class MetaRubricJudge(GenerativeJudge):
    """A pointwise judge grading by a rubric that a meta judge rewrites every ``update_every`` calls (module doc);
    the judge's settings are GenerativeJudge's; ``meta_generate``: a ready ``texts -> replies`` meta judge (tests)."""

    def __init__(
        self,
        weight: float = 1.0,
        template: str = RUBRIC_TEMPLATE,
        rubric: str = INITIAL_RUBRIC,
        update_every: int = 10,
        meta_template: str = META_TEMPLATE,
        meta_samples: int = 6,
        meta_max_new_tokens: int = 256,
        meta_do_sample: bool = False,
        meta_completion_chars: int = 600,
        min_rubric_chars: int = 20,
        max_rubric_chars: int = 2000,
        meta_generate: Callable[[list[str]], list[str]] | None = None,
        **options,
    ):
        _check_template(template, {"question": "q", "completion": "c", "rubric": "r"}, "MetaRubricJudge.template")
        _check_template(meta_template, {"rubric": "r", "samples": "s"}, "MetaRubricJudge.meta_template")
        if update_every < 1:
            raise ValueError(f"MetaRubricJudge.update_every={update_every}: must be >= 1 (calls between updates)")
        if meta_samples < 1 or meta_max_new_tokens < 1 or meta_completion_chars < 1:
            raise ValueError(
                f"MetaRubricJudge: meta_samples ({meta_samples}), meta_max_new_tokens ({meta_max_new_tokens}) and "
                f"meta_completion_chars ({meta_completion_chars}) must be >= 1"
            )
        if not 1 <= min_rubric_chars <= max_rubric_chars:
            raise ValueError(
                f"MetaRubricJudge: need 1 <= min_rubric_chars ({min_rubric_chars}) <= max_rubric_chars "
                f"({max_rubric_chars})"
            )
        if not str(rubric).strip():
            raise ValueError("MetaRubricJudge.rubric: the initial rubric is empty")
        super().__init__(weight, template="{question}\n{completion}", **options)
        self.template, self.rubric = template, str(rubric).strip()
        self.meta_template, self.update_every, self.meta_samples = meta_template, int(update_every), int(meta_samples)
        self.meta_completion_chars = int(meta_completion_chars)
        self.min_rubric_chars, self.max_rubric_chars = int(min_rubric_chars), int(max_rubric_chars)
        b = self.backend
        self.meta = JudgeBackend(
            judge_model="initial" if meta_generate is None else None,  # the judge's model is handed over at use
            device=b.device,
            max_new_tokens=meta_max_new_tokens,
            do_sample=meta_do_sample,
            temperature=b.sampling["temperature"],
            top_p=b.sampling["top_p"],
            batch_size=1,
            seed=b.sampling["seed"],
            system_prompt=b.sampling["system_prompt"],
            reply_prefix="<rubric>",  # the reply starts inside the rubric (a small judge then writes one)
            generate=meta_generate,
            owner="MetaRubricJudge.meta",
        )
        self.version = self.updates = self.failures = self.meta_calls = self.calls = 0
        self.history: list[tuple[str, str, float | None]] = []
        self.rubrics: list[str] = [self.rubric]  # every rubric in use so far, the first the initial one

    def prompt(self, question: str, completion: str) -> str:
        return self.template.format(question=question, completion=completion, rubric=self.rubric)

    def meta_prompt(self) -> str:
        rows = select_rows(self.history, self.meta_samples)
        clip = self.meta_completion_chars
        text = "\n\n".join(
            SAMPLE_TEMPLATE.format(
                k=k + 1,
                grade="none (unparsed)" if g is None else f"{g:.2f}",
                question=q,
                completion=c if len(c) <= clip else c[:clip] + " [...]",
            )
            for k, (q, c, g) in enumerate(rows)
        )
        return self.meta_template.format(rubric=self.rubric, samples=text)

    def refine(self) -> bool:
        """One meta step: ask for a refined rubric from the rows judged since the last one; True when it changed."""
        self.meta_calls += 1
        if self.meta._generate is None and self.meta._model is None:
            model, tok = self.backend.model()  # the judge's own frozen model (or the live policy) writes the rubric
            self.meta._model, self.meta._tok, self.meta._autocast = model, tok, self.backend._autocast
        try:
            reply = self.meta([self.meta_prompt()])[0]
        except Exception as e:  # generation failed: the old rubric stays
            log.warning("MetaRubricJudge: the meta judge failed: %r", e)
            reply = None
        rubric = None if reply is None else parse_rubric(reply, self.min_rubric_chars, self.max_rubric_chars)
        self.history = []
        if rubric is None:
            self.failures += 1
            return False
        if rubric != self.rubric:
            self.rubric = rubric
            self.rubrics.append(rubric)
            self.version += 1
            self.updates += 1
            self.cache.clear()  # verdicts were given under the old rubric
        return True

    def __call__(self, samples: list[Sample]) -> TermResult:
        res = super().__call__(samples)
        if not samples:
            return res
        self.calls += 1
        for s, v, f in zip(samples, res.scores, res.failures):
            q = str(s.record.get(self.question_key, s.prompt)) if s.record else s.prompt
            self.history.append((q, s.completion, None if f else float(v)))
        if self.calls % self.update_every == 0:
            self.refine()
        res.metrics.update(
            {
                "rubric_version": float(self.version),
                "rubric_updates": float(self.updates),
                "meta_failures": float(self.failures),
                "meta_calls": float(self.meta_calls),
                "rubric_chars": float(len(self.rubric)),
            }
        )
        return res
