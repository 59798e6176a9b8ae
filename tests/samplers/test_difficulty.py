"""Per-prompt pass-rate history (rlexp/samplers/difficulty.py) and the step feedback it reads."""

import math

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.samplers.difficulty import PassRateHistory
from rlexp.samplers.feedback import GroupFeedback, mean_abs_advantage


def _feedback(ids, rates):
    return GroupFeedback([{"id": i} for i in ids], rates, [r == 1.0 for r in rates])


def test_history_means_window_and_metrics_by_hand():
    h = PassRateHistory(window=2)
    h.observe(_feedback(["p", "q"], [0.0, 0.5]))
    m = h.metrics()
    assert m["sampler/batch_new_prompts"] == 2 and "sampler/batch_prior_pass_rate" not in m
    h.observe(_feedback(["p", "r"], [1.0, 1.0]))  # p: [0, 1] → 0.5; q 0.5; r 1.0
    m = h.metrics()
    assert m["sampler/batch_new_prompts"] == 1 and m["sampler/batch_prior_pass_rate"] == 0.0  # p stood at 0 before
    assert m["sampler/tracked_prompts"] == 3
    assert m["sampler/pass_rate_mean"] == (0.5 + 0.5 + 1.0) / 3
    assert m["sampler/solved_share"] == 1 / 3 and m["sampler/unsolved_share"] == 0.0
    h.observe(_feedback(["p"], [1.0]))  # the window keeps [1, 1]
    assert h.pass_rate("p") == 1.0
    h.observe(_feedback(["s"], [math.nan]))  # no accuracy term: not tracked
    assert h.pass_rate("s") is None


def test_state_round_trip():
    h = PassRateHistory(window=3)
    h.observe(_feedback(["p"], [0.25]))
    g = PassRateHistory(window=3)
    g.load_state_dict(h.state_dict())
    assert g.pass_rate("p") == 0.25


def _batch(acc, groups, adv):
    n = len(acc)
    return RolloutBatch(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1),
        completion_ids=torch.zeros(n, 2, dtype=torch.long),
        completion_mask=torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]][:n]),
        sampling_logprobs=torch.zeros(n, 2),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.tensor(groups),
        prompts=["p"] * n,
        completions=["c"] * n,
        records=[{"id": f"r{g}"} for g in groups],
        rewards=torch.tensor(acc)[:, None],
        reward_names=["accuracy"],
        advantages=adv,
    )


def test_feedback_pass_rates_and_mean_abs_advantage_by_hand():
    b = _batch([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    f = GroupFeedback.from_batch(b, "accuracy")
    assert [r["id"] for r in f.records] == ["r0", "r1"]
    assert f.pass_rate == [0.5, 1.0] and f.all_correct == [False, True]
    assert mean_abs_advantage(b, torch.tensor([0, 1])) == 0.5
    # token-level advantages: row 0 mean |A| over its 2 tokens (0.2 + 0.4) / 2 = 0.3, row 1 over its 1 token 1.0
    b.advantages = torch.tensor([[0.2, -0.4], [-1.0, 9.0], [0.0, 0.0], [0.0, 0.0]])
    assert abs(mean_abs_advantage(b, torch.tensor([0, 1])) - 0.65) < 1e-6
    assert math.isnan(GroupFeedback.from_batch(b, "missing").pass_rate[0])
