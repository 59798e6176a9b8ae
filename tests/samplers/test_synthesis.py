"""Weakness-driven synthesis (rlexp/samplers/synthesis.py, SwS offline) and the generator it uses
(rlexp/data/synthesis.py)."""

import pytest

from rlexp.config.schema import ConfigError
from rlexp.data.synthesis import generate, generator_tasks
from rlexp.samplers.feedback import GroupFeedback
from rlexp.samplers.synthesis import WeaknessSynthesis, proportional

MIX = {
    "_target_": "rlexp.data.hub.reasoning_gym_tasks",
    "tasks": {"chain_sum": {"weight": 1, "options": {"min_terms": 2, "max_terms": 2}}, "gcd": 1},
}


def _records(n=6):
    return [
        {"id": f"{t}-{i}", "question": f"{t} q{i}", "answer": "0", "metadata": {"source_dataset": t}}
        for t in ("chain_sum", "gcd")
        for i in range(n)
    ]


def test_proportional_split_by_hand():
    # 16 over 3:1 → exact 12 and 4
    assert proportional({"a": 3, "b": 1}, 16) == {"a": 12, "b": 4}
    # 5 over 1:1:1 → 1.667 each: floors 1, 1, 1; the 2 left go to the largest remainders, ties by key: a, b
    assert proportional({"a": 1, "b": 1, "c": 1}, 5) == {"a": 2, "b": 2, "c": 1}
    assert proportional({}, 5) == {}


def test_generator_tasks_reads_dataset_configs():
    assert generator_tasks(MIX) == {"chain_sum": {"min_terms": 2, "max_terms": 2}, "gcd": {}}
    one = {"_target_": "rlexp.data.sources.reasoning_gym_task", "name": "basic_arithmetic", "options": {"max_terms": 2}}
    assert generator_tasks(one) == {"basic_arithmetic": {"max_terms": 2}}
    with pytest.raises(ConfigError, match="has none"):
        generator_tasks({"_target_": "rlexp.data.sources.gsm8k", "name": "gsm8k"})


def test_generate_is_seeded_and_in_the_record_schema():
    a, b = generate("chain_sum", {"max_terms": 2}, 3, 5, "x"), generate("chain_sum", {"max_terms": 2}, 3, 5, "x")
    assert [r["question"] for r in a] == [r["question"] for r in b]
    assert a[0]["id"] == "x-0" and a[0]["scorer"] == "reasoning_gym" and a[0]["metadata"]["source_dataset"]


def test_weak_tasks_get_new_problems_in_proportion_and_batches_draw_them():
    s = WeaknessSynthesis(_records(), batch_size=4, seed=0, dataset=MIX, every=1, per_round=4, share=0.5)
    recs = _records()
    # three chain_sum prompts and one gcd prompt all wrong, one gcd prompt solved: weak 3 : 1
    s.observe(GroupFeedback([recs[0], recs[1], recs[2], recs[6], recs[7]], [0.0, 0.0, 0.0, 0.0, 1.0]))
    assert s.rounds == 1 and s.synthesised == 4 and len(s.weak_seen) == 4
    tasks = sorted(r["metadata"]["source_dataset"] for r in s.pool)
    assert tasks == ["chain_sum", "chain_sum", "chain_sum", "gcd"]
    batch = s.next_batch()  # half of 4 from the pool, the rest from the shuffle
    assert len(batch) == 4 and sum("synthesised_round" in r["metadata"] for r in batch) == 2
    assert s.metrics()["sws/drawn"] == 2 and s.metrics()["sws/pool"] == 2
    # a prompt counted once is not counted again
    s.observe(GroupFeedback([recs[0]], [0.0]))
    assert s.metrics()["sws/weak_prompts"] == 4


def test_state_round_trip_keeps_the_pool():
    s = WeaknessSynthesis(_records(), batch_size=4, seed=0, dataset=MIX, every=1, per_round=2)
    s.observe(GroupFeedback(_records()[:1], [0.0]))
    t = WeaknessSynthesis(_records(), batch_size=4, seed=0, dataset=MIX, every=1, per_round=2)
    t.load_state_dict(s.state_dict())
    assert [r["question"] for r in t.pool] == [r["question"] for r in s.pool] and t.rounds == 1


def test_bad_settings_name_the_key():
    with pytest.raises(ConfigError, match="sampler.share"):
        WeaknessSynthesis(_records(), batch_size=4, seed=0, dataset=MIX, share=0.0)


@pytest.mark.long  # a tiny training run: the default suite keeps to ten minutes
def test_a_run_synthesises_from_its_failures(tiny_cfg, tmp_path):
    import json

    from rlexp.runs.training import run

    overrides = [
        "sampler=sws",
        "dataset=reasoning_gym",
        "dataset.tasks={chain_sum: 1, basic_arithmetic: 1}",
        "dataset.train_size=40",
        "dataset.eval_size=4",
        "sampler.every=1",
        "sampler.share=0.5",
        "trainer.max_steps=2",
        "trainer.max_new_tokens=4",
        "trainer.autocast=off",
    ]
    run(tiny_cfg(*overrides))  # the tiny random model answers nothing right: every prompt is weak
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "sws/synthesised" in r]
    assert steps[0]["sws/synthesised"] > 0 and steps[-1]["sws/drawn"] == 1  # step 2 drew half of its 2 prompts
