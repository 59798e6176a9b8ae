"""Principle-following judge (SALMON, issue 23): the judge grades a response against a list of principles written
into its prompt, drawn afresh for each prompt, so what is rewarded is steered by editing text, not by new labels.

``PrincipleJudge`` is a ``GenerativeJudge`` (rlexp.rewards.judges: the judge model, the ``Score: N`` grade on
``scale`` normalised onto [0, 1], failures counted in ``reward/<term>/failures``, the cache) whose ``template`` has a
``{principles}`` field besides ``{question}`` and ``{completion}``. The principles of a prompt are

* ``always`` — intervention principles, written into every judge prompt (SALMON's RL-time prohibitions against the
  reward hacks it saw: self-praise, generic pros-and-cons analysis, needless examples; our list also asks for
  concision against a length hack), then
* ``max_principles`` of ``principles`` (each ``{name, definition, weight}``), drawn by weight WITHOUT replacement,
  as SALMON's trainer draws its RL-time principles (3 of 14 there). ``max_principles: null`` takes them all.

The draw is once per prompt (every completion of a group is graded under the same principles, so the group's
comparison is fair), from a ``random.Random(seed)`` owned by the term (the run's random stream is not moved): the
same seed and the same calls give the same principles. Each principle is one ``- <definition>`` line. Verdicts are
cached per (question, principles, completion). Metrics: ``principles_per_prompt``, ``prompts_drawn``, and the
``GenerativeJudge`` ones (``parsed_frac``, ``cache_hits``, ``judged``)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from rlexp.core.registry import REWARDS
from rlexp.rewards.judges import GenerativeJudge
from rlexp.rewards.terms import Sample, TermResult

PRINCIPLE_TEMPLATE = (
    "You are a reviewer judging the quality of an AI assistant's response to an instruction.\n\n"
    "Instruction:\n{question}\n\n"
    "Response:\n{completion}\n\n"
    "Judge the response against these principles:\n{principles}\n\n"
    "A good response meets all of them. Grade it from 1 (violates them) to 10 (meets them all). End your reply "
    "with the line 'Score: N', N your grade."
)


def draw_principles(principles: Sequence[Mapping], k: int | None, rng: random.Random) -> list[Mapping]:
    """``k`` principles drawn by ``weight`` without replacement (all of them, in order, when k is None or >= len)."""
    pool = list(principles)
    if k is None or k >= len(pool):
        return pool
    weights = [float(p.get("weight", 1.0)) for p in pool]
    out = []
    for _ in range(k):
        j = rng.choices(range(len(pool)), weights=weights)[0]
        out.append(pool.pop(j))
        weights.pop(j)
    return out


def render_principles(always: Sequence[str], drawn: Sequence[Mapping]) -> str:
    return "\n".join(f"- {text}" for text in [*always, *(p["definition"] for p in drawn)])


@REWARDS.register
class PrincipleJudge(GenerativeJudge):
    """A ``GenerativeJudge`` under principles drawn per prompt (module doc)."""

    def __init__(
        self,
        principles: Sequence[Mapping] = (),
        always: Sequence[str] = (),
        max_principles: int | None = 3,
        template: str = PRINCIPLE_TEMPLATE,
        seed: int = 0,
        **judge,
    ):
        fields = {"question": "q", "completion": "c", "principles": "p"}
        try:
            template.format(**fields)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"PrincipleJudge.template: a field other than {sorted(fields)} ({e!r})") from e
        missing = [f for f in fields if "{" + f + "}" not in template]
        if missing:
            raise ValueError(f"PrincipleJudge.template has no {', '.join('{' + f + '}' for f in missing)} field")
        pool = [dict(p) for p in principles]
        for i, p in enumerate(pool):
            if not str(p.get("definition", "")).strip():
                raise ValueError(f"PrincipleJudge.principles[{i}] has no definition")
            if not float(p.get("weight", 1.0)) > 0:
                raise ValueError(f"PrincipleJudge.principles[{i}].weight={p.get('weight')}: must be > 0")
        if max_principles is not None and max_principles < 0:
            raise ValueError(f"PrincipleJudge.max_principles={max_principles}: >= 0 or null (all)")
        if not pool and not always:
            raise ValueError("PrincipleJudge: no principles (principles and always are both empty)")
        super().__init__(seed=seed, **judge)  # the default pointwise template passes the base class's check
        self.template = template
        self.principles, self.always = pool, [str(a) for a in always]
        self.max_principles = max_principles
        self.rng = random.Random(seed)

    def draw(self) -> str:
        """One prompt's principles, rendered (advances the term's own random stream)."""
        return render_principles(self.always, draw_principles(self.principles, self.max_principles, self.rng))

    def prompt(self, question: str, completion: str) -> str:
        """The judge prompt; ``question`` may carry its principles (``_tag``), else a fresh draw is used."""
        q, sep, principles = question.partition(_SEP)
        return self.template.format(question=q, completion=completion, principles=principles if sep else self.draw())

    def __call__(self, samples: list[Sample]) -> TermResult:
        if not samples:
            return TermResult([], [])
        # one draw per prompt (its group), in the order the prompts first appear; the question the judge reads
        # carries its principles, so the cache keys on (question, principles, completion)
        drawn: dict[tuple, str] = {}
        rows = []
        for s in samples:
            q = str(s.record.get(self.question_key, s.prompt)) if s.record else s.prompt
            key = (s.group, q)
            if key not in drawn:
                drawn[key] = self.draw()
            rows.append((q, drawn[key]))
        tagged = [
            Sample(
                s.prompt, s.completion, {**(s.record or {}), self.question_key: _tag(q, p)}, s.group, s.num_tokens,
                s.truncated, s.completion_ids,
            )
            for s, (q, p) in zip(samples, rows)
        ]  # fmt: skip
        result = super().__call__(tagged)
        result.metrics["principles_per_prompt"] = float(len(self.always) + _count(self.principles, self.max_principles))
        result.metrics["prompts_drawn"] = float(len(drawn))
        return result


_SEP = "\x00principles\x00"


def _tag(question: str, principles: str) -> str:
    return f"{question}{_SEP}{principles}"


def _count(pool: Sequence, k: int | None) -> int:
    return len(pool) if k is None else min(k, len(pool))
