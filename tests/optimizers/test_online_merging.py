"""Online Merging Optimizers (arXiv 2405.17931): OnDARE / OnTIES merges on small tensors, worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from rlexp.optimizers.online_merging import (
    OnlineMerging,
    dare,
    dare_mask,
    magnitude_mask,
    ondare_merge,
    onties_merge,
    trim,
)


def test_dare_drops_and_rescales():
    x = torch.tensor([1.0, -2.0, 3.0, -4.0])
    keep = torch.tensor([True, False, True, False])
    # kept entries ÷ p = 0.5: [2, 0, 6, 0]
    assert dare(x, keep, 0.5, rescale=False, clip=None).tolist() == [2.0, 0.0, 6.0, 0.0]
    # L1 rescale: |x|₁ = 10, after the drop 8 → × 10/8 = [2.5, 0, 7.5, 0], then clamped to ±5
    out = dare(x, keep, 0.5, rescale=True, clip=5.0)
    assert out.tolist() == pytest.approx([2.5, 0.0, 5.0, 0.0])


def test_dare_mask_is_seeded():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, b = dare_mask((10_000,), 0.3, g1, "cpu"), dare_mask((10_000,), 0.3, g2, "cpu")
    assert torch.equal(a, b) and 0.27 < a.float().mean().item() < 0.33


def test_magnitude_trim():
    x = torch.tensor([0.1, -0.5, 0.3, -0.2])
    # density 0.5 → the 2 largest magnitudes, −0.5 and 0.3
    assert magnitude_mask(x, 0.5).tolist() == [False, True, True, False]
    # rescaled to the original |x|₁ = 1.1 from 0.8: × 1.375
    assert trim(x, 0.5, rescale=True).tolist() == pytest.approx([0.0, -0.6875, 0.4125, 0.0])
    assert magnitude_mask(x, 1.0).all() and magnitude_mask(x, 0.1).all()  # k = 0 rounds to "keep all"


def test_ondare_merge_weights_the_two_deltas():
    update, tau = torch.tensor([0.4, -0.8]), torch.tensor([2.0, 0.0])
    # 0.25·τ + 0.75·δ = [0.5 + 0.3, 0 − 0.6]
    assert ondare_merge(update, tau, 0.25).tolist() == pytest.approx([0.8, -0.6])


def test_onties_merge_elects_signs():
    update = torch.tensor([0.1, -0.2, 0.3, 0.0])
    tau = torch.tensor([-0.5, -0.1, 0.0, 0.4])
    merged, kept = onties_merge(update, tau, 0.25)
    # τ + δ = [−0.4, −0.3, 0.3, 0.4] → elected [−, −, +, +]; τ keeps [−0.5, −0.1, ·, 0.4] (its 0 matches no sign);
    # δ keeps [·, −0.2, 0.3, ·]; merged = 0.25·τ̂ + 0.75·δ̂ = [−0.125, −0.175, 0.225, 0.1]
    assert merged.tolist() == pytest.approx([-0.125, -0.175, 0.225, 0.1])
    assert kept.tolist() == [False, True, True, False]


def _one_step(mode: str, **kw):
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0, -4.0]))
    opt = OnlineMerging([p], base_params=[torch.zeros(4)], mode=mode, lr=0.1, betas=(0.9, 0.999), eps=1e-12, **kw)
    p.grad = torch.tensor([1.0, 2.0, -1.0, -3.0])
    opt.step()
    return p.detach(), opt.last_metrics


def test_onties_step_by_hand():
    # base 0: τ = θ_SFT = [1, −2, 3, −4] (density 1: all kept). Adam's first step is −lr·sign(g) = [−.1, −.1, .1, .1];
    # elected sign(τ + δ) = [+, −, +, −]: δ keeps entries 1 and 2; θ += 0.5·τ + 0.5·[0, −.1, .1, 0]
    p, m = _one_step("onties", reserve=1.0, alpha=0.5)
    assert p.tolist() == pytest.approx([1.5, -3.05, 4.55, -6.0], abs=1e-6)
    assert m["online_merging/kept_frac"] == 0.5
    assert m["online_merging/raw_cos_to_delta"] == pytest.approx(0.0, abs=1e-6)  # (−.1 + .2 + .3 − .4) = 0
    u = [0.5, -1.05, 1.55, -2.0]
    cos = sum(a * b for a, b in zip(u, [1, -2, 3, -4])) / (math.sqrt(sum(a * a for a in u)) * math.sqrt(30))
    assert m["online_merging/update_cos_to_delta"] == pytest.approx(cos, rel=1e-5)


def test_ondare_step_by_hand():
    # keep probability 1: τ = clamp([1, −2, 3, −4], ±1) = [1, −1, 1, −1]; θ += 0.5·τ + 0.5·[−.1, −.1, .1, .1]
    p, m = _one_step("ondare", reserve=1.0, alpha=0.5, clip=1.0)
    assert p.tolist() == pytest.approx([1.45, -2.55, 3.55, -4.45], abs=1e-6)
    assert m["online_merging/kept_frac"] == 1.0


def test_ondare_tau_is_a_seeded_drop_of_the_delta():
    sft = torch.nn.Parameter(torch.linspace(-0.5, 0.5, 1000))
    a = OnlineMerging([sft], base_params=[torch.zeros(1000)], reserve=0.2, seed=7)
    b = OnlineMerging([sft], base_params=[torch.zeros(1000)], reserve=0.2, seed=7)
    ta, tb = a.tau[sft], b.tau[sft]
    assert torch.equal(ta, tb)
    kept = ta != 0
    assert 0.15 < kept.float().mean().item() < 0.25
    # kept entries are the delta ÷ 0.2, clamped to ±1
    assert torch.allclose(ta[kept], (sft.detach()[kept] / 0.2).clamp(-1, 1))


def test_bad_settings_name_their_key():
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="optimizer.base_model"):
        OnlineMerging([p])
    with pytest.raises(ValueError, match="optimizer.mode"):
        OnlineMerging([p], base_params=[torch.zeros(2)], mode="ties")
    with pytest.raises(ValueError, match="optimizer.reserve"):
        OnlineMerging([p], base_params=[torch.zeros(2)], reserve=0.0)
    with pytest.raises(ValueError, match="shape"):
        OnlineMerging([p], base_params=[torch.zeros(3)])
    with pytest.raises(ValueError, match="same architecture"):
        OnlineMerging([p], base_params=[torch.zeros(2), torch.zeros(2)])


@pytest.mark.parametrize("mode", ["ondare", pytest.param("onties", marks=pytest.mark.long)])
def test_online_merging_trains_two_steps(mode, tiny_cfg):
    """optimizer=online_merging in a run: the base is the tiny model with another seed; the merge steers the update
    toward τ (scaled for the tiny model: keep half the entries, merge weight 0.01)."""
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]
    overrides = ["optimizer=online_merging", f"optimizer.mode={mode}", "optimizer.reserve=0.5", "optimizer.alpha=0.01"]
    cfg = tiny_cfg(*VARYING, *fast, *overrides)
    with open_dict(cfg):
        cfg.optimizer.base_model = OmegaConf.merge(cfg.model, {"seed": 1})
    result = run(cfg)
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["grad_norm"])
    assert 0.0 < m["online_merging/kept_frac"] < 1.0
    assert m["online_merging/update_cos_to_delta"] > m["online_merging/raw_cos_to_delta"] + 0.1
