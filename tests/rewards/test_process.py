"""Process rewards (rlexp.rewards.process): the step splitter, the aggregations and TP-GRPO's thought units by hand,
step ends on the tiny model's real tokenizer, the PRM scorer on a tiny random PRM saved to disk (both conventions),
the term's cache, failures and dense token rewards, and two-step runs with reward=accuracy_prm."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForTokenClassification

from rlexp.core.masks import TOKEN_REWARDS
from rlexp.rewards.process import (
    PRMScorer,
    ProcessReward,
    StepScorer,
    aggregate_steps,
    merge_thoughts,
    split_steps,
    token_positions,
)
from rlexp.rewards.scoring import score
from rlexp.rewards.terms import Accuracy, Sample
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch


def _texts(text, mode, pattern=None):
    return [text[a:b] for a, b in split_steps(text, mode, pattern)]


# ---------------------------------------------------------------- splitter, by hand


def test_split_lines_gives_stripped_non_blank_lines_as_spans():
    # "a\n\n  b c \nd": a = [0, 1); the blank line is dropped; "  b c " is b c = [5, 8); d = [10, 11)
    assert split_steps("a\n\n  b c \nd", "lines") == [(0, 1), (5, 8), (10, 11)]


def test_split_paragraphs_cuts_at_blank_lines_only():
    text = "First step.\n\nSecond\nstep.\n \n\nThird"
    # "First step." = [0, 11); "\n\n" = [11, 13); "Second\nstep." = [13, 25); "\n \n\n" = [25, 29); "Third" = [29, 34)
    assert split_steps(text, "paragraphs") == [(0, 11), (13, 25), (29, 34)]
    assert _texts(text, "paragraphs") == ["First step.", "Second\nstep.", "Third"]


def test_split_sentences_keeps_decimals_and_cuts_at_line_breaks():
    text = "x = 3.5 here. Then y!  Done?\nLast line"
    assert _texts(text, "sentences") == ["x = 3.5 here.", "Then y!", "Done?", "Last line"]


def test_split_tagged_step_markers_and_step_groups():
    text = "Let me think.\nStep 1: add 2.\nstep 2. done"
    # the preamble is a step; each "Step <n>:" (any case, ":" or ".") starts the next
    assert _texts(text, "tagged") == ["Let me think.", "Step 1: add 2.", "step 2. done"]
    assert _texts("Step 1: a\nStep 2: b", "tagged") == ["Step 1: a", "Step 2: b"]
    tags = r"(?s)<step>(?P<step>.*?)</step>"
    assert _texts("<step>a</step> junk <step> b\nc </step>", "tagged", tags) == ["a", "b\nc"]


def test_split_edge_cases():
    assert split_steps("  one block  ", "paragraphs") == [(2, 11)]  # no separator: one step
    assert split_steps(" \n\n ", "paragraphs") == [] and split_steps("", "lines") == []
    assert _texts("no tags at all", "tagged") == ["no tags at all"]
    with pytest.raises(ValueError, match="split='words'"):
        split_steps("a", "words")


# ---------------------------------------------------------------- aggregations and thoughts, by hand


def test_aggregations_by_hand():
    s = [0.9, 0.5, 0.8]
    assert aggregate_steps(s, "min") == 0.5
    assert aggregate_steps(s, "product") == pytest.approx(0.36)  # 0.9 · 0.5 · 0.8
    assert aggregate_steps(s, "last") == 0.8
    assert aggregate_steps(s, "mean") == pytest.approx(2.2 / 3)
    for how in ("min", "product", "last", "mean"):
        assert aggregate_steps([], how) is None
    with pytest.raises(ValueError, match="aggregate='max'"):
        aggregate_steps(s, "max")


def test_merge_thoughts_by_hand():
    # judged right, right, wrong, right at 0.5: units (0.9, 0.7) → mean 0.8 ending at 10; (0.2) at 15; (0.6) at 20
    ends, scores = merge_thoughts([5, 10, 15, 20], [0.9, 0.7, 0.2, 0.6], 0.5)
    assert ends == [10, 15, 20] and scores == pytest.approx([0.8, 0.2, 0.6])
    assert merge_thoughts([], [], 0.5) == ([], [])


# ---------------------------------------------------------------- step ends on the real tokenizer


def test_token_positions_on_the_tiny_tokenizer(tiny):
    tok = tiny.tokenizer
    text = "Add 2 and 3.\n\nThe sum is 5.\n\n#### 5"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # as sampled: the EOS at the end
    ends = [b for _, b in split_steps(text, "paragraphs")]
    pos = token_positions(tok, ids, text, ends)
    assert pos[-1] == len(ids) - 2  # the last step ends at the last text token, before the EOS
    for e, p in zip(ends, pos):  # the token at p completes the step; the one before it does not
        assert len(tok.decode(ids[: p + 1], skip_special_tokens=True)) >= e
        assert len(tok.decode(ids[:p], skip_special_tokens=True)) < e
    assert token_positions(tok, None, text, ends) == pos  # the offsets fallback agrees here
    assert token_positions(tok, ids, text, []) == []


# ---------------------------------------------------------------- the PRM scorer on a tiny random PRM


QUESTION = "What is 2 + 3?"
STEPS = [["2 plus 3 is 5.", "So the answer is 5."], ["I guess 6."], ["Start.", "Middle step here.", "End."]]


def test_prm_scorer_math_shepherd_scores_by_hand_and_batched(prm_path):
    scorer = PRMScorer(prm_path, device="cpu", batch_size=8)
    text, ends = scorer.render(QUESTION, STEPS[0])
    # "What is 2 + 3? " (15) + "2 plus 3 is 5." (14) + " ки" (3) = 32; + "\n" + "So the answer is 5." (19) + " ки" = 55
    assert text == "What is 2 + 3? 2 plus 3 is 5. ки\nSo the answer is 5. ки" and ends == [32, 55]
    batched = scorer.score_batch([QUESTION] * 3, STEPS)
    assert [len(s) for s in batched] == [2, 1, 3]
    assert all(0.0 <= v <= 1.0 for s in batched for v in s)
    one = PRMScorer(prm_path, device="cpu", batch_size=1)
    for steps, got in zip(STEPS, batched):  # right padding: the batched scores are the unbatched ones
        assert one.score_steps(QUESTION, steps) == pytest.approx(got, abs=1e-5)
    # by hand: P("+") / (P("+") + P("-")) of the next-token logits at each tag's last token
    tok, model = scorer.tokenizer, scorer.model
    enc = tok(text, return_offsets_mapping=True, return_tensors="pt")
    offs = enc.pop("offset_mapping")[0].tolist()
    logits = model(**enc).logits[0]
    plus, minus = tok("+", add_special_tokens=False)["input_ids"][0], tok("-", add_special_tokens=False)["input_ids"][0]
    want = []
    for e in ends:
        p = max(i for i, (a, b) in enumerate(offs) if b > a and a < e)
        g, b = math.exp(float(logits[p, plus])), math.exp(float(logits[p, minus]))
        want.append(g / (g + b))
    assert batched[0] == pytest.approx(want, abs=1e-5)
    assert isinstance(scorer, StepScorer)


def test_prm_scorer_qwen_convention_on_a_token_classifier(tiny, tmp_path):
    """Qwen2.5-Math-PRM's layout: steps ended by <extra_0> in the chat template, label 1's probability there."""
    tok = tiny.tokenizer
    tok_path = tmp_path / "qprm"
    tok.save_pretrained(tok_path)
    from transformers import AutoTokenizer

    qtok = AutoTokenizer.from_pretrained(tok_path)
    qtok.add_special_tokens({"additional_special_tokens": ["<extra_0>"]})
    cfg = tiny.model.config.to_dict()
    cfg.update(num_labels=2, vocab_size=len(qtok))
    from transformers import LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(LlamaConfig(**cfg))
    model.save_pretrained(tok_path)
    qtok.save_pretrained(tok_path)
    scorer = PRMScorer(str(tok_path), style="qwen_prm", device="cpu")
    text, ends = scorer.render(QUESTION, STEPS[0])
    assert text[: ends[0]].endswith("2 plus 3 is 5.<extra_0>") and text[: ends[1]].endswith("answer is 5.<extra_0>")
    got = scorer.score_batch([QUESTION, QUESTION], STEPS[:2])
    assert [len(s) for s in got] == [2, 1] and all(0.0 <= v <= 1.0 for s in got for v in s)
    enc = scorer.tokenizer(text, return_tensors="pt")
    ids = enc["input_ids"][0]
    at = (ids == scorer.tokenizer.convert_tokens_to_ids("<extra_0>")).nonzero().squeeze(-1)
    want = torch.softmax(scorer.model(**enc).logits[0, at, :2], -1)[:, 1]
    assert got[0] == pytest.approx(want.tolist(), abs=1e-5)


# ---------------------------------------------------------------- the term


class LengthScorer:
    """Step score = len(step) / 10; counts the rows it scored; fails on a step that says "boom"."""

    def __init__(self):
        self.rows = 0

    def score_steps(self, question, steps):
        self.rows += 1
        if any("boom" in s for s in steps):
            raise RuntimeError("boom")
        return [len(s) / 10 for s in steps]


def _sample(completion, ids=None, prompt="p"):
    return Sample(prompt, completion, {"question": "q", "answer": "5"}, 0, 3, False, ids)


def test_process_reward_aggregates_caches_and_counts_failures():
    scorer = LengthScorer()
    term = ProcessReward(scorer=scorer, aggregate="min")
    # "ab\n\nabcd" → steps (ab, abcd) → (0.2, 0.4): min 0.2; "abc" → 0.3; " " no step: missing; boom: failure
    samples = [_sample("ab\n\nabcd"), _sample("abc"), _sample(" "), _sample("x\n\nboom"), _sample("abc")]
    res = term(samples)
    assert res.scores == pytest.approx([0.2, 0.3, 0.0, 0.0, 0.3])
    assert res.failures == [False, False, False, True, False] and res.missing == [False, False, True, False, False]
    assert scorer.rows == 3  # the repeated "abc" was scored once (a hit), the failed row by itself
    assert res.metrics["cache_hits"] == 1 and res.token_rewards is None
    assert res.metrics["steps_mean"] == pytest.approx(4 / 4)  # 2 + 1 + 0 + 1 steps over the 4 scored rows
    again = term(samples[:2])
    assert again.scores == pytest.approx([0.2, 0.3]) and again.metrics["cache_hits"] == 2 and scorer.rows == 3
    assert term.cache_hits == 3 and term.step_scores("p", "ab\n\nabcd") == pytest.approx([0.2, 0.4])
    for how, want in (("product", 0.08), ("last", 0.4), ("mean", 0.3)):
        assert ProcessReward(scorer=LengthScorer(), aggregate=how)([samples[0]]).scores == pytest.approx([want])
    # thought units at 0.25: 0.2 (wrong) | 0.4 (right) stay apart; min 0.2
    assert ProcessReward(scorer=LengthScorer(), unit="thought", threshold=0.25)([samples[0]]).scores == [0.2]


def test_a_failing_batch_scorer_falls_back_to_rows_and_a_none_row_is_a_failure():
    class Flaky:
        def score_batch(self, questions, steps_lists):
            raise RuntimeError("out of memory")

        def score_steps(self, question, steps):
            return None if len(steps) > 1 else [0.5]

    res = ProcessReward(scorer=Flaky())([_sample("a\n\nb"), _sample("c")])
    assert res.failures == [True, False] and res.scores == [0.0, 0.5]


def test_a_scorer_returning_the_wrong_count_or_nan_is_a_failure():
    class Odd:
        def score_steps(self, question, steps):
            return [math.nan] if steps[0] == "n" else [0.5, 0.5]

    res = ProcessReward(scorer=Odd())([_sample("n"), _sample("one")])
    assert res.failures == [True, True]


def test_model_null_is_a_config_error_naming_the_key():
    from omegaconf import OmegaConf

    from rlexp.config.schema import ConfigError
    from rlexp.runs.setup import build_reward_term

    node = OmegaConf.create({"_target_": "rlexp.rewards.process.ProcessReward", "model": None})
    with pytest.raises(ConfigError, match=r"reward\.terms\.prm: model is null.*reward\.terms\.<name>\.model"):
        build_reward_term(node, "reward.terms.prm")
    with pytest.raises(ValueError, match="split='words'"):
        ProcessReward(scorer=LengthScorer(), split="words")


def test_dense_step_rewards_land_at_the_step_ends(tiny):
    tok = tiny.tokenizer
    text = "ab\n\nabcd"  # steps (ab, abcd) → scores (0.2, 0.4)
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ends = token_positions(tok, ids, text, [2, 8])
    term = ProcessReward(weight=0.5, scorer=LengthScorer(), dense=True)
    with pytest.raises(RuntimeError, match="tokenizer"):
        term([_sample(text, ids)])
    term.bind_tokenizer(tok)
    res = term([_sample(text, ids)])
    assert res.token_rewards == [list(zip(ends, [0.2, 0.4]))]
    # through the reward stage: weight × step score at the step ends, the term's column at weight 0 in the total
    width = len(ids) + 2
    batch = make_batch([0.0], [0], lengths=[len(ids)], width=width)
    batch.completion_ids[0, : len(ids)] = torch.tensor(ids)
    batch.completions, batch.prompts = [text], ["p"]
    batch.records = [{"question": "q", "answer": "5", "scorer": "math"}]
    score(batch, {"accuracy": Accuracy(), "prm": term})
    want = torch.zeros(1, width)
    want[0, ends[0]], want[0, ends[1]] = 0.5 * 0.2, 0.5 * 0.4
    torch.testing.assert_close(batch.extras[TOKEN_REWARDS], want)
    assert batch.reward_weights.tolist() == [1.0, 0.0] and batch.term("prm").item() == pytest.approx(0.2)
    assert batch.reward.item() == 0.0  # "abcd" states no answer 5: the outcome is the accuracy alone


# ---------------------------------------------------------------- two training steps on the tiny model

VOWELS = "reward.terms.accuracy._target_=tests.algorithms.varying_reward.VowelShare"
FAST = ["trainer.autocast=off", "trainer.max_new_tokens=8", "trainer.device=cpu"]


def _prm_run(tiny_cfg, prm_path, *overrides):
    return run(
        tiny_cfg(
            "reward=accuracy_prm",
            VOWELS,
            *FAST,
            f"reward.terms.prm.model={prm_path}",
            "reward.terms.prm.split=lines",
            *overrides,
        )
    )


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_accuracy_prm_trains_two_steps_under_grpo(tiny_cfg, prm_path):
    result = _prm_run(tiny_cfg, prm_path, "algorithm=grpo")
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert 0.0 <= m["reward/prm/mean"] <= 1.0 and m["reward/prm/failures"] == 0.0
    assert m["reward/prm/steps_mean"] >= 1.0 and "reward/prm/cache_hits" in m


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_accuracy_prm_dense_trains_two_steps_under_reinforce_pp(tiny_cfg, prm_path):
    result = _prm_run(tiny_cfg, prm_path, "algorithm=reinforce_pp", "reward.terms.prm.dense=true")
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert 0.0 < m["reward/prm/step_score_mean"] < 1.0 and m["reward/prm/token_rewards_mean"] >= 1.0


def test_dense_process_rewards_are_refused_by_an_outcome_estimator(tiny_cfg, prm_path):
    with pytest.raises(ValueError, match="token_rewards.*reinforce_pp or gae"):
        _prm_run(tiny_cfg, prm_path, "algorithm=grpo", "reward.terms.prm.dense=true", "trainer.max_steps=1")


def test_the_shipped_reward_config_asks_for_a_prm(tiny_cfg):
    from rlexp.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"reward\.terms\.prm: model is null"):
        run(tiny_cfg("reward=accuracy_prm", "trainer.max_steps=1"))
