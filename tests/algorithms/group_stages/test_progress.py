"""SPA-RL's progress attribution (rlexp/algorithms/group_stages/progress.py): the turn ends, the grounding signal, the
estimator's loss and the turn rewards on given numbers (a stand-in trunk whose hidden state is the token id), the
online fit, and the turn-end states of a padded batch against unpadded forwards of a tiny random Llama."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.turn_level import turn_level
from rlexp.algorithms.group_stages.progress import (
    ProgressAttribution,
    attribution_loss,
    grounding,
    turn_end_states,
    turn_ends,
)
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import POLICY_TOKENS, TURN_REWARDS
from tests.algorithms.batches import tiny_policy


def test_turn_ends_are_the_last_tokens_of_the_policy_runs():
    policy = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]])
    assert turn_ends(policy, mask) == [[1, 6], [2]]


def test_grounding_reads_each_turns_own_info():
    infos = [{"invalid_commands": 0}, {"invalid_commands": 1}, {"tool_errors": 0, "malformed_calls": 0}]
    # turn 4 has no info (cut at the token limit, never answered)
    assert grounding({"turn_infos": infos}, 4) == [1.0, 0.0, 1.0, 0.0]
    assert grounding({"turn_infos": [{"tool_errors": 2}, {"malformed_calls": 1}, {}]}, 3) == [0.0, 0.0, 1.0]


def test_the_estimators_loss_is_the_mse_of_the_summed_contributions():
    # episode 0: 0.2 + 0.3 + 0.5 = 1.0 against 1.0 -> 0; episode 1: −0.1 against 0.5 -> 0.36; mean 0.18
    c = torch.tensor([0.2, 0.3, 0.5, -0.1])
    owner = torch.tensor([0, 0, 0, 1])
    assert float(attribution_loss(c, owner, torch.tensor([1.0, 0.5]))) == pytest.approx(0.18)


class IdTrunk(torch.nn.Module):
    """A stand-in trunk: the hidden state at each position is (token id, 0)."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        h = torch.stack([input_ids.float(), torch.zeros_like(input_ids, dtype=torch.float)], -1)
        return SimpleNamespace(last_hidden_state=h)


def game_batch():
    # row 0: turns "3 7" and "4 2" around an observation "9 9" (policy tokens 1, 1, 0, 0, 1, 1); row 1: one turn "5 1"
    comp = torch.tensor([[3, 7, 9, 9, 4, 2], [5, 1, 0, 0, 0, 0]])
    cmask = torch.tensor([[1] * 6, [1, 1, 0, 0, 0, 0]])
    batch = RolloutBatch(
        prompt_ids=torch.ones(2, 2, dtype=torch.long),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=comp,
        completion_mask=cmask,
        sampling_logprobs=torch.zeros(2, 6),
        truncated=torch.zeros(2, dtype=torch.bool),
        group_ids=torch.tensor([0, 0]),
        prompts=["p", "p"],
        completions=["3 7\n4 2", "5 1"],
        records=[
            {"episode": {"turn_infos": [{"invalid_commands": 1}, {"invalid_commands": 0}]}},
            {"episode": {"turn_infos": [{}]}},
        ],
    )
    batch.extras[POLICY_TOKENS] = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.float)
    batch.rewards, batch.reward_names = torch.tensor([[1.0], [0.0]]), ["r"]
    batch.reward_weights, batch.reward = torch.ones(1), torch.tensor([1.0, 0.0])
    return batch


def test_turn_rewards_are_contributions_plus_grounding():
    # head: ĉ = w · h / √2 with w = (0.1·√2, 0): ĉ = 0.1 × the turn's last token id -> row 0: 0.7, 0.2; row 1: 0.1
    # g: row 0 [0 (invalid), 1], row 1 [1]; α = 1, β = 0.5, outcome_weight 0.5 on the last turn (R = 1, 0):
    #   row 0: [0.7 + 0, 0.2 + 0.5 + 0.5] = [0.7, 1.2]; row 1: [0.1 + 0.5 + 0] = [0.6]
    # the estimator's loss: sums 0.9 and 0.1 against 1 and 0 -> (0.01 + 0.01) / 2 = 0.01
    stage = ProgressAttribution(outcome_weight=0.5)
    stage.build(2, "cpu")
    with torch.no_grad():
        stage.head.weight.copy_(torch.tensor([[0.1 * math.sqrt(2), 0.0]]))
    stage.fit = lambda: None  # the numbers of a given head (the online fit is tested below)
    batch = stage(game_batch(), SimpleNamespace(policy=SimpleNamespace(base_model=IdTrunk())))
    r = batch.extras[TURN_REWARDS]
    assert r[0].tolist() == pytest.approx([0.7, 1.2], rel=1e-5)
    assert r[1, 0].item() == pytest.approx(0.6, rel=1e-5) and math.isnan(r[1, 1].item())
    s = batch.stats
    assert s["spa/estimator_loss"] == pytest.approx(0.01, rel=1e-4) == s["spa/estimator_loss_before"]
    assert s["spa/contribution_mean"] == pytest.approx(1 / 3, rel=1e-5)
    var = ((0.7 - 1 / 3) ** 2 + (0.2 - 1 / 3) ** 2 + (0.1 - 1 / 3) ** 2) / 3  # population variance of the three
    assert s["spa/contribution_std"] == pytest.approx(math.sqrt(var), rel=1e-4)
    assert s["spa/contribution_sum_mean"] == pytest.approx(0.5) and s["spa/grounding_mean"] == pytest.approx(2 / 3)
    assert s["spa/turn_reward_mean"] == pytest.approx((0.7 + 1.2 + 0.6) / 3)
    # the turn-level advantage reads them: three turn rewards, one per policy-token run
    assert turn_level(batch).shape == (2, 6)


def test_the_online_fit_moves_the_sums_toward_the_outcomes():
    # zero-initialised head: sums 0 against outcomes 1, 0 -> loss before 0.5; Adam steps on the buffer lower it
    stage = ProgressAttribution(updates=50, lr=0.05)
    ctx = SimpleNamespace(policy=SimpleNamespace(base_model=IdTrunk()))
    batch = stage(game_batch(), ctx)
    s = batch.stats
    assert s["spa/estimator_loss_before"] == pytest.approx(0.5)
    assert s["spa/estimator_loss"] < 0.05 and s["spa/buffer_episodes"] == 2.0
    assert s["spa/contribution_std"] > 0
    saved = stage.state_dict()
    again = ProgressAttribution()
    again.load_state_dict(saved)  # kept until the first step knows the states' width
    again.build(2, "cpu")
    assert torch.equal(again.head.weight, stage.head.weight)


class Rows(SimpleNamespace):
    def __len__(self):
        return len(self.prompt_ids)


def test_turn_end_states_of_a_padded_batch_match_unpadded_forwards():
    model = tiny_policy().eval()
    # prompts of 2 and 4 tokens (left-padded), completions of 5 and 3 tokens (right-padded)
    prompts = [[5, 6], [7, 8, 9, 10]]
    comps = [[11, 12, 13, 14, 15], [16, 17, 18]]
    p_ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    p_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    c_ids = torch.tensor([[11, 12, 13, 14, 15], [16, 17, 18, 0, 0]])
    c_mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    batch = Rows(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids, completion_mask=c_mask)
    ends = [[1, 4], [2]]
    states = turn_end_states(model, batch, ends, batch_size=2)
    for i in range(2):
        with torch.no_grad():
            full = model.model(input_ids=torch.tensor([prompts[i] + comps[i]])).last_hidden_state[0]
        want = full[[len(prompts[i]) + e for e in ends[i]]]
        assert torch.allclose(states[i], want, atol=1e-5)
