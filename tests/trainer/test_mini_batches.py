"""Off-policy updates: k optimiser steps per rollout on mini-batches of whole groups (trainer.steps_per_rollout /
algorithm.steps_per_rollout), and what it does to the ratio methods."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.reinforce import reinforce
from rlexp.config.paths import CONF_DIR
from rlexp.core.micro_batches import group_mini_batches
from rlexp.trainer.optimize import policy_update
from tests.algorithms.batches import tiny_policy, token_batch


def test_group_mini_batches_keep_groups_whole_hand_computed():
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    parts = group_mini_batches(group_ids, 2, seed=7)
    order = torch.randperm(5, generator=torch.Generator().manual_seed(7))  # the groups' seeded order
    first, second = sorted(order[:3].tolist()), sorted(order[3:].tolist())  # 5 groups in 2: 3 + 2
    assert [sorted(set(group_ids[p].tolist())) for p in parts] == [first, second]
    for p in parts:  # whole groups, rows in batch order
        assert all((group_ids == g).sum() == (group_ids[p] == g).sum() for g in group_ids[p].unique())
        assert p.tolist() == sorted(p.tolist())
    assert sorted(torch.cat(parts).tolist()) == list(range(10))
    assert [p.tolist() for p in group_mini_batches(group_ids, 2, seed=7)] == [p.tolist() for p in parts]
    assert len(group_mini_batches(group_ids, 9, seed=0)) == 5  # capped at the number of groups
    assert len(group_mini_batches(group_ids, 1, seed=0)) == 1


class _CountingAdamW(torch.optim.AdamW):
    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def _update(loss, k, old=None, mu=1, seed=0, method=None):
    torch.manual_seed(0)
    model = tiny_policy()
    batch = token_batch(n_groups=4, g=2, seed=3)
    batch.old_logprobs = old(model, batch) if old else None
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0])
    algo = Algorithm(name="t", advantage=lambda b: b.advantages, loss=loss, aggregation="token-mean")
    opt = _CountingAdamW(model.parameters(), lr=1e-2)
    m = policy_update(
        model, opt, None, batch, algo, mu=mu, micro_batch=0, temperature=1.0, max_grad_norm=None,
        steps_per_rollout=k, seed=seed,
    )  # fmt: skip
    return m, opt.steps, model


def _current_logprobs(model, batch):
    from rlexp.trainer.optimize import batch_logprobs

    return batch_logprobs(model, batch, 0, 1.0)


@pytest.fixture(scope="module")
def ppo_clip():
    from rlexp.algorithms.losses.clip import ppo_clip

    return lambda *a: ppo_clip(*a, eps_low=0.2, eps_high=0.28)


def test_k_steps_per_rollout_move_the_ratio(ppo_clip):
    m1, steps1, _ = _update(ppo_clip, k=1)
    assert steps1 == 1 and m1["train/optimizer_steps"] == 1.0
    assert m1["ratio/min"] == m1["ratio/max"] == 1.0  # on-policy: exactly GRPO's gradient
    m4, steps4, _ = _update(ppo_clip, k=4, old=_current_logprobs)
    assert steps4 == 4 and m4["train/optimizer_steps"] == 4.0
    assert m4["ratio/min"] < 1.0 < m4["ratio/max"]  # the later mini-batches see a moved policy
    m22, steps22, _ = _update(ppo_clip, k=2, mu=2, old=_current_logprobs)
    assert steps22 == 4  # μ epochs × k mini-batches


def test_mini_batch_split_is_seeded(ppo_clip):
    a, _, ma = _update(ppo_clip, k=2, old=_current_logprobs, seed=1)
    b, _, mb = _update(ppo_clip, k=2, old=_current_logprobs, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(ma.parameters(), mb.parameters()))
    assert a["loss/total"] == b["loss/total"]


def test_mismatch_metrics_on_the_first_step(ppo_clip):
    """Before any update the trainer's log-probs against the sampler's: with the sampler's log-probs shifted
    by +0.1 on every token, r = e^-0.1, KL estimate r − 1 − log r, |log r| = 0.1."""
    torch.manual_seed(0)
    model = tiny_policy()
    batch = token_batch(n_groups=2, g=2, seed=3)
    batch.sampling_logprobs = (_current_logprobs(model, batch) + 0.1) * batch.completion_mask
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    algo = Algorithm(name="t", advantage=lambda b: b.advantages, loss=ppo_clip, aggregation="token-mean")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    m = policy_update(model, opt, None, batch, algo, mu=1, micro_batch=0, temperature=1.0, max_grad_norm=None)
    r = torch.exp(torch.tensor(-0.1))
    assert m["mismatch/log_ratio_abs"] == pytest.approx(0.1, abs=1e-4)
    assert m["mismatch/kl"] == pytest.approx(float(r - 1 + 0.1), abs=1e-5)
    assert m["mismatch/ratio_max"] == pytest.approx(float(r), abs=1e-4)


# ---- each ratio method: inert at ratio 1 (where it coincides with GRPO), acting once the policy has moved ----

RATIO_METHODS = ["dapo", "gspo", "sapo", "cispo", "gmpo", "kl_cov", "ppo", "topr", "m2po", "bapo"]


def _method_loss(name):
    cfg = OmegaConf.load(Path(CONF_DIR) / "algorithm" / f"{name}.yaml")
    return instantiate(cfg.loss)


def _grad(loss_fn, logp0, old, adv, mask, mode="token-mean"):
    logp = logp0.clone().requires_grad_(True)
    out = loss_fn(logp, old, adv, mask)
    aggregate(out.per_token, mask, mode, Normaliser.from_mask(mask)).backward()
    return logp.grad


@pytest.mark.parametrize("name", RATIO_METHODS)
def test_ratio_method_coincides_with_grpo_at_ratio_one_and_differs_after_a_step(name):
    """GRPO's gradient here is the on-policy policy gradient −A·∇log π (its clipped surrogate at ratio 1).
    At old = current (the first mini-batch after a fresh forward) every method's gradient equals it; with
    the policy moved (log π − log π_old of ±0.3, as after earlier mini-batches) each method's own
    mechanism (clip, sequence ratio, soft gate, IS weight, geometric mean, KL penalty) changes it."""
    torch.manual_seed(0)
    N, T = 4, 6
    logp = -torch.rand(N, T) - 0.1
    mask = torch.ones(N, T)
    mask[1, 4:] = 0
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0])
    loss = _method_loss(name)
    mode = OmegaConf.load(Path(CONF_DIR) / "algorithm" / f"{name}.yaml").aggregation
    grpo = _grad(reinforce, logp, logp, adv, mask, mode)
    at_one = _grad(loss, logp, logp.clone(), adv, mask, mode)
    torch.testing.assert_close(at_one, grpo, rtol=1e-5, atol=1e-6)
    shift = 0.3 * torch.sign(torch.randn(N, T))
    moved = _grad(loss, logp, logp - shift, adv, mask, mode)
    assert not torch.allclose(moved, grpo, atol=1e-4), f"{name}: its mechanism did not act on a moved policy"


def test_ratio_configs_set_their_sources_schedule():
    for name in (
        "dapo",
        "gspo",
        "sapo",
        "cispo",
        "gmpo",
        "clip_cov",
        "kl_cov",
        "ppo",
        "dapo_8020",
        "topr",
        "m2po",
        "bapo",
    ):
        cfg = OmegaConf.load(Path(CONF_DIR) / "algorithm" / f"{name}.yaml")
        assert cfg.steps_per_rollout > 1, name
    assert OmegaConf.load(Path(CONF_DIR) / "algorithm" / "grpo.yaml").get("steps_per_rollout", 1) == 1


def test_top_entropy_normaliser_selected_divides_by_the_selected_tokens():
    """80/20 with the authors' normaliser: the step's gradient equals that of Σ_selected ℓ / N_selected,
    computed here by hand from the same forward (SGD with lr 1, so the parameter change is −gradient)."""
    from rlexp.algorithms.losses.clip import ppo_clip
    from rlexp.algorithms.regularisers.entropy import high_entropy_mask
    from rlexp.core.forward import token_logprobs

    def loss(*a):
        return ppo_clip(*a, eps_low=0.2, eps_high=0.28)

    batch = token_batch(n_groups=3, g=2, seed=5)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    algo = Algorithm(name="t", advantage=lambda b: b.advantages, loss=loss, aggregation="token-mean",
                     top_entropy_quantile=0.5, top_entropy_normaliser="selected")  # fmt: skip
    model = tiny_policy()
    before = [p.detach().clone() for p in model.parameters()]
    policy_update(model, torch.optim.SGD(model.parameters(), lr=1.0), None, batch, algo, mu=1, micro_batch=0,
                  temperature=1.0, max_grad_norm=None, share_prompts=False)  # fmt: skip
    moved = [b - p.detach() for b, p in zip(before, model.parameters())]  # = the applied gradient
    ref = tiny_policy()
    lp, ent = token_logprobs(ref, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask,
                             with_entropy=True, share_prompts=False)  # fmt: skip
    m = batch.completion_mask.float()
    keep = high_entropy_mask(ent, m, 0.5).float()
    per_token = loss(lp, lp.detach(), batch.advantages, m).per_token
    ((per_token * keep * m).sum() / keep.sum()).backward()
    for got, p in zip(moved, ref.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="top_entropy_normaliser=selected needs"):
        Algorithm(name="t", advantage=lambda b: b.advantages, loss=loss, aggregation="seq-mean-token-mean",
                  top_entropy_quantile=0.5, top_entropy_normaliser="selected")  # fmt: skip
