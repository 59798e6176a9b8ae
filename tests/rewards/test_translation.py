"""The translation reward (rlexp/rewards/translation.py): sentence BLEU / 100 of the stated translation, worked by
hand and checked against sacreBLEU's documented example; the answer extraction, chrF, and the config errors."""

from __future__ import annotations

import math

import pytest

from rlexp.rewards.terms import Sample

sacrebleu = pytest.importorskip("sacrebleu")

from rlexp.rewards.translation import TranslationBLEU, references  # noqa: E402

REF = "the cat sat on the mat"


def sample(completion: str, answer: str = REF, **meta) -> Sample:
    return Sample("p", completion, {"answer": answer, "metadata": meta}, 0, 10, False)


def test_sacrebleu_gives_its_documented_corpus_score():
    # sacreBLEU's README example: BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)
    refs = [
        ["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
        ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."],
    ]
    hyps = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
    assert sacrebleu.corpus_bleu(hyps, refs).score == pytest.approx(48.53, abs=0.005)


def test_sentence_bleu_worked_by_hand():
    term = TranslationBLEU()
    # hypothesis "the cat sat on a mat" (6 tokens) against REF (6 tokens): n-gram precisions 5/6 (the, cat, sat, on,
    # mat), 3/5 (the cat, cat sat, sat on), 2/4 (the cat sat, cat sat on), 1/3 (the cat sat on); no zero precision,
    # so no smoothing; brevity penalty 1 (equal lengths): BLEU = (5/6 · 3/5 · 2/4 · 1/3)^(1/4) = (1/12)^(1/4) = 0.53728
    res = term([sample("<answer>the cat sat on a mat</answer>")])
    assert res.scores[0] == pytest.approx((1 / 12) ** 0.25, abs=1e-4)
    assert res.scores[0] == pytest.approx(0.5373, abs=1e-4)
    # the same sentence: 1; the last <answer> counts (a multi-turn episode's final one)
    res = term([sample(f"<answer>a guess</answer> more <answer>{REF}</answer>")])
    assert res.scores == [pytest.approx(1.0)]
    # a shorter hypothesis "the cat sat" (3 of 6 tokens): precisions 1, 1, 1 and no 4-gram at all, which sentence
    # BLEU leaves out (sacreBLEU's effective order: the mean runs over the orders the hypothesis has);
    # BP = exp(1 − 6/3) = e^−1: BLEU = e^−1 · (1 · 1 · 1)^(1/3) = 0.36788
    short = term([sample("<answer>the cat sat</answer>")]).scores[0]
    assert short == pytest.approx(math.exp(-1), abs=1e-4)
    # "the dog sat on a rug": precisions 3/6 (the, sat, on), 1/5 (sat on), 0/4, 0/3: exp smoothing scores the k-th
    # zero precision 1/2^k of its count, 1/(2·4) and 1/(4·3); BLEU = (1/2 · 1/5 · 1/8 · 1/12)^(1/4) = 0.17970
    rough = term([sample("<answer>the dog sat on a rug</answer>")]).scores[0]
    assert rough == pytest.approx((1 / 2 * 1 / 5 * 1 / 8 * 1 / 12) ** 0.25, abs=1e-4)


def test_a_completion_without_a_translation_scores_zero_or_whole():
    res = TranslationBLEU()([sample(REF), sample("<answer>the cat sat on the mat</answer>")])
    assert res.scores == [0.0, pytest.approx(1.0)] and res.metrics["answered"] == 0.5
    assert res.metrics["score100"] == pytest.approx(50.0)
    assert TranslationBLEU(missing_answer="text")([sample(REF)]).scores == [pytest.approx(1.0)]


def test_references_chrf_and_case():
    # a second reference from the record's metadata: the hypothesis matches it exactly
    assert references({"answer": "a", "metadata": {"references": ["b", "a"]}}) == ["a", "b"]
    second = sample("<answer>b c d e</answer>", "x y", references=["b c d e"])
    assert TranslationBLEU()([second]).scores == [pytest.approx(1.0)]
    chrf = TranslationBLEU(metric="chrf")([sample(f"<answer>{REF}</answer>")]).scores[0]
    assert chrf == pytest.approx(1.0)
    upper = sample("<answer>THE CAT SAT ON THE MAT</answer>")
    assert TranslationBLEU()([upper]).scores[0] < 0.1
    assert TranslationBLEU(lowercase=True)([upper]).scores == [pytest.approx(1.0)]


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="TranslationBLEU.metric"):
        TranslationBLEU(metric="ter")
    with pytest.raises(ValueError, match="TranslationBLEU.missing_answer"):
        TranslationBLEU(missing_answer="skip")
    with pytest.raises(ValueError, match="answer_format"):
        TranslationBLEU(answer_format="xml")
