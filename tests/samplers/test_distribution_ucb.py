"""DUMP's scheduler (rlexp/samplers/distribution_ucb.py): UCB scores, softmax probabilities and draws, by hand."""

import math

import pytest

from rlexp.config.schema import ConfigError
from rlexp.data.distributions import distribution_of
from rlexp.samplers.distribution_ucb import DistributionUCB
from tests.algorithms.varying_reward import VARYING


def _mixture(n_per=6, names=("a", "b")):
    return [
        {"id": f"{d}-{i}", "question": f"{d}{i}", "metadata": {"source_dataset": d}}
        for d in names
        for i in range(n_per)
    ]


def test_distribution_of_reads_metadata_and_joins_keys():
    r = {"metadata": {"source_dataset": "chain_sum", "difficulty": {"num_terms": [2, 3], "digits": 1}}}
    assert distribution_of(r) == "chain_sum"
    assert distribution_of(r, "difficulty") == "digits=1,num_terms=2-3"
    assert distribution_of(r, ["source_dataset", "difficulty"]) == "chain_sum/digits=1,num_terms=2-3"
    assert distribution_of({"question": "q"}) == "all"


def test_unseen_distributions_come_first_then_ucb_by_hand():
    s = DistributionUCB(_mixture(), batch_size=2, seed=0)
    assert s.probabilities() == {"a": 0.5, "b": 0.5}  # both unseen: uniform over them
    s.drawn = {"a": 3, "b": 1}
    s.observe_advantages([{"metadata": {"source_dataset": "a"}}] * 2, [0.2, 0.4])  # L_a = 0.3, L_b = 0 (no data)
    # N = 4: UCB_a = 0.3 + sqrt(2 ln 4 / 3) = 0.3 + 0.961 = 1.2613; UCB_b = 0 + sqrt(2 ln 4 / 1) = 1.6651
    sc = s.scores()
    assert sc["a"] == pytest.approx(0.3 + math.sqrt(2 * math.log(4) / 3))
    assert sc["b"] == pytest.approx(math.sqrt(2 * math.log(4)))
    # softmax at τ = 0.1: P(a) = 1 / (1 + exp((1.6651 - 1.2613) / 0.1)) = 1 / (1 + e^4.038) = 0.01733
    p = s.probabilities()
    assert p["a"] == pytest.approx(1 / (1 + math.exp((sc["b"] - sc["a"]) / 0.1)))
    assert p["a"] + p["b"] == pytest.approx(1.0)


def test_learnable_distribution_gets_most_draws():
    s = DistributionUCB(_mixture(20), batch_size=4, seed=1)
    s.drawn = {"a": 40, "b": 40}
    s.observe_advantages([{"metadata": {"source_dataset": "a"}}] * 5, [0.9] * 5)  # b stays at 0: solved or hopeless
    draws = [distribution_of(r) for _ in range(10) for r in s.next_batch()]
    # equal bonuses, L_a − L_b = 0.9: P(a) = 1 / (1 + e^-9) ≈ 0.9999 at first; b's bonus grows as a is drawn
    assert draws.count("a") >= 35
    m = s.metrics()
    assert m["dump/learnability/a"] == pytest.approx(0.9) and m["dump/learnability/b"] == 0.0
    assert m["sampler/drawn/a"] + m["sampler/drawn/b"] == 4


def test_batches_hold_no_record_twice_and_resume_draws_the_same():
    s = DistributionUCB(_mixture(3), batch_size=5, seed=2)
    for _ in range(4):
        batch = s.next_batch()
        assert len({r["id"] for r in batch}) == 5
    state = s.state_dict()
    again = DistributionUCB(_mixture(3), batch_size=5, seed=2)
    again.load_state_dict(state)
    assert [r["id"] for r in again.next_batch()] == [r["id"] for r in s.next_batch()]


def test_a_single_distribution_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="sampler.key"):
        DistributionUCB(_mixture(names=("a",)), batch_size=2, seed=0)


def test_a_run_schedules_a_mixture_and_logs_its_choices(tiny_cfg, tmp_path):
    import json

    from rlexp.runs.training import run

    overrides = [
        "sampler=dump",
        "dataset=reasoning_gym",
        "dataset.tasks={chain_sum: 1, basic_arithmetic: 1}",
        "dataset.train_size=40",
        "dataset.eval_size=4",
        *VARYING,
        "trainer.max_steps=2",
        "trainer.max_new_tokens=4",
        "trainer.autocast=off",
        "eval.size=4",
        "eval.by=source_dataset",
        "trainer.eval_every=2",
    ]
    run(tiny_cfg(*overrides))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "dump/prob/chain_sum" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["sampler/drawn/chain_sum"] + r["sampler/drawn/basic_arithmetic"] == 2  # the tiny config's prompts
        assert r["dump/prob/chain_sum"] + r["dump/prob/basic_arithmetic"] == pytest.approx(1.0)
    assert "sampler/tracked_prompts" in steps[-1]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert evals and any(k.startswith("eval/accuracy/") for k in evals[-1])  # per task of the mixture
    # after the first step's advantages both arms hold learnability data (the varying reward gives |A| > 0)
    assert steps[-1]["dump/learnability/chain_sum"] + steps[-1]["dump/learnability/basic_arithmetic"] > 0


def test_eval_accuracy_by_distribution_by_hand():
    from rlexp.evaluation.greedy import accuracy_by

    records = _mixture(2)  # a-0, a-1, b-0, b-1
    got = accuracy_by(records, [1.0, 0.0, 1.0, 1.0], "source_dataset")
    assert got == {"eval/accuracy/a": 0.5, "eval/accuracy/b": 1.0}
