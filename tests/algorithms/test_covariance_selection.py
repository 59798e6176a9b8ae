"""Clip-Cov and KL-Cov as released (PRIME-RL/Entropy-Mechanism-of-RL 7b_clip_cov.sh / 7b_kl_cov.sh) and their
token selection over the whole mini-batch (loss.scope=mini_batch), independent of the micro-batch split."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.covariance import ClipCov, KLCov, kl_cov_selection
from rlexp.config.paths import CONF_DIR
from rlexp.trainer.optimize import batch_logprobs, policy_update
from tests.algorithms.batches import tiny_policy, token_batch


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_kl_cov_selection_over_the_mini_batch_by_hand():
    # tokens (row, pos): adv 1, 1, −1, −1 (mean 0); log π −1, −1, −3, −1 (mean −1.5)
    # cov = A · (log π + 1.5) = 0.5, 0.5, 1.5, −0.5: the top-1 over both rows is (1, 0)
    logp, adv, mask = t([[-1.0, -1.0], [-3.0, -1.0]]), t([1.0, -1.0]), t([[1, 1], [1, 1]])
    assert kl_cov_selection(logp, adv, mask, kl_ratio=2e-3).tolist() == [[False, False], [True, False]]
    # per row (one micro-batch each, the released code's scope): A − Ā = 0 in each row, so the covariance is 0
    # everywhere and the one-token floor still penalises a token in every row: 2 tokens, not chosen by covariance
    per_row = [kl_cov_selection(logp[i : i + 1], adv[i : i + 1], mask[i : i + 1], kl_ratio=2e-3) for i in (0, 1)]
    assert [int(s.sum()) for s in per_row] == [1, 1]


def test_clip_cov_at_the_released_eps_one_leaves_a_ratio_of_1_5_unclipped():
    logp = t([[math.log(1.5), 0.0]]).requires_grad_(True)
    out = ClipCov(eps_low=1.0, eps_high=1.0, clip_ratio=2e-4, cov_lb=10.0)(logp, t([[0.0, 0.0]]), t([2.0]), t([[1, 1]]))
    torch.testing.assert_close(out.per_token, t([[-3.0, -2.0]]))  # −A·r, not −A·1.2 as at ε = 0.2
    assert out.token_stats["clip/high_frac"].sum() == 0
    at_02 = ClipCov(cov_lb=10.0)(logp, t([[0.0, 0.0]]), t([2.0]), t([[1, 1]]))
    torch.testing.assert_close(at_02.per_token, t([[-2.4, -2.0]]))


def _run(loss, micro_batch, k=2, seed=0):
    """Two optimiser steps (k = 2 mini-batches of 2 groups) with recomputed old log-probs, SGD lr 1."""
    torch.manual_seed(seed)
    model = tiny_policy()
    batch = token_batch(n_groups=4, g=2, seed=3)
    batch.advantages = t([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0])
    batch.old_logprobs = batch_logprobs(model, batch, 0, 1.0, share_prompts=False)
    algo = Algorithm(name="t", advantage=lambda b: b.advantages, loss=loss, aggregation="token-mean")
    before = [p.detach().clone() for p in model.parameters()]
    torch.manual_seed(seed + 1)  # Clip-Cov's random draw
    m = policy_update(
        model, torch.optim.SGD(model.parameters(), lr=1.0), None, batch, algo, mu=1, micro_batch=micro_batch,
        temperature=1.0, max_grad_norm=None, share_prompts=False, steps_per_rollout=k, seed=0,
    )  # fmt: skip
    moved = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    return m, moved, int(batch.completion_mask.sum())


@pytest.mark.parametrize(
    "loss",
    [KLCov(kl_ratio=2e-3), ClipCov(eps_low=1.0, eps_high=1.0, clip_ratio=2e-4, cov_lb=0.0, cov_ub=5.0)],
    ids=["kl_cov", "clip_cov"],
)
def test_mini_batch_scope_does_not_depend_on_the_micro_batch_split(loss):
    whole, moved_whole, _ = _run(loss, micro_batch=0)
    rows, moved_rows, _ = _run(loss, micro_batch=1)
    torch.testing.assert_close(moved_rows, moved_whole, rtol=1e-4, atol=1e-6)
    key = "cov/penalised_frac" if isinstance(loss, KLCov) else "cov/detached_frac"
    assert rows[key] == pytest.approx(whole[key]) and whole[key] > 0


def test_micro_batch_scope_applies_the_floor_per_micro_batch():
    """KL-Cov at 2e-3 of ~10 tokens a mini-batch: one penalised token per optimiser step over the mini-batch,
    one per micro-batch (here per row, 4 rows a mini-batch) at the released code's scope."""
    whole, _, n_tokens = _run(KLCov(kl_ratio=2e-3), micro_batch=1)
    per_micro, _, _ = _run(KLCov(kl_ratio=2e-3, scope="micro_batch"), micro_batch=1)
    batch = token_batch(n_groups=4, g=2, seed=3)
    from rlexp.core.micro_batches import group_mini_batches

    parts = group_mini_batches(batch.group_ids, 2, 0)
    tokens = [float(batch.completion_mask[p].sum()) for p in parts]
    # metrics average the per-step token shares over the 2 steps
    assert whole["cov/penalised_frac"] == pytest.approx(sum(1 / n for n in tokens) / 2)
    assert per_micro["cov/penalised_frac"] == pytest.approx(sum(4 / n for n in tokens) / 2)
    assert n_tokens == sum(tokens)


def test_selection_uses_the_current_policy_after_the_first_step():
    """From the second optimiser step on the policy has moved: KL-Cov's |log r| then has a value, and the
    selection is taken on a fresh forward of the current policy (equal, up to float error, to what the
    micro-batches compute)."""
    m, _, _ = _run(KLCov(kl_ratio=0.5), micro_batch=0)
    assert m["train/optimizer_steps"] == 2.0 and m["ratio/max"] != 1.0


def test_configs_follow_the_released_runs():
    for name, cls in (("clip_cov", "ClipCov"), ("kl_cov", "KLCov")):
        cfg = OmegaConf.load(Path(CONF_DIR) / "algorithm" / f"{name}.yaml")
        assert cfg.loss._target_.endswith(f"covariance.{cls}") and cfg.loss.scope == "mini_batch"
        (stage,) = cfg.group_stages
        assert stage._target_.endswith("filters.dynamic_sampling")
        assert (stage.max_rounds, stage.refill, stage.get("keep_degenerate", False)) == (9, "batch", False)
        assert OmegaConf.to_container(stage)["metric"] == "${trainer.accuracy_term}"
        assert cfg.aggregation == "token-mean" and cfg.kl.coef == 0
    clip = OmegaConf.load(Path(CONF_DIR) / "algorithm" / "clip_cov.yaml").loss
    assert (clip.eps_low, clip.eps_high, clip.clip_ratio, clip.cov_lb, clip.cov_ub) == (1.0, 1.0, 2e-4, 1.0, 5.0)
    kl = OmegaConf.load(Path(CONF_DIR) / "algorithm" / "kl_cov.yaml").loss
    assert (kl.kl_ratio, kl.kl_coef) == (2e-3, 1.0)
    with pytest.raises(ValueError, match="KLCov.scope"):
        KLCov(scope="batch")
