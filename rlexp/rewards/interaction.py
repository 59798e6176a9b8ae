"""CoMAS's interaction rewards — "CoMAS: Co-Evolving Multi-Agent Systems via Interaction Rewards" (Xue et al., 2025;
arXiv 2510.08529; released code xxyQwQ/CoMAS, read in its mirror wt-2048/comas: ``marti/verifiers/comas_reward.py``,
``marti/worlds/workflows/comas.py``).

In a CoMAS discussion each solution gets an evaluation (a critique, by another agent) and a scoring (an agent reads
the solution and the critique and judges the solution, LLM-as-a-judge, with an integer score s in [1, 3] between
``<score>`` tags). The rewards come from that score alone, with no external verifier:

* the solution:   r_sol  = (s − 1) / 2                (its normalised score, in [0, 1]);
* the evaluation: r_eval = 1 − (s − 1) / 2            (zero-sum with the solution: a critique that sinks the
  solution is rewarded);
* the scoring:    r_score = 0                          (a score was given),
* and when the scoring gives no score that parses: r_sol = r_eval = 0 and r_score = −1 (the released reward
  module's format penalty on the judge; the solution and the critique get nothing from an unreadable verdict).

``parse_interaction_score`` reads the score: the LAST ``<score>…</score>`` of the reply (our choice: a judge may quote
the tag before its own verdict), an integer within ``scale`` (the release's 1–3). Anything else is a failure with a
reason — ``missing`` (no tag), ``malformed`` (the tag holds no integer) or ``out_of_range`` — counted by the caller,
never raised. (The release's mirror also falls back to the last digit 1–3 of the reply, or to 2, in its workflow; its
reward module keeps the penalty above for a missing score, which is what we follow.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rlexp.rewards.judges import compile_pattern

# "<score>2</score>", "< score > 2 </ score >": the tag's content is group 1, whatever it is (checked afterwards)
SCORE_TAG = r"<\s*score\s*>(.*?)<\s*/\s*score\s*>"
SCORE_SCALE = (1, 3)
# (solution, evaluation, scoring) rewards when the score does not parse (the released comas_reward.py)
FAILURE_REWARDS = (0.0, 0.0, -1.0)
PARSED, MISSING, MALFORMED, OUT_OF_RANGE = "parsed", "missing", "malformed", "out_of_range"
_INTEGER = re.compile(r"[+-]?\d+")


def check_scale(scale: Sequence[int], key: str = "scale") -> tuple[int, int]:
    """``scale`` as (lowest, highest) integers with lowest < highest."""
    try:
        lo, hi = (int(x) for x in scale)
        exact = [float(x) for x in scale] == [lo, hi]
    except (TypeError, ValueError):
        exact = False
    if not exact or lo >= hi:
        raise ValueError(f"{key}={list(scale)}: [lowest, highest] integers with lowest < highest (CoMAS: [1, 3])")
    return lo, hi


def parse_interaction_score(
    text: str | None, pattern: str | re.Pattern = SCORE_TAG, scale: Sequence[int] = SCORE_SCALE
) -> tuple[int | None, str]:
    """(score, status) of a scoring reply: the integer in the last match of ``pattern`` (group 1) when it lies in
    ``scale``, status ``parsed``; else (None, ``missing`` | ``malformed`` | ``out_of_range``)."""
    rx = pattern if isinstance(pattern, re.Pattern) else compile_pattern(pattern, "score_pattern")
    matches = list(rx.finditer(text or ""))
    if not matches:
        return None, MISSING
    word = (matches[-1].group(1) or "").strip()
    if not _INTEGER.fullmatch(word):
        return None, MALFORMED
    value = int(word)
    lo, hi = check_scale(scale)
    if not lo <= value <= hi:
        return None, OUT_OF_RANGE
    return value, PARSED


def normalised_score(score: int, scale: Sequence[int] = SCORE_SCALE) -> float:
    """(s − lowest) / (highest − lowest): CoMAS's (s − 1) / 2 on its 1–3 scale."""
    lo, hi = check_scale(scale)
    return (float(score) - lo) / (hi - lo)


def interaction_rewards(
    score: int | None, scale: Sequence[int] = SCORE_SCALE, failure: Sequence[float] = FAILURE_REWARDS
) -> tuple[float, float, float]:
    """(solution, evaluation, scoring) rewards of one discussion from its parsed ``score`` (module doc):
    (n, 1 − n, 0) with n = ``normalised_score``; ``failure`` when the score is None."""
    if score is None:
        sol, ev, sc = (float(x) for x in failure)
        return sol, ev, sc
    n = normalised_score(score, scale)
    return n, 1.0 - n, 0.0
