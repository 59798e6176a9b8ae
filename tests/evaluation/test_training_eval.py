"""Evaluation inside training: benchmarks every trainer.eval_every steps (logged with the step) and
the per-step consistency rates when switched on (tiny model)."""

import json

import pytest
from hydra.utils import instantiate

from rlexp.evaluation.sources import ReasoningGymSource
from rlexp.runs.training import run
from tests.conftest import compose_train


def rows(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long  # ~10 s: kept out of the default suite (its 10-minute budget)
def test_eval_every_logs_benchmark_metrics_at_those_steps(tiny_cfg, tmp_path):
    cfg = tiny_cfg(
        "trainer.max_steps=3",
        "trainer.eval_every=2",
        "+benchmark=rg_basic_arithmetic",
        "eval.n=2",
        "eval.limit=3",
        "eval.size=0",
        "trainer.eval_at_start=false",
    )
    result = run(cfg)
    logged = rows(tmp_path / "run")
    key = "eval/rg_basic_arithmetic/pass_at_2"
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert [key in r for r in logged] == [False, True, True]  # every 2 steps, and at the last step
    assert "eval/rg_basic_arithmetic/maj_at_2" in logged[1] and "eval/rg_basic_arithmetic/length/mean" in logged[1]
    assert key in result.eval_metrics
    for step in (2, 3):
        problems = [
            json.loads(l)
            for l in (tmp_path / "run" / "eval" / f"step_{step:06d}" / "rg_basic_arithmetic.jsonl")
            .read_text()
            .splitlines()
        ]
        assert len(problems) == 3 and all(len(p["samples"]) == 2 for p in problems)


@pytest.mark.long  # ~10 s: kept out of the default suite (its 10-minute budget)
def test_consistency_rate_is_a_per_step_training_metric(tiny_cfg, tmp_path):
    run(tiny_cfg("consistency.enabled=true", "consistency.max_new_tokens=4"))
    for r in rows(tmp_path / "run"):
        for key in (
            "consistency/rederive_rate",
            "consistency/likelihood_rate",
            "consistency/no_answer_frac",
            "consistency/measured",
            "time/consistency_s",
        ):
            assert key in r, key
        assert r["consistency/measured"] == 8  # prompts_per_step x num_generations
        assert 0 <= r["consistency/rederive_rate"] <= 1 - r["consistency/no_answer_frac"] + 1e-9


def test_consistency_is_off_by_default(tiny_cfg, tmp_path):
    run(tiny_cfg("trainer.max_steps=1"))
    assert not any(k.startswith("consistency/") for k in rows(tmp_path / "run")[0])


def test_offline_benchmarks_never_overlap_training_data(tmp_path):
    """The held-out seed of rg_basic_arithmetic collides with seed-0 training data (small answer space),
    and the exclusion removes every collision."""
    cfg = compose_train(["model=tiny", "tracker=none", "trainer.seed=0"], tmp_path / "run")
    train = instantiate(cfg.dataset)  # basic_arithmetic, default options and sizes, seed 0
    train_q = {r["question"] for r in [*train.train, *train.eval]}
    opts = cfg.dataset.options  # a config node with a list (operators): the source takes plain values from it
    raw = ReasoningGymSource("basic_arithmetic", size=100, options=opts)()
    assert sum(r["question"] in train_q for r in raw) > 0
    held_out = ReasoningGymSource("basic_arithmetic", size=100, options=opts, exclude_seeds=[0], exclude_size=5100)()
    assert len(held_out) == 100 and not any(r["question"] in train_q for r in held_out)


def test_reasoning_gym_items_of_a_seed_are_a_fixed_sequence():
    """The exclusion relies on it: the first k items under a seed do not depend on the dataset size."""
    from rlexp.data.reasoning_gym_compat import import_reasoning_gym

    rg = import_reasoning_gym()

    for name, opts in [
        ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
        ("chain_sum", {}),
        ("gsm_symbolic", {}),
        ("knights_knaves", {"n_people": 2}),
        ("countdown", {"min_numbers": 3, "max_numbers": 4}),
    ]:
        small = [e["question"] for e in rg.create_dataset(name, size=5, seed=3, **opts)]
        large = [e["question"] for e in rg.create_dataset(name, size=12, seed=3, **opts)]
        assert large[:5] == small, name


def test_shuffle_rate_per_step_on_the_multiple_choice_view(tiny_cfg, tmp_path):
    run(
        tiny_cfg(
            "view=multiple_choice",
            "prompt=tag",
            "consistency.enabled=true",
            "consistency.shuffle=true",
            "consistency.rederive=false",
            "consistency.likelihood=false",
            "consistency.max_new_tokens=4",
        )
    )
    for r in rows(tmp_path / "run"):
        assert r["consistency/shuffle_measured"] == 8 and 0.0 <= r["consistency/shuffle_rate"] <= 1.0
