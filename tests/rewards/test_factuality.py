"""KLCF's Dual-Fact Alignment rewards (rlexp.rewards.factuality; its claim rule from rlexp.data.checklists): checklist
recall and self-assessed precision, worked out by hand, then two training steps of algorithm=klcf reward=klcf on the
tiny model."""

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.data.checklists import claim_overlap, content_tokens, fact_coverage, split_claims
from rlexp.rewards.factuality import (
    ChecklistRecall,
    SelfAssessedPrecision,
    answer_token_id,
    covered_facts,
    truth_probabilities,
    verification_texts,
)
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run

FIXTURE = "tests/fixtures/data/longfact_checklists.jsonl"

EIFFEL = [
    "The Eiffel Tower is in Paris, France.",  # {eiffel, tower, pari, france}
    "The Eiffel Tower was completed in 1889.",  # {eiffel, tower, completed, 1889}
    "The Eiffel Tower was designed by the company of Gustave Eiffel.",  # {eiffel, tower, designed, company, gustave}
    "The Eiffel Tower was built for the 1889 World's Fair.",  # {eiffel, tower, built, 1889, world, fair}
]
# claims: {eiffel, tower, stand, pari, france} | {finished, 1889} | {tourist, visit}
ANSWER = "The Eiffel Tower stands in Paris, France. It was finished in 1889.\n- Many tourists visit it."


def _sample(completion, checklist=None, question="Tell me facts."):
    record = {"id": "r0", "question": question}
    if checklist is not None:
        record["checklist"] = checklist
    return Sample("prompt", completion, record, 0, 10, False)


def test_content_tokens_drop_stop_words_and_a_plural_s():
    # "the", "is", "in" are stop words; "paris" (5 letters, ends in s) -> "pari"; "world's" -> "world" + stop "s"
    assert content_tokens("The Eiffel Tower is in Paris, France.") == ["eiffel", "tower", "pari", "france"]
    assert content_tokens("the 1889 World's Fair; glass") == ["1889", "world", "fair", "glass"]  # "glass": -ss kept


def test_claims_are_sentences_and_list_items_with_enough_content():
    assert split_claims(ANSWER) == [
        "The Eiffel Tower stands in Paris, France.",
        "It was finished in 1889.",
        "Many tourists visit it.",  # the bullet stripped
    ]
    assert split_claims("Sure! Here it is. Pi is 3.14 exactly.") == ["Pi is 3.14 exactly."]  # 1-token pieces dropped
    assert split_claims(ANSWER, min_tokens=3) == ["The Eiffel Tower stands in Paris, France."]


def test_fact_coverage_and_claim_overlap_by_hand():
    # fact 2 {eiffel, tower, completed, 1889} vs claim 1 {eiffel, tower, stand, pari, france}: 2 of 4 tokens
    assert fact_coverage(EIFFEL[1], "The Eiffel Tower stands in Paris, France.") == 0.5
    assert fact_coverage("the of", "anything") == 0.0  # a fact with no content token covers nothing
    # Dice: 2·|{mars}| / (|{mars, two, moon}| + |{mars, fourth, planet, sun}|) = 2/7
    assert claim_overlap("Mars has two moons.", "Mars is the fourth planet from the Sun.") == pytest.approx(2 / 7)


def test_checklist_recall_by_hand():
    # fact 1: claim 1 holds 4/4 -> covered; fact 2: best 2/4 = 0.5 (claim 1); fact 3: 2/5; fact 4: 2/6
    assert covered_facts(ANSWER, EIFFEL, threshold=0.6) == [True, False, False, False]
    assert ChecklistRecall(threshold=0.6)([_sample(ANSWER, EIFFEL)]).scores == [0.25]
    assert ChecklistRecall(threshold=0.5)([_sample(ANSWER, EIFFEL)]).scores == [0.5]  # fact 2 now counts
    # one sentence holding two facts covers both; nothing covers nothing
    both = "The Eiffel Tower in Paris, France was completed in 1889."
    assert ChecklistRecall()([_sample(both, EIFFEL), _sample("", EIFFEL)]).scores == [0.5, 0.0]


def test_checklist_recall_empty_checklist_is_missing_and_no_checklist_field_is_an_error():
    res = ChecklistRecall()([_sample(ANSWER, []), _sample(ANSWER, EIFFEL)])
    assert res.scores == [0.0, 0.25] and res.missing == [True, False]
    with pytest.raises(ValueError, match="'checklist'.*dataset=longfact_checklists"):
        ChecklistRecall()([_sample(ANSWER)])
    with pytest.raises(ValueError, match="threshold"):
        ChecklistRecall(threshold=0.0)


class ParisBeliever(torch.nn.Module):
    """A fake scorer: logit log 3 on "True" when the verification prompt mentions Paris, else on "False"; so
    P(True) = 3/4 or 1/4 at the last position."""

    def __init__(self, tok, true_id, false_id):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.tok, self.ids = tok, (true_id, false_id)

    def forward(self, input_ids, attention_mask, position_ids=None, use_cache=False):
        logits = torch.zeros(*input_ids.shape, len(self.tok))
        for i, row in enumerate(input_ids):
            text = self.tok.decode(row[attention_mask[i].bool()])
            logits[i, -1, self.ids[0] if "Paris" in text else self.ids[1]] = math.log(3)
        return SimpleNamespace(logits=logits)


@pytest.fixture(scope="module")
def believer(tiny):
    tok = tiny.tokenizer
    texts, sep = verification_texts(tok, ["q"], ["c"], "{question} {claim}", chat=True)
    ids = [answer_token_id(tok, texts[0], sep + w) for w in ("True", "False")]
    assert ids[0] != ids[1]
    return ParisBeliever(tok, *ids), tok


def test_self_assessed_precision_by_hand(believer):
    model, tok = believer
    term = SelfAssessedPrecision(model=model, tokenizer=tok)
    # claims: "Paris is the capital of France." (P = 3/4), "The Moon is made of cheese." (P = 1/4): mean 1/2;
    # "Paris is lovely in spring." alone: 3/4; no claim at all: empty_score 0
    two = "Paris is the capital of France. The Moon is made of cheese."
    res = term([_sample(two), _sample("Paris is lovely in spring."), _sample("Ok."), _sample("")])
    assert res.scores == pytest.approx([0.5, 0.75, 0.0, 0.0]) and res.failures == [False] * 4
    share = SelfAssessedPrecision(model=model, tokenizer=tok, aggregate="share_true", empty_score=0.5)
    assert share([_sample(two), _sample("")]).scores == pytest.approx([0.5, 0.5])  # 1 of 2 claims >= 0.5
    capped = SelfAssessedPrecision(model=model, tokenizer=tok, max_claims=1)
    assert capped([_sample(two)]).scores == pytest.approx([0.75])  # the first claim only


def test_self_assessed_precision_bad_settings_name_the_key(believer):
    model, tok = believer
    with pytest.raises(ValueError, match="aggregate"):
        SelfAssessedPrecision(model=model, tokenizer=tok, aggregate="max")
    with pytest.raises(ValueError, match="scorer_model"):
        SelfAssessedPrecision()
    with pytest.raises(ValueError, match="claim"):
        SelfAssessedPrecision(model=model, tokenizer=tok, template="{question}")


def test_truth_probabilities_of_the_tiny_model_do_not_depend_on_the_batch(tiny):
    questions = ["Who was Marie Curie?"] * 3
    claims = [
        "Marie Curie won two Nobel Prizes.",
        "She was born in Warsaw.",
        "Marie Curie discovered polonium and radium.",
    ]
    together = truth_probabilities(tiny.model, tiny.tokenizer, questions, claims, batch_size=3)
    alone = torch.cat([truth_probabilities(tiny.model, tiny.tokenizer, [q], [c]) for q, c in zip(questions, claims)])
    assert together.shape == (3,) and ((together > 0) & (together < 1)).all()
    assert torch.allclose(together, alone, atol=1e-5)  # left padding and position ids leave each row unchanged
    assert tiny.tokenizer.padding_side == "left"


def test_the_scorer_is_loaded_once_from_a_model_entry():
    node = OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml")
    a = SelfAssessedPrecision(scorer_model=node, device="cpu")
    b = SelfAssessedPrecision(scorer_model=node, device="cpu", aggregate="share_true")
    assert a.model is b.model and not any(p.requires_grad for p in a.model.parameters())
    assert 0.0 < a([_sample("Marie Curie won two Nobel Prizes.")]).scores[0] < 1.0


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_klcf_trains_two_steps_on_the_tiny_model(tiny_cfg):
    cfg = tiny_cfg(
        "algorithm=klcf",
        "reward=klcf",
        "prompt=longform",
        "dataset=longfact_checklists",
        f"dataset.path={FIXTURE}",
        "trainer.autocast=off",
        "trainer.max_new_tokens=16",
    )
    m = run(cfg).metrics
    assert math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    # the random model states none of the checklist facts; the base model's belief varies between its completions
    assert 0.0 <= m["reward/checklist_recall/mean"] <= 1.0 and m["reward/checklist_recall/failures"] == 0
    assert 0.0 < m["reward/self_precision/mean"] < 1.0 and m["reward/self_precision/std"] > 0
    assert m["reward/mean"] == pytest.approx(m["reward/checklist_recall/mean"] + m["reward/self_precision/mean"])
    assert "klcf/f1_mean" in m and m["klcf/zero_recall_frac"] <= 1.0
