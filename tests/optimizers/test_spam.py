"""SPAM (arXiv 2501.06842) against hand-computed Adam steps: the spike clip, the momentum reset and the warm-up."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlexp.optimizers.spam import SPAM, warmup_scale


def _param(value: float) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor([value], dtype=torch.float64))


def _step(opt: SPAM, p: torch.nn.Parameter, grad: float) -> None:
    p.grad = torch.tensor([grad], dtype=torch.float64)
    opt.step()


def test_first_step_is_adam():
    p = _param(1.0)
    opt = SPAM([p], lr=0.1, betas=(0.9, 0.999), eps=0.0, threshold=0.0)
    _step(opt, p, 2.0)
    # m = 0.2, v = 0.004; bias-corrected m̂/√v̂ = 2/2 = 1: p = 1 − 0.1
    assert p.item() == pytest.approx(0.9)


def test_spike_clipped_to_sqrt_threshold_times_v():
    p = _param(0.0)
    opt = SPAM([p], lr=1.0, betas=(0.0, 0.5), eps=0.0, threshold=4.0, grad_accu_steps=2, reset_interval=0)
    _step(opt, p, 1.0)  # step 1: before grad_accu_steps, no clip; v = 0.5
    assert opt.last_metrics["optimizer/spike_entries"] == 0.0
    before = p.item()
    _step(opt, p, 100.0)  # g² = 1e4 > θ·v = 2: clipped to √2
    assert opt.last_metrics["optimizer/spike_entries"] == 1.0
    g = math.sqrt(2.0)
    m, v = g, 0.5 * 0.5 + 0.5 * g * g  # β1 = 0: m is the clipped gradient
    step_size = math.sqrt(1 - 0.5**2) / 1.0
    assert p.item() == pytest.approx(before - step_size * m / math.sqrt(v))


def test_gradient_below_threshold_untouched():
    p = _param(0.0)
    opt = SPAM([p], lr=1.0, betas=(0.0, 0.5), eps=0.0, threshold=4.0, grad_accu_steps=1, reset_interval=0)
    _step(opt, p, 1.0)  # v before = 0, g² = 1 > 0: the released code clips even here, to 0
    assert opt.last_metrics["optimizer/spike_entries"] == 1.0
    _step(opt, p, 1.0)  # v = 0 after the zero gradient entered: again clipped
    q = _param(0.0)
    opt2 = SPAM([q], lr=1.0, betas=(0.0, 0.5), eps=0.0, threshold=4.0, grad_accu_steps=2, reset_interval=0)
    _step(opt2, q, 1.0)  # v = 0.5
    _step(opt2, q, 1.2)  # 1.44 < 4·0.5: kept
    assert opt2.last_metrics["optimizer/spike_entries"] == 0.0
    assert opt2.state[q]["exp_avg_sq"].item() == pytest.approx(0.25 + 0.5 * 1.44)


def test_momentum_reset_and_warmup():
    p = _param(0.0)
    opt = SPAM([p], lr=1.0, betas=(0.5, 0.5), eps=0.0, threshold=0.0, reset_interval=3, warmup_steps=2)
    for g in (1.0, 1.0):
        _step(opt, p, g)
    assert opt.last_metrics["optimizer/momentum_reset"] == 0.0
    assert opt.state[p]["exp_avg"].item() == pytest.approx(0.75)
    _step(opt, p, 4.0)  # step index 2: (2 + 1) % 3 == 0, moments zeroed before this gradient
    assert opt.last_metrics["optimizer/momentum_reset"] == 1.0
    assert opt.state[p]["exp_avg"].item() == pytest.approx(2.0)
    assert opt.state[p]["exp_avg_sq"].item() == pytest.approx(8.0)
    assert opt.last_metrics["optimizer/update_scale"] == 1.0  # the reset step itself is not scaled
    before = p.item()
    _step(opt, p, 4.0)  # first step after the reset: scale 1 − 0.99 = 0.01
    assert opt.last_metrics["optimizer/update_scale"] == pytest.approx(0.01)
    m, v, n = 0.5 * 2.0 + 0.5 * 4.0, 0.5 * 8.0 + 0.5 * 16.0, 4  # the bias-correction count keeps running
    step_size = math.sqrt(1 - 0.5**n) / (1 - 0.5**n)
    assert p.item() == pytest.approx(before - 0.01 * step_size * m / math.sqrt(v))
    _step(opt, p, 4.0)
    assert opt.last_metrics["optimizer/update_scale"] == pytest.approx(warmup_scale(1, 2))
    _step(opt, p, 4.0)
    assert opt.last_metrics["optimizer/update_scale"] == 1.0


def test_warmup_scale_values():
    assert warmup_scale(0, 150) == pytest.approx(0.01)
    assert warmup_scale(1, 2) == pytest.approx(1 - 0.99 * (1 + math.cos(math.pi / 3)) / 2)
    assert warmup_scale(150, 150) == 1.0


def test_counters_survive_a_state_dict_round_trip():
    p = _param(0.0)
    opt = SPAM([p], lr=0.1, reset_interval=3, warmup_steps=2, threshold=0.0)
    for _ in range(4):
        _step(opt, p, 1.0)
    q = _param(p.item())
    again = SPAM([q], lr=0.1, reset_interval=3, warmup_steps=2, threshold=0.0)
    again.load_state_dict(copy.deepcopy(opt.state_dict()))  # as through torch.save and torch.load
    assert again.total_step == 4
    _step(opt, p, 1.0)
    _step(again, q, 1.0)
    assert q.item() == p.item()
    assert again.last_metrics == opt.last_metrics


def test_bad_settings_refused():
    with pytest.raises(ValueError, match="reset_interval"):
        SPAM([_param(0.0)], lr=0.1, reset_interval=-1)
    with pytest.raises(ValueError, match="optimizer.lr"):
        SPAM([_param(0.0)], lr=0.0)


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_spam_trains_two_steps_with_a_scaled_down_schedule(tiny_cfg):
    """optimizer=spam in a run: a reset at step 2 (ΔT = 2 with one optimiser step per rollout), its metrics logged."""
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    overrides = ["optimizer=spam", "optimizer.reset_interval=2", "optimizer.grad_accu_steps=1"]
    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]
    result = run(tiny_cfg(*VARYING, *fast, *overrides))
    assert result.last_step == 2
    assert result.metrics["optimizer/momentum_reset"] == 1.0
    assert math.isfinite(result.metrics["grad_norm"]) and result.metrics["optimizer/spike_entries"] >= 0
