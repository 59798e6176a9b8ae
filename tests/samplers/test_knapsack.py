"""Knapsack RL's allocation (rlexp/samplers/knapsack.py): the value function, allocations worked out by hand, the
batch it returns (a prompt's units adjacent), pooled feedback and resume; then a three-step tiny run."""

import math

import pytest

from rlexp.config.schema import ConfigError
from rlexp.samplers.feedback import GroupFeedback
from rlexp.samplers.knapsack import UNITS_KEY, KnapsackSampler, allocate, rollouts_needed, task_value
from tests.algorithms.varying_reward import VowelShare


def test_task_value_by_hand():
    # p = 0.5, N = 4: (1 − 1/16 − 1/16) · 0.5 · 0.25 = 0.875 · 0.125 = 0.109375
    assert task_value(0.5, 4) == pytest.approx(0.109375)
    # p = 0.25, N = 8: (1 − 0.25^8 − 0.75^8) · 0.25 · 0.75² = (1 − 0.0000153 − 0.1001129) · 0.140625 = 0.1265445
    assert task_value(0.25, 8) == pytest.approx(0.1265445, abs=1e-7)
    # solved, never solved, no rollouts: worth nothing
    assert task_value(1.0, 8) == task_value(0.0, 8) == task_value(0.5, 0) == 0.0
    # InfoGain p(1 − p)² favours the harder side: p = 0.25 is worth more than p = 0.75 at the same N
    assert task_value(0.25, 8) > task_value(0.75, 8)
    # rollouts for both outcomes with probability 0.9: ln 0.1 / ln 0.5 = 3.32; ln 0.1 / ln 0.9 = 21.85
    assert rollouts_needed(0.5, 0.9) == pytest.approx(math.log(0.1) / math.log(0.5))
    assert rollouts_needed(0.1, 0.9) == rollouts_needed(0.9, 0.9) == pytest.approx(21.854, abs=1e-3)


def test_knapsack_allocation_by_hand():
    # G = 8, budget 6 units over [unseen, 0, 0.1, 0.5, 1, 0.9]: unseen gets 1, p ∈ {0, 1} get 0 -> 5 units for the
    # three uncertain prompts, each at least 1. Their α-needs: ⌈21.85/8⌉ = 3, ⌈3.32/8⌉ = 1, 3: 7 > 5, so no fallback
    # and the DP spends all 5. The two extra units by value (I = p(1 − p)²: 0.081, 0.125, 0.009):
    #   p = 0.1: V(8) = 0.5695·0.081 = 0.04613, V(16) = 0.8147·0.081 = 0.06599, V(24) = 0.9202·0.081 = 0.07454
    #   p = 0.5: V(8) = 0.12402, V(16) = 0.12500;  p = 0.9: V(8) = 0.00513, V(16) = 0.00733
    # best: both to p = 0.1 (+0.01986 + 0.00855) over any other (+0.0022 at most for p = 0.9, +0.001 for 0.5)
    a = allocate([None, 0.0, 0.1, 0.5, 1.0, 0.9], budget=6, group_size=8)
    assert a.units == [1, 0, 3, 1, 0, 1]
    assert a.fallback_units == 0 and a.needed == [0, 0, 3, 1, 0, 3]
    assert a.value == pytest.approx(task_value(0.1, 24) + task_value(0.5, 8) + task_value(0.9, 8))
    assert allocate([None, 0.0, 0.1, 0.5, 1.0, 0.9], 6, 8, solver="greedy").units == a.units


def test_fallback_sends_the_spare_units_to_never_solved_prompts():
    # G = 8, [1, 0, 0.5, 0.5], 4 units: the two p = 0.5 prompts need ⌈3.32/8⌉ = 1 each, 2 < 4 spare for the
    # knapsack -> each gets 1 and the 2 left go to the p = 0 prompt (the paper's large budgets for hard prompts)
    a = allocate([1.0, 0.0, 0.5, 0.5], budget=4, group_size=8)
    assert a.units == [0, 2, 1, 1] and a.fallback_units == 2
    # without the fallback the knapsack takes everything (p = 0 is worth 0): 2 units each
    assert allocate([1.0, 0.0, 0.5, 0.5], 4, 8, fallback=False).units == [0, 0, 2, 2]
    # no uncertain prompt, no p = 0: the spare goes round-robin to the others (here back to the solved ones)
    assert allocate([1.0, 1.0, None], 3, 8).units == [1, 1, 1]
    # max_units caps the fallback too: [0, 1, 1, 1] at 4 units, cap 2 -> the p = 0 prompt 2, the rest round-robin
    assert allocate([0.0, 1.0, 1.0, 1.0], 4, 8, max_units=2).units == [2, 1, 1, 0]


def test_dp_and_greedy_agree_where_the_knapsack_decides():
    # G = 4, [0.5, 0.25] in 4 units, each 1..4: V(0.5)·(4, 8, 12) = .109375, .124023, .124939;
    # V(0.25)·(4, 8, 12) = .095581, .126544, .136171: (2, 2) = .250568 beats (1, 3) = .245546 and (3, 1) = .220520
    assert allocate([0.5, 0.25], 4, 4).units == [2, 2]
    rates = [0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95, 0.3]
    for g in (2, 4, 8):
        dp = allocate(rates, 8, g, fallback=False)
        greedy = allocate(rates, 8, g, fallback=False, solver="greedy")
        assert dp.value == pytest.approx(greedy.value) and sum(dp.units) == 8


def _records(n=6):
    return [{"id": f"r{i}", "question": f"q{i}"} for i in range(n)]


def _observe(s, batch, rate_of):
    """Feed back one group per returned record (one per unit), its pass rate rate_of[id]."""
    s.observe(GroupFeedback(batch, [rate_of[r["id"]] for r in batch], [rate_of[r["id"]] == 1.0 for r in batch]))


def test_batch_repeats_a_prompt_per_unit_adjacent_and_pools_its_feedback():
    s = KnapsackSampler(_records(4), batch_size=4, seed=0, group_size=8)
    first = s.next_batch()  # nothing seen: one unit each
    assert len({r["id"] for r in first}) == 4 and all(r[UNITS_KEY] == 1 for r in first)
    assert s.metrics()["knapsack/units_max"] == 1.0
    rates = dict(zip([r["id"] for r in first], [1.0, 0.0, 0.5, 0.5]))
    _observe(s, first, rates)
    second = s.next_batch()  # epoch 2, the same four prompts: [1, 0, .5, .5] -> [0, 2, 1, 1] (the fallback above)
    ids = [r["id"] for r in second]
    assert len(second) == 4
    solved = next(k for k, v in rates.items() if v == 1.0)
    hard = next(k for k, v in rates.items() if v == 0.0)
    assert solved not in ids and ids.count(hard) == 2
    i = ids.index(hard)
    assert ids[i + 1] == hard and second[i][UNITS_KEY] == 2  # adjacent copies
    m = s.metrics()
    assert m["knapsack/units_max"] == 2.0 and m["knapsack/prompts"] == 3.0 and m["knapsack/idle_prompts"] == 1.0
    assert m["knapsack/fallback_units"] == 2.0 and m["knapsack/uncertain_prompts"] == 2.0
    assert m["knapsack/value"] == pytest.approx(2 * task_value(0.5, 8))
    # the hard prompt's two groups (rates 0.25 and 0.75) become one pass rate, 0.5, with window 1
    _observe(s, second, {**{k: 0.5 for k in ids}, hard: 0.25})
    s.observe(GroupFeedback([second[i + 1]], [0.75], [False]))
    assert s.difficulty.pass_rate(hard) == 0.75  # a separate observe is a separate visit
    pooled = KnapsackSampler(_records(4), batch_size=4, seed=0)
    pooled.observe(GroupFeedback([second[i], second[i + 1]], [0.25, 0.75], [False, False]))
    assert pooled.difficulty.pass_rate(hard) == 0.5


def test_resume_allocates_the_same():
    s = KnapsackSampler(_records(6), batch_size=4, seed=3, group_size=4)
    rates = {f"r{i}": [1.0, 0.0, 0.25, 0.5, 0.75, 0.0][i] for i in range(6)}
    for _ in range(3):
        _observe(s, s.next_batch(), rates)
    again = KnapsackSampler(_records(6), batch_size=4, seed=3, group_size=4)
    again.load_state_dict(s.state_dict())
    for _ in range(3):
        a, b = s.next_batch(), again.next_batch()
        assert [r["id"] for r in a] == [r["id"] for r in b]
        _observe(s, a, rates)
        _observe(again, b, rates)


@pytest.mark.parametrize(
    ("setting", "key"),
    [({"min_units": 2}, "sampler.min_units"), ({"max_units": 0}, "sampler.max_units"), ({"alpha": 1.0}, "alpha")],
)
def test_bad_settings_are_refused_naming_the_key(setting, key):
    with pytest.raises(ConfigError, match=key):
        KnapsackSampler(_records(), batch_size=2, seed=0, **setting)


def test_the_experiment_picks_the_method_and_the_sampler(tiny_cfg):
    cfg = tiny_cfg("+experiment=knapsack_rl")
    assert cfg.algorithm.name == "knapsack_grpo" and cfg.sampler._target_.endswith("knapsack.KnapsackSampler")
    assert cfg.sampler.group_size == 4 == cfg.trainer.num_generations  # one unit is the trainer's group
    first = cfg.algorithm.group_stages[0]._target_
    assert first == "rlexp.algorithms.group_stages.budget_groups.merge_allocated_groups"  # first among the stages


class PerPromptReward(VowelShare):
    """Accuracy by the record's |answer| mod 4: 0 always correct, 1 never, else when the completion's vowel share is
    at least 0.4 (the varying reward's, thresholded) — the prompts' pass rates are then 1, 0 and in between."""

    def score(self, sample) -> float:
        kind = abs(int(sample.record["answer"])) % 4
        return 1.0 if kind == 0 else 0.0 if kind == 1 else float(super().score(sample) >= 0.4)


@pytest.mark.long
def test_three_steps_allocate_from_the_second_epoch(tiny_cfg, tmp_path):
    import json

    from rlexp.runs.setup import build
    from rlexp.runs.training import run

    cfg = tiny_cfg(
        "reward=accuracy",
        "reward.terms.accuracy._target_=tests.samplers.test_knapsack.PerPromptReward",
        # the varying reward (tests/algorithms/varying_reward.py) beside it: advantages in every group
        "+reward.terms.vowels._target_=tests.algorithms.varying_reward.VowelShare",
        "+experiment=knapsack_rl",
        "dataset.train_size=4",  # one step an epoch: steps 2 and 3 allocate from the pass rates
        "trainer.prompts_per_step=4",
        "trainer.max_steps=3",
        "trainer.max_new_tokens=6",
        "trainer.autocast=off",
    )
    answers = sorted(abs(int(r["answer"])) % 4 for r in build(cfg.dataset, "dataset").train)
    assert 0 in answers and 1 in answers, answers  # one always-solved and one never-solved prompt
    run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if "knapsack/units_max" in r}
    assert steps[1]["knapsack/units_max"] == 1.0 and steps[1]["knapsack/merged_groups"] == 0.0
    # from step 2 a solved prompt sits out and its unit goes elsewhere: some prompt gets 2+ groups, merged into one
    for step in (2, 3):
        m = steps[step]
        assert m["knapsack/units_max"] >= 2.0 and m["knapsack/prompts"] < 4.0, m
        assert m["knapsack/merged_groups"] >= 1.0 and m["batch/completions"] == 16.0
        assert m["knapsack/group_rows_max"] >= 8.0 and 0.0 <= m["knapsack/zero_gradient_groups"] <= 1.0
        assert math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
