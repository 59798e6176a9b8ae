"""Dynamic reward weighting (arXiv 2509.11452): hypervolume-guided meta reward and gradient-based weight steps."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.reward_weighting import DynamicRewardWeights, hv_contribution, hypervolume
from tests.algorithms.batches import make_batch, tiny_policy, token_batch


def test_hypervolume_by_hand():
    # one box: (1 − 0.5)·(0.5 − 0) = 0.25
    assert hypervolume([(1.0, 0.5)], (0.5, 0.0)) == pytest.approx(0.25)
    # two boxes [0.5,1]x[0,0.5] (0.25) and [0.5,0.6]x[0,1] (0.1), overlapping in [0.5,0.6]x[0,0.5] (0.05): 0.30
    assert hypervolume([(1.0, 0.5), (0.6, 1.0)], (0.5, 0.0)) == pytest.approx(0.30)
    # 3-D: the unit cube plus the slab [1,2]x[0,0.5]x[0,0.5] (0.25)
    assert hypervolume([(1.0, 1.0, 1.0), (2.0, 0.5, 0.5)], (0.0, 0.0, 0.0)) == pytest.approx(1.25)
    # a point that does not dominate the reference adds nothing; a dominated one neither
    assert hypervolume([(0.4, 2.0)], (0.5, 0.0)) == 0.0
    assert hv_contribution([(1.0, 0.5)], (0.75, 0.25), (0.5, 0.0)) == 0.0
    assert hv_contribution([(1.0, 0.5)], (0.6, 1.0), (0.5, 0.0)) == pytest.approx(0.05)


def test_hypervolume_variant_worked_example():
    """Step 1 sets the reference; then m = 0.5 + 1.5·tanh(c) multiplies the weights of the same step."""
    stage = DynamicRewardWeights(variant="hypervolume")
    b = make_batch(None, [0, 0], terms=[[1.0, 0.0], [0.0, 0.0]])  # point (0.5, 0): the reference
    stage(b)
    assert b.stats["dynamic_weights/meta_reward"] == 1.0 and b.stats["reward_weights/t0"] == 1.0
    assert b.reward.tolist() == pytest.approx([1.0, 0.0])
    b = make_batch(None, [0, 0], terms=[[1.0, 1.0], [1.0, 0.0]])  # point (1, 0.5): c = 0.5·0.5 = 0.25
    stage(b)
    m = 0.5 + 1.5 * math.tanh(0.25)  # 0.867378
    assert b.stats["dynamic_weights/hv_contribution"] == pytest.approx(0.25)
    assert b.stats["dynamic_weights/meta_reward"] == pytest.approx(m) and m == pytest.approx(0.867378, abs=1e-6)
    assert b.stats["reward_weights/t0"] == pytest.approx(m) and b.stats["reward_weights/t1"] == pytest.approx(m)
    assert b.reward.tolist() == pytest.approx([2 * m, m])
    assert b.reward_weights.tolist() == pytest.approx([m, m])
    assert b.stats["dynamic_weights/front_size"] == 1.0
    b = make_batch(None, [0, 0], terms=[[1.0, 0.5], [0.5, 0.0]])  # point (0.75, 0.25): dominated, c = 0, m = 0.5
    stage(b)
    assert b.stats["dynamic_weights/meta_reward"] == pytest.approx(0.5) and b.reward.tolist() == pytest.approx(
        [0.75, 0.25]
    )
    b = make_batch(None, [0, 0], terms=[[0.6, 1.0], [0.6, 1.0]])  # point (0.6, 1.0): c = 0.05
    stage(b)
    assert b.stats["dynamic_weights/meta_reward"] == pytest.approx(0.5 + 1.5 * math.tanh(0.05))
    assert len(stage.front) == 3 and stage.front[2] == pytest.approx([0.6, 1.0])  # (0.75, 0.25) did not join
    again = DynamicRewardWeights(variant="hypervolume")
    again.load_state_dict(stage.state_dict())
    assert again.front == stage.front and again.meta == stage.meta and again.weights == stage.weights


def test_gradient_variant_softmax_step(monkeypatch):
    """Gram G = [[1, .5], [.5, 2]]: influence s = [1.5, 2.5]; w = 2·softmax(log(w/2) + 0.1·s) from w = [1, 1]."""
    stage = DynamicRewardWeights(variant="gradient", step_size=0.1)
    monkeypatch.setattr(stage, "term_gradients", lambda batch, names, ctx: torch.tensor([[1.0, 0.5], [0.5, 2.0]]))
    b = make_batch(None, [0, 0], terms=[[1.0, 0.0], [0.0, 1.0]])
    stage(b)
    e0, e1 = math.exp(0.15), math.exp(0.25)  # 1.161834, 1.284025
    w0, w1 = 2 * e0 / (e0 + e1), 2 * e1 / (e0 + e1)  # 0.950042, 1.049958
    assert (w0, w1) == pytest.approx((0.950042, 1.049958), abs=1e-6)
    assert b.stats["reward_weights/t0"] == pytest.approx(w0) and b.stats["reward_weights/t1"] == pytest.approx(w1)
    assert b.stats["dynamic_weights/influence/t0"] == pytest.approx(1.5)
    assert b.reward.tolist() == pytest.approx([w0, w1])  # the new weights are used at the step that computed them
    stage(make_batch(None, [0, 0], terms=[[1.0, 0.0], [0.0, 1.0]]))  # a second step moves on from there
    a0, a1 = math.log(w0 / 2) + 0.15, math.log(w1 / 2) + 0.25
    assert stage.weights["t1"] == pytest.approx(2 * math.exp(a1) / (math.exp(a0) + math.exp(a1)))


def test_gradient_variant_gram_on_a_tiny_policy():
    """Two terms with the same group-normalised advantage have the same gradient (equal influence: weights stay);
    opposite terms have opposite gradients (Gram rows sum to 0: weights stay); the Gram diagonal is the squared norm
    of the on-policy surrogate's gradient, each clipped to 1."""
    model = tiny_policy()
    ctx = SimpleNamespace(policy=model, rollout=SimpleNamespace(temperature=1.0), settings=None)
    b = token_batch()
    r = torch.tensor([1.0, 0.0, 1.0, 0.5])
    b.rewards, b.reward_names = torch.stack([r, 3 * r], 1), ["a", "b"]  # b = 3a: the same GRPO advantage
    b.reward_weights, b.reward = torch.tensor([1.0, 1.0]), 4 * r
    stage = DynamicRewardWeights(variant="gradient", grad_clip=None)
    gram = stage.term_gradients(b, ["a", "b"], ctx)
    assert torch.allclose(gram, gram[0, 0].expand(2, 2), rtol=1e-5) and float(gram[0, 0]) > 0
    # by hand: the gradient of Σ_i A_i Σ_t log π(token) / (valid tokens), A the GRPO advantage of "a"
    from rlexp.algorithms.advantages.group import normalize_rewards
    from rlexp.core.forward import token_logprobs

    adv = normalize_rewards(r, b.group_ids)
    logp, _ = token_logprobs(
        model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, share_prompts=False
    )
    mask = b.completion_mask.float()
    objective = (adv * (logp * mask).sum(-1)).sum() / mask.sum()
    g = torch.autograd.grad(objective, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    sq = sum(float((x**2).sum()) for x in g if x is not None)
    assert float(gram[0, 0]) == pytest.approx(sq, rel=1e-4)
    stage(b, ctx)
    assert stage.weights["a"] == pytest.approx(1.0) and stage.weights["b"] == pytest.approx(1.0)
    b.rewards = torch.stack([r, -r], 1)
    clipped = DynamicRewardWeights(variant="gradient", grad_clip=1e-3)
    gram = clipped.term_gradients(b, ["a", "b"], ctx)
    assert float(gram[0, 0]) == pytest.approx(1e-6, rel=1e-3) and float(gram[0, 1]) == pytest.approx(-1e-6, rel=1e-3)
    assert gram.sum(1).abs().max() < 1e-9


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match="variant"):
        DynamicRewardWeights(variant="pareto")
    with pytest.raises(ValueError, match="step_size"):
        DynamicRewardWeights(step_size=0.0)
    with pytest.raises(KeyError, match="not reward terms"):
        DynamicRewardWeights(terms=["nope"])(make_batch(None, [0, 0], terms=[[1.0, 0.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="positive starting weights"):
        DynamicRewardWeights(terms=["t0", "t1"])(make_batch(None, [0, 0], terms=[[1.0, 0.0]] * 2, weights=[1.0, 0.0]))


def _two_terms():
    """The test reward (vowel share) beside the format term at weight 0.5: two weighted terms."""
    return [
        "reward=accuracy_format",
        "reward.terms.accuracy._target_=tests.algorithms.varying_reward.VowelShare",
        "reward.terms.format.weight=0.5",
        "trainer.autocast=off",
        "trainer.max_new_tokens=6",
        "trainer.num_generations=4",
    ]


@pytest.mark.parametrize("variant", ["hv", "grad"])
def test_dynamic_weights_train_two_steps(variant, tiny_cfg):
    from rlexp.runs.training import run

    result = run(tiny_cfg(*_two_terms(), f"algorithm=dynamic_weights_{variant}"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert "reward_weights/accuracy" in m and "reward_weights/format" in m
    if variant == "grad":  # the weights moved off the configured 1.0 / 0.5 and kept their total
        assert m["reward_weights/accuracy"] != pytest.approx(1.0, abs=1e-9)
        assert m["reward_weights/accuracy"] + m["reward_weights/format"] == pytest.approx(1.5, abs=1e-6)
        assert m["dynamic_weights/influence/accuracy"] > 0
    else:  # step 2 is measured against step 1's reference point
        assert 0.5 <= m["dynamic_weights/meta_reward"] <= 2.0
        assert m["reward_weights/accuracy"] == pytest.approx(m["dynamic_weights/meta_reward"])
