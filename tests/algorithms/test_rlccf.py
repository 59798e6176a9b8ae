"""RLCCF's SC-weighted collective vote (rlexp/algorithms/group_stages/collective.py, algorithm=rlccf)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages import collective
from rlexp.algorithms.group_stages.collective import (
    CollectiveVote,
    collective_vote,
    peer_model_config,
    peer_seed,
    self_consistency,
)
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


def test_self_consistency_is_the_share_of_the_own_majority():
    assert self_consistency([0, 0, 1, -1]) == 0.5  # majority 0 holds 2 of 4 samples (the missing one counts)
    assert self_consistency([2, 2, 2]) == 1.0
    assert self_consistency([-1, -1]) == 0.0  # no answer: no weight
    assert self_consistency([]) == 0.0


def test_sc_weighted_vote_lets_a_confident_peer_overrule_the_policy_majority():
    # policy: 7,7,7,9 -> SC 3/4; votes 7: 3/4 * 3/4 = 0.5625, 9: 3/4 * 1/4 = 0.1875
    # peer:   9,9,9,9 -> SC 1;   votes 9: 1 * 1 = 1.0           -> 9: 1.1875 > 7: 0.5625
    res = collective_vote([["7", "7", "7", "9"], ["9", "9", "9", "9"]])
    assert res.sc == [0.75, 1.0]
    assert res.votes == pytest.approx({0: 0.5625, 1: 1.1875})
    assert res.label == "9" and res.rewards == [0.0, 0.0, 0.0, 1.0]
    assert res.consistency == 5 / 8  # one policy 9 and four peer 9s of the 8 samples


def test_the_weights_decide_against_the_raw_count():
    # raw counts: six "3"s (from three unsure members) against four "4"s (from one sure peer)
    # policy 3,3,1,2 (SC 1/2): 3: 1/2 * 2/4 = 0.25;  peer A 3,3,5,6 (SC 1/2): 3: 0.25
    # peer B 4,4,4,4 (SC 1):   4: 1 * 1 = 1.0;       peer C 3,3,7,8 (SC 1/2): 3: 0.25
    # totals: 3: 0.75 < 4: 1.0 -> label 4 (unweighted shares would pick 3: 1.5 vs 1.0)
    res = collective_vote([["3", "3", "1", "2"], ["3", "3", "5", "6"], ["4", "4", "4", "4"], ["3", "3", "7", "8"]])
    assert res.sc == [0.5, 0.5, 1.0, 0.5]
    assert res.label == "4" and res.rewards == [0.0, 0.0, 0.0, 0.0]
    assert res.consistency == 4 / 16


def test_a_tie_goes_to_the_first_seen_answer_and_math_equivalents_vote_together():
    # policy 1,2 (SC 1/2): 1: 0.25, 2: 0.25; peer 2.0,1 (SC 1/2): "2.0" is "2": 2: 0.25, 1: 0.25 -> 0.5 each
    res = collective_vote([["1", "2"], ["2.0", "1"]])
    assert res.votes == pytest.approx({0: 0.5, 1: 0.5})
    assert res.label == "1" and res.rewards == [1.0, 0.0]  # "1" was seen first (the policy's first row)
    # the peer's answers first in its own right: the policy still comes first in the order
    res = collective_vote([["2", "1"], ["1", "2"]])
    assert res.label == "2" and res.rewards == [1.0, 0.0]


def test_missing_answers_count_in_sc_and_never_vote():
    # policy: -,-,3,- -> SC 1/4, votes 3: 1/4 * 1/4; peer: no answer -> SC 0 -> label 3
    res = collective_vote([[None, None, "3", None], [None, None, None, None]])
    assert res.sc == [0.25, 0.0]
    assert res.label == "3" and res.rewards == [0.0, 0.0, 1.0, 0.0]
    assert res.consistency == 1 / 8
    # nobody answers: no label, no reward, no consistency
    res = collective_vote([[None, None], [None]])
    assert res.label is None and res.label_cluster is None and res.rewards == [0.0, 0.0] and res.consistency == 0.0


class FakeRollout:
    """Stands in for the HF engine: each prompt's n completions are scripted texts; records the calls."""

    def __init__(self, script: dict[str, list[str]]):
        self.script, self.calls = script, []

    def generation_copy(self, model):  # the HF engine's marker
        return model

    def generate(self, model, tokenizer, prompts, num_generations=1, max_new_tokens=None, use_shadow=True):
        self.calls.append((list(prompts), num_generations, use_shadow))
        texts = [t for p in prompts for t in self.script[p][:num_generations]]
        return SimpleNamespace(texts=texts)


def stage_batch(answers, groups, accuracy_weight=0.0, label="9"):
    b = make_batch([0.0] * len(groups), groups, terms=[[0.0] for _ in groups], weights=[accuracy_weight])
    b.reward_names = ["accuracy"]
    b.completions = [f"#### {a}" if a is not None else "no answer" for a in answers]
    b.records = [{"question": f"q{g}", "answer": label} for g in groups]
    return b


def stage_ctx(rollout, step=1):
    policy = torch.nn.Linear(1, 1)
    return SimpleNamespace(
        policy=policy, tokenizer=SimpleNamespace(chat_template=None), rollout=rollout, step=step, answer_format="hash"
    )


def fake_stage(n_peers=1, **kwargs):
    stage = CollectiveVote(peers=["tiny"] * n_peers, **kwargs)
    stage._models = [(object(), SimpleNamespace(chat_template=None)) for _ in range(n_peers)]  # no loading
    return stage


def test_stage_appends_the_vote_reward_and_logs_the_collective():
    # group 0 (prompt p0): policy 7,7,7,9 vs peer 9,9,9,9 -> label 9 (hidden label 9): the peer overrules the policy
    # group 1 (prompt p1): policy 5,5,-,- (SC 1/2) vs peer 5,5,5,6 (SC 3/4) -> label 5 (hidden label 9: wrong)
    b = stage_batch(["7", "7", "7", "9", "5", "5", None, None], [0, 0, 0, 0, 1, 1, 1, 1])
    rollout = FakeRollout({"p0": ["#### 9"] * 4, "p1": ["#### 5", "#### 5", "#### 5", "#### 6"]})
    fake_stage()(b, stage_ctx(rollout))
    assert b.reward_names == ["accuracy", "rlccf"]
    assert b.term("rlccf").tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert b.reward.tolist() == b.term("rlccf").tolist()  # accuracy at weight 0
    s = b.stats
    assert s["rlccf/policy_sc_mean"] == pytest.approx((0.75 + 0.5) / 2)
    assert s["rlccf/peer_sc_mean"] == pytest.approx((1.0 + 0.75) / 2)
    assert s["rlccf/collective_consistency"] == pytest.approx((5 / 8 + 5 / 8) / 2)
    assert s["rlccf/policy_label_agreement"] == 0.5  # p0's label is not the policy's majority, p1's is
    assert s["rlccf/label_accuracy"] == 0.5 and s["rlccf/no_label_frac"] == 0.0
    # one call per peer: each prompt once, the group size's samples, never the policy's shadow
    assert rollout.calls == [(["p0", "p1"], 4, False)]


def test_peer_samples_are_cached_for_the_step_only():
    rollout = FakeRollout({"p0": ["#### 1", "#### 1"]})
    stage = fake_stage(samples_per_peer=2)
    ctx = stage_ctx(rollout, step=3)
    stage(stage_batch(["1", "2"], [0, 0]), ctx)
    stage(stage_batch(["1", "2"], [0, 0]), ctx)  # same step: served from the cache
    assert len(rollout.calls) == 1
    stage(stage_batch(["1", "2"], [0, 0]), stage_ctx(rollout, step=4))
    assert len(rollout.calls) == 2 and set(k[0] for k in stage._cache) == {4}


def test_no_answer_anywhere_gives_no_label():
    b = stage_batch([None, None], [0, 0])
    fake_stage(samples_per_peer=1)(b, stage_ctx(FakeRollout({"p0": ["nothing"]})))
    assert b.term("rlccf").tolist() == [0.0, 0.0]
    assert b.stats["rlccf/no_label_frac"] == 1.0 and math.isnan(b.stats["rlccf/label_accuracy"])


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="CollectiveVote.peers is empty"):
        CollectiveVote(peers=[])
    with pytest.raises(ValueError, match="CollectiveVote.peers is empty"):
        CollectiveVote()
    with pytest.raises(ValueError, match=r"peers\[0\]='no_such_model'"):
        CollectiveVote(peers=["no_such_model"])
    with pytest.raises(ValueError, match="samples_per_peer"):
        CollectiveVote(peers=["tiny"], samples_per_peer=0)
    with pytest.raises(ValueError, match="label_term"):  # a trained ground-truth term
        fake_stage()(stage_batch(["1"], [0], accuracy_weight=1.0), stage_ctx(FakeRollout({"p0": ["1"]})))
    with pytest.raises(RuntimeError, match="rollout=hf"):
        fake_stage()(stage_batch(["1"], [0]), stage_ctx(SimpleNamespace(generate=None)))


def test_peer_configs_and_seeds():
    assert peer_model_config({"source": "tiny", "name": "t", "peft": {"r": 8}}, "k") == {"source": "tiny", "name": "t"}
    assert peer_model_config("tiny", "k")["source"] == "tiny"  # a conf/model entry by name
    with pytest.raises(ValueError, match="source"):
        peer_model_config({"name": "x"}, "k")
    seeds = {peer_seed(0, s, k) for s in (1, 2) for k in (0, 1)} | {peer_seed(1, 1, 0)}
    assert len(seeds) == 5


def test_peer_sampling_is_deterministic_in_seed_and_step(tiny):
    from rlexp.rollout.hf import HFRollout

    rollout = HFRollout(max_new_tokens=6, engine="loop", decode_graph=None)
    prompts = [
        tiny.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in ("What is 2 + 3?", "What is 7 * 6?")
    ]

    def draw(step, seed=0):
        stage = CollectiveVote(peers=["tiny"], seed=seed)
        stage._models = [(tiny.model, tiny.tokenizer)]
        ctx = SimpleNamespace(policy=tiny.model, tokenizer=tiny.tokenizer, rollout=rollout, step=step)
        return stage.sample_peers(prompts, 3, ctx)[0]

    a = draw(1)
    assert a == draw(1) and len(a[prompts[0]]) == 3
    assert a != draw(2) and a != draw(1, seed=1)


def digit_answer(text, fmt="hash", fallback_last_number=False):
    """The tiny model states no answers: its completion's letter count mod 3 stands in for one (none if empty)."""
    letters = sum(c.isalpha() for c in text)
    return str(letters % 3) if letters else None


def test_rlccf_trains_two_steps_on_the_tiny_model(tiny_cfg, monkeypatch):
    monkeypatch.setattr(collective, "extract_answer", digit_answer)
    cfg = tiny_cfg(*FAST, "algorithm=rlccf", "reward=label_free", "trainer.num_generations=4")
    result = run(cfg)
    m = result.metrics
    assert result.last_step == 2
    assert 0.0 < m["rlccf/policy_sc_mean"] <= 1.0 and 0.0 < m["rlccf/peer_sc_mean"] <= 1.0
    assert 0.0 < m["rlccf/collective_consistency"] <= 1.0 and 0.0 <= m["rlccf/policy_label_agreement"] <= 1.0
    assert m["reward/accuracy/mean"] == 0.0 and "reward/rlccf/mean" in m  # trained on the vote, never the label
    steps = [json.loads(line) for line in open(Path(cfg.trainer.run_dir) / "metrics.jsonl")]
    first = steps[0]
    assert 0.0 < first["reward/rlccf/mean"] < 1.0 and first["advantage/abs_mean"] > 0  # a learning signal at step 1


def test_rlccf_config_refuses_an_empty_peer_list(tiny_cfg):
    from rlexp.config.schema import ConfigError

    with pytest.raises((ConfigError, ValueError), match="peers"):
        run(tiny_cfg(*FAST, "algorithm=rlccf", "reward=label_free", "algorithm.group_stages.0.peers=[]"))
