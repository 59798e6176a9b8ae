"""Rewards of search question answering (issue 28): short factual answers (NQ, HotpotQA, the synthetic facts of
``dataset=search_facts``) checked the way Search-R1, StepSearch and SSRL check them, and SSRL's format reward.

* ``normalize_answer`` — SQuAD's normalisation (lower case, punctuation and the articles a/an/the dropped, white
  space collapsed), as the released ``qa_em`` / ``qa_step`` scorers of Search-R1 and StepSearch;
* ``exact_match`` — 1 when the normalised answer equals a normalised gold answer (any alias): the records'
  ``scorer: qa`` (``rlexp.rewards.terms.check_answer``), so ``Accuracy`` and the held-out accuracy are EM;
* ``token_f1`` — the SQuAD token F1 against the best-matching gold answer (StepSearch's outcome);
* ``AnswerF1`` — the F1 of the stated final answer as a reward term; with ``unanswered`` the score of a response
  that does not end with its answer (StepSearch's release: −1 and no step rewards);
* ``SelfSearchFormat`` — SSRL's format reward ("SSRL: Self-Search Reinforcement Learning", Fan et al., 2025,
  arXiv 2508.10874; released code TsinghuaC3I/SSRL, ``verl/workers/reward_manager/naive.py``: ``format_reward``):
  the response must start with ``<think>`` and end with ``</answer>``, use only the think / search / information /
  answer tags, none empty, each ``<search>`` (one line) followed by its ``<information>``, no placeholder text
  ("your query" …); then min(1, ½·#think) × min(#think, #search + 1) / max(#think, #search + 1), 0 past 8 think
  blocks — 1 for think, search, information, think, answer; ½ for think, answer.

The gold answers of a record are ``record["answer"]`` and its aliases ``record["metadata"]["answers"]``."""

from __future__ import annotations

import re
import string
from collections import Counter

from rlexp.core.registry import REWARDS
from rlexp.rewards.answers import extract_answer
from rlexp.rewards.terms import RewardTerm, Sample

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", str(text).lower().translate(_PUNCTUATION)).split())


def gold_answers(record: dict) -> list[str]:
    """The record's answer and its aliases (``metadata.answers``), in order, without repeats."""
    meta = record.get("metadata") or {}
    out = [str(record.get("answer", ""))] + [str(a) for a in meta.get("answers") or []]
    return [a for a in dict.fromkeys(out) if a.strip()]


def exact_match(answer: str | None, golds: list[str]) -> float:
    """1.0 when the normalised ``answer`` equals a normalised gold answer, else 0.0 (None: 0.0)."""
    if answer is None:
        return 0.0
    a = normalize_answer(answer)
    return float(any(a == normalize_answer(g) for g in golds))


def token_f1(answer: str | None, golds: list[str]) -> float:
    """The SQuAD token F1 of ``answer`` against the best gold answer (0.0 for None or no common token)."""
    if answer is None:
        return 0.0
    pred = normalize_answer(answer).split()
    best = 0.0
    for g in golds:
        gold = normalize_answer(g).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


_CLOSING = {"tag": re.compile(r"<answer>.*?</answer>\s*$", re.S | re.I)}


def ends_with_answer(text: str, answer_format: str = "tag") -> bool:
    """The response states its final answer in ``answer_format`` at its very end (``tag``: the last
    ``<answer>…</answer>`` block closes the text, StepSearch's ``answer_last_check``); other formats: an answer
    is stated (``hash`` reads the rest of the text after ``####`` anyway)."""
    if answer_format in _CLOSING:
        return _CLOSING[answer_format].search(text) is not None and extract_answer(text, answer_format) is not None
    return extract_answer(text, answer_format) is not None


@REWARDS.register
class AnswerF1(RewardTerm):
    """The token F1 of the stated final answer (``answer_format``) against the record's gold answers (see module
    doc). A response that does not end with its answer (``ends_with_answer``) scores ``unanswered`` (0 by default;
    StepSearch's release −1)."""

    def __init__(self, weight: float = 1.0, answer_format: str = "tag", unanswered: float = 0.0):
        super().__init__(weight)
        self.answer_format, self.unanswered = answer_format, float(unanswered)

    def score(self, sample: Sample) -> float:
        if not ends_with_answer(sample.completion, self.answer_format):
            return self.unanswered
        return token_f1(extract_answer(sample.completion, self.answer_format), gold_answers(sample.record))


_SSRL_TAGS = ("think", "search", "information", "answer")
_ANY_TAG = re.compile(r"<([^>]+)>")
_OUR_TAGS = re.compile(r"<(/?(?:think|search|information|answer))>")
PLACEHOLDERS = {
    "think": "your thoughts",
    "search": "your query",
    "information": "your information",
    "answer": "your answer",
}


def self_search_format(text: str, max_turn: int = 2, max_think: int = 8) -> float:
    """SSRL's format reward of a response (see module doc; the release's ``format_reward``)."""
    text = text.strip()
    allowed = set(_SSRL_TAGS) | {f"/{t}" for t in _SSRL_TAGS}
    if any(tag not in allowed for tag in _ANY_TAG.findall(text)):
        return 0.0
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return 0.0
    tags = _OUR_TAGS.findall(text)
    if len(tags) < 4:
        return 0.0
    for tag in _SSRL_TAGS:
        for body in re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.S):
            if not body.strip() or PLACEHOLDERS[tag] in body.lower():
                return 0.0
            if tag == "search" and len(body.split("\n")) != 1:
                return 0.0
    if tags[:2] != ["think", "/think"] or tags[-2:] != ["answer", "/answer"]:
        return 0.0
    middle, i = tags[2:-2], 0
    while i < len(middle):
        if middle[i] == "search":
            if middle[i + 1 : i + 4] != ["/search", "information", "/information"]:
                return 0.0
            i += 4
        else:
            i += 1
    thinks, searches = text.count("<think>"), text.count("<search>")
    if searches != text.count("<information>") or thinks > max_think:
        return 0.0
    ratio = min(thinks, searches + 1) / max(thinks, searches + 1)
    return min(thinks / max_turn, 1.0) * ratio


@REWARDS.register
class SelfSearchFormat(RewardTerm):
    """SSRL's format reward: the think / search / information / answer structure of a self-search response, scored
    in [0, 1] (see module doc). ``max_turn``: think blocks for full credit (the release's 2); ``max_think``: more
    think blocks score 0 (the release's 8)."""

    def __init__(self, weight: float = 1.0, max_turn: int = 2, max_think: int = 8):
        super().__init__(weight)
        if max_turn < 1 or max_think < 1:
            raise ValueError(
                f"reward term SelfSearchFormat: max_turn and max_think must be >= 1, got {max_turn}, {max_think}"
            )
        self.max_turn, self.max_think = int(max_turn), int(max_think)

    def score(self, sample: Sample) -> float:
        return self_search_format(sample.completion, self.max_turn, self.max_think)
