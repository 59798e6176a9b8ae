"""Long-form factuality rewards of KLCF ("Knowledge-Level Consistency Reinforcement Learning: Dual-Fact Alignment for
Long-Form Factuality", Li et al., 2025; arXiv 2509.23765): *Dual-Fact Alignment* scores a long answer twice,

* **checklist recall** (``ChecklistRecall``) — the share of the prompt's fact checklist (``record["checklist"]``:
  short facts inside the base model's knowledge boundary, built offline by ``rlexp.data.checklists``) that the
  completion states: coverage of what the base model knows;
* **self-assessed precision** (``SelfAssessedPrecision``) — the completion split into claims, each claim scored by
  the base model's own belief that it is true, the scores averaged: no claim outside what the base model believes.

What is ours (the paper verifies checklist coverage with a trained 14B checklist verifier and scores claims with a
truthfulness reward model trained on the base model's own verified claims; neither model is available offline):

* claims are the completion's sentences (split at ``.``/``!``/``?`` + space, at line breaks and bullets) with at least
  ``min_claim_tokens`` content tokens, not the output of a claim-extraction model;
* content tokens: lower-cased word tokens, stop words dropped, a plural ``-s`` dropped (``content_tokens``);
* a checklist fact is *covered* when one claim holds at least ``threshold`` of the fact's content tokens
  (``fact_coverage``): a normalised token overlap, not an entailment judge;
* a claim's truth probability is the base model's ``P(True) / (P(True) + P(False))`` for the next token after a
  verification prompt (``truth_probabilities``; question, claim, "Is the statement true? Answer True or False.")
  — the untrained base model's likelihood stands in for the paper's trained self-assessment module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import torch

from rlexp.core.registry import REWARDS
from rlexp.data.checklists import content_tokens, fact_coverage, split_claims
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)


def covered_facts(completion: str, checklist: Sequence[str], threshold: float, min_claim_tokens: int = 2) -> list[bool]:
    """For each checklist fact: does some claim of ``completion`` hold ``threshold`` of its content tokens?"""
    claims = [content_tokens(c) for c in split_claims(completion, min_claim_tokens)]
    return [any(fact_coverage(content_tokens(f), c) >= threshold for c in claims) for f in checklist]


def checklist_of(record: dict, key: str) -> list[str]:
    """The record's checklist (a list of strings); a record without one is a configuration error naming the key."""
    if key not in record:
        raise ValueError(
            f"reward checklist_key={key!r}: record {record.get('id')!r} has no {key!r} field; checklist recall needs "
            "a dataset of records with fact checklists (dataset=longfact_checklists, rlexp.data.checklists)"
        )
    items = record[key]
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
        raise ValueError(f"record {record.get('id')!r}: {key!r} must be a list of strings, got {items!r:.80}")
    return list(items)


@REWARDS.register
class ChecklistRecall(RewardTerm):
    """KLCF's checklist reward: the share of the record's checklist facts that the completion covers
    (``covered_facts``; see the module docstring for the matching rule). A record with an empty checklist is
    "does not apply" (missing, scored 0); a record with no checklist field raises (a dataset without checklists)."""

    def __init__(
        self, weight: float = 1.0, threshold: float = 0.6, checklist_key: str = "checklist", min_claim_tokens: int = 2
    ):
        super().__init__(weight)
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"reward term ChecklistRecall.threshold={threshold}: must be in (0, 1]")
        if min_claim_tokens < 1:
            raise ValueError(f"reward term ChecklistRecall.min_claim_tokens={min_claim_tokens}: must be >= 1")
        self.threshold, self.key, self.min_claim_tokens = float(threshold), checklist_key, int(min_claim_tokens)

    def recall(self, completion: str, checklist: Sequence[str]) -> float | None:
        if not checklist:
            return None
        hits = covered_facts(completion, checklist, self.threshold, self.min_claim_tokens)
        return sum(hits) / len(hits)

    def score(self, sample: Sample) -> float:
        r = self.recall(sample.completion, checklist_of(sample.record, self.key))
        return 0.0 if r is None else r

    def __call__(self, samples: list[Sample]) -> TermResult:
        checklists = [checklist_of(s.record, self.key) for s in samples]  # a missing field is a config error: raise
        scores = [self.recall(s.completion, c) for s, c in zip(samples, checklists)]
        missing = [r is None for r in scores]
        return TermResult([0.0 if r is None else r for r in scores], [False] * len(samples), missing)


VERIFY_TEMPLATE = "Question: {question}\nStatement: {claim}\nIs the statement true? Answer True or False."


def verification_texts(tokenizer, questions: Sequence[str], claims: Sequence[str], template: str, chat: bool):
    """The verification prompts and the separator before the answer word (chat: the assistant turn; raw: ``Answer:``
    then a space)."""
    texts = []
    for q, c in zip(questions, claims):
        body = template.format(question=q, claim=c)
        if chat:
            msgs = [{"role": "user", "content": body}]
            texts.append(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
        else:
            texts.append(body + "\nAnswer:")
    return texts, ("" if chat else " ")


def answer_token_id(tokenizer, prefix: str, word: str) -> int:
    """The first token the tokenizer gives ``word`` right after ``prefix`` (the tokenisation the model would see)."""
    head = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    full = tokenizer(prefix + word, add_special_tokens=False)["input_ids"]
    if len(full) > len(head) and full[: len(head)] == head:
        return int(full[len(head)])
    return int(tokenizer(word, add_special_tokens=False)["input_ids"][0])


@torch.no_grad()
def truth_probabilities(
    model,
    tokenizer,
    questions: Sequence[str],
    claims: Sequence[str],
    template: str = VERIFY_TEMPLATE,
    chat: bool = True,
    words: tuple[str, str] = ("True", "False"),
    batch_size: int = 32,
) -> torch.Tensor:
    """(N,) ``P(True) / (P(True) + P(False))`` of the next token after each claim's verification prompt, under
    ``model`` (left padding, position ids from the attention mask, as ``likelihood.answer_confidence``)."""
    out = torch.empty(len(claims))
    if not claims:
        return out
    texts, sep = verification_texts(tokenizer, questions, claims, template, chat)
    ids = torch.tensor([answer_token_id(tokenizer, texts[0], sep + w) for w in words])
    if ids[0] == ids[1]:
        raise ValueError(f"the answer words {words} start with the same token: pick words the tokenizer tells apart")
    device = next(model.parameters()).device
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # the last position is the next token of every row
    try:
        for k in range(0, len(texts), batch_size):
            enc = tokenizer(texts[k : k + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = enc.to(device)
            positions = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            logits = model(**enc, position_ids=positions, use_cache=False).logits[:, -1].float()
            pair = logits[:, ids.to(device)]
            out[k : k + len(pair)] = torch.softmax(pair, -1)[:, 0].cpu()
    finally:
        tokenizer.padding_side = side
    return out


_SCORERS: dict[str, tuple] = {}


def load_scorer(model_cfg, device: str = "auto"):
    """The frozen scorer model and tokenizer of a ``model/`` config node (its ``peft`` dropped: the plain base),
    loaded once per (config, device) and kept for the process."""
    from omegaconf import DictConfig, OmegaConf

    from rlexp.models.loading import load_model

    cfg = OmegaConf.to_container(model_cfg, resolve=True) if isinstance(model_cfg, DictConfig) else dict(model_cfg)
    cfg.pop("peft", None)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    key = json.dumps([cfg, str(dev)], sort_keys=True, default=str)
    if key not in _SCORERS:
        loaded = load_model(OmegaConf.create(cfg), dev)
        loaded.model.eval().requires_grad_(False)
        _SCORERS[key] = (loaded.model, loaded.tokenizer)
    return _SCORERS[key]


AGGREGATES = ("mean_prob", "share_true")


@REWARDS.register
class SelfAssessedPrecision(RewardTerm):
    """KLCF's truthfulness reward, as a stand-in: the completion's claims (``split_claims``) each scored by the frozen
    base model's belief that they are true (``truth_probabilities``), then ``aggregate``d — ``mean_prob``: the mean
    probability; ``share_true``: the share of claims with probability >= 0.5. A completion with no claim scores
    ``empty_score`` (0: asserting nothing is not precise). At most ``max_claims`` claims per completion are scored
    (the first ones).

    ``scorer_model``: a ``model/`` config node (``${model}``: the run's own base model, frozen at its loaded weights;
    or a trained verifier's entry); ``model``/``tokenizer``: an already loaded scorer instead (tests)."""

    def __init__(
        self,
        weight: float = 1.0,
        scorer_model=None,
        device: str = "auto",
        template: str = VERIFY_TEMPLATE,
        chat_template: bool = True,
        aggregate: str = "mean_prob",
        empty_score: float = 0.0,
        max_claims: int = 16,
        min_claim_tokens: int = 2,
        batch_size: int = 32,
        question_key: str = "question",
        model=None,
        tokenizer=None,
    ):
        super().__init__(weight)
        if aggregate not in AGGREGATES:
            raise ValueError(f"reward term SelfAssessedPrecision.aggregate={aggregate!r}: must be one of {AGGREGATES}")
        if max_claims < 1 or min_claim_tokens < 1 or batch_size < 1:
            raise ValueError(
                "reward term SelfAssessedPrecision: max_claims, min_claim_tokens and batch_size must be >= 1 "
                f"(got {max_claims}, {min_claim_tokens}, {batch_size})"
            )
        if "{claim}" not in template:
            raise ValueError(f"reward term SelfAssessedPrecision.template={template!r} has no {{claim}} field")
        if (model is None) != (tokenizer is None):
            raise ValueError("reward term SelfAssessedPrecision: give both model and tokenizer, or scorer_model")
        if model is None:
            if scorer_model is None:
                raise ValueError(
                    "reward term SelfAssessedPrecision.scorer_model is not set: the base model's config, e.g. ${model}"
                )
            model, tokenizer = load_scorer(scorer_model, device)
        self.model, self.tokenizer = model, tokenizer
        self.template, self.chat = template, bool(chat_template) and bool(getattr(tokenizer, "chat_template", None))
        self.aggregate, self.empty_score = aggregate, float(empty_score)
        self.max_claims, self.min_claim_tokens, self.batch_size = int(max_claims), int(min_claim_tokens), batch_size
        self.question_key = question_key

    def claim_probabilities(self, samples: list[Sample]) -> list[list[float]]:
        """Each sample's claim probabilities (one batched pass over every claim of the batch)."""
        owners, questions, claims = [], [], []
        for i, s in enumerate(samples):
            for c in split_claims(s.completion, self.min_claim_tokens)[: self.max_claims]:
                owners.append(i)
                questions.append(str(s.record.get(self.question_key, s.prompt)))
                claims.append(c)
        probs = truth_probabilities(
            self.model, self.tokenizer, questions, claims, self.template, self.chat, batch_size=self.batch_size
        )
        per: list[list[float]] = [[] for _ in samples]
        for i, p in zip(owners, probs.tolist()):
            per[i].append(p)
        return per

    def precision(self, probs: list[float]) -> float:
        if not probs:
            return self.empty_score
        if self.aggregate == "share_true":
            return sum(p >= 0.5 for p in probs) / len(probs)
        return sum(probs) / len(probs)

    def score(self, sample: Sample) -> float:
        return self.precision(self.claim_probabilities([sample])[0])

    def __call__(self, samples: list[Sample]) -> TermResult:
        if not samples:
            return TermResult([], [])
        try:
            per = self.claim_probabilities(samples)
        except Exception as e:  # the scorer failed on the batch: every sample recorded, the run goes on
            log.warning("reward SelfAssessedPrecision failed on a batch of %d: %r", len(samples), e)
            return TermResult([0.0] * len(samples), [True] * len(samples))
        return TermResult([self.precision(p) for p in per], [False] * len(samples))
