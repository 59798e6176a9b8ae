"""Paraphrase consistency of an evaluation: the same held-out questions asked again in other words
(``rlexp.data.paraphrases``), and how often the answer stays the same — the consistency that paraphrase-set methods
(PS-GRPO, information-consistent GRPO, Co-Reward) train for.

Metrics (under the evaluator's prefix): ``paraphrase/accuracy`` (accuracy on the reworded questions) and
``paraphrase/agreement`` — over every (question, paraphrase) pair, the share whose answer on the paraphrase is
equivalent to the answer on the question (with several samples per question: the two majority answers); a missing
answer agrees with nothing."""

from __future__ import annotations

from collections.abc import Callable

from rlexp.data.paraphrases import paraphrase_source


def check_settings(paraphrases: int, source: str) -> None:
    if paraphrases < 0:
        raise ValueError(f"eval.paraphrases={paraphrases} must be >= 0 (0: off)")
    paraphrase_source(source)  # refuses an unknown source by its key


def paraphrased_records(records: list[dict], paraphrases: int, source: str, seed: int) -> list[list[dict]]:
    """For k = 1..paraphrases, the records with their question replaced by its k-th paraphrase."""
    src = paraphrase_source(source, seed=seed)
    return [[{**r, "question": src(r, k)} for r in records] for k in range(1, paraphrases + 1)]


def majority(answers: list, equivalent: Callable[[str, str], bool]):
    """The most frequent answer by ``equivalent`` (ties: the first seen); None when none is stated."""
    reps: list[list] = []
    for a in answers:
        if a is None:
            continue
        for rep in reps:
            if equivalent(a, rep[0]):
                rep[1] += 1
                break
        else:
            reps.append([a, 1])
    return max(reps, key=lambda r: r[1])[0] if reps else None


def agreement(original: list, reworded: list, equivalent: Callable[[str, str, int], bool]) -> list[float]:
    """Per question i: 1 when the (majority) answers ``original[i]`` and ``reworded[i]`` (lists of a question's
    sample answers) are equivalent (``equivalent(a, b, i)``), else 0."""
    out = []
    for i, (a_list, b_list) in enumerate(zip(original, reworded)):
        eq = lambda x, y, i=i: x == y or equivalent(x, y, i)
        a, b = majority(a_list, eq), majority(b_list, eq)
        out.append(float(a is not None and b is not None and eq(a, b)))
    return out
