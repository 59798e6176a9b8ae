"""AEnt's clamped entropy and coefficient band (arXiv 2509.03493) and TRL's adaptive-entropy target, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.regularisers.entropy import EntropyBonus, clamped_entropy
from rlexp.core.forward import token_logprobs


def _entropy(p):
    return -sum(x * math.log(x) for x in p if x > 0)


def test_clamped_entropy_drops_the_lowest_logits_and_renormalises():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    # p = 0.4 of 5 tokens: the 2 lowest (−1, −3) dropped; softmax over (2, 1, 0)
    z = [math.exp(2.0), math.exp(1.0), 1.0]
    want = _entropy([v / sum(z) for v in z])
    assert clamped_entropy(logits, 0.4).item() == pytest.approx(want, rel=1e-6)
    full = torch.softmax(logits, -1)[0].tolist()
    assert clamped_entropy(logits, 0.0).item() == pytest.approx(_entropy(full), rel=1e-6)
    assert clamped_entropy(logits, 0.1).item() == pytest.approx(_entropy(full), rel=1e-6)  # ⌊0.5⌋ = 0 dropped


def test_clamped_entropy_gradient_flows_through_the_kept_tokens_only():
    logits = torch.tensor([[0.5, 0.2, -0.4, -2.0]], requires_grad=True)
    clamped_entropy(logits, 0.25).sum().backward()  # the lowest (−2) dropped
    assert logits.grad[0, 3] == 0
    kept = logits.detach()[:, :3].clone().requires_grad_(True)
    p = torch.softmax(kept, -1)
    (-(p * p.log()).sum()).backward()
    assert torch.allclose(logits.grad[:, :3], kept.grad, atol=1e-6)


def test_band_control_below_inside_above():
    kw = dict(coef=0.01, control="band", low=0.2, high=0.5, lr=0.1, coef_min=0.0, coef_max=1.0)
    below = EntropyBonus(**kw)
    m = below.update(step=1, metrics={"entropy_bonus/entropy": 0.1})  # c − lr·(0.1 − 0.2) = 0.01 + 0.01
    assert m["entropy_bonus/coef"] == 0.01 and below.coef == pytest.approx(0.02)
    inside = EntropyBonus(**kw)
    inside.update(step=1, metrics={"entropy_bonus/entropy": 0.3})
    assert inside.coef == 0.01
    at_edge = EntropyBonus(**kw)
    at_edge.update(step=1, metrics={"entropy_bonus/entropy": 0.5})
    assert at_edge.coef == 0.01
    above = EntropyBonus(**kw)
    above.update(step=1, metrics={"entropy_bonus/entropy": 0.55})  # c − lr·(0.55 − 0.5) = 0.005
    assert above.coef == pytest.approx(0.005)
    floor = EntropyBonus(**kw)
    floor.update(step=1, metrics={"entropy_bonus/entropy": 2.0})  # 0.01 − 0.15 clipped to coef_min
    assert floor.coef == 0.0


def test_band_control_waits_for_the_warmup():
    bonus = EntropyBonus(coef=0.01, control="band", low=0.2, high=0.5, lr=0.1, warmup_steps=2)
    bonus.update(step=2, metrics={"entropy_bonus/entropy": 0.0})
    assert bonus.coef == 0.01
    bonus.update(step=3, metrics={"entropy_bonus/entropy": 0.0})
    assert bonus.coef == pytest.approx(0.03)


def test_target_control_steps_and_gates():
    bonus = EntropyBonus(coef=0.0, control="target", target=0.2, lr=0.005, coef_min=0.0, coef_max=0.0075)
    assert bonus.coefficient() == 0.0
    bonus.update(step=1, metrics={"entropy_bonus/entropy": 0.1})  # at or below the target: + δ, bonus on
    assert bonus.coef == pytest.approx(0.005) and bonus.coefficient() == pytest.approx(0.005)
    bonus.update(step=2, metrics={"entropy_bonus/entropy": 0.2})
    assert bonus.coef == pytest.approx(0.0075)  # capped at coef_max
    bonus.update(step=3, metrics={"entropy_bonus/entropy": 0.3})  # above: − δ, and off until entropy falls again
    assert bonus.coef == pytest.approx(0.0025) and bonus.coefficient() == 0.0


def test_fixed_control_never_moves_and_state_round_trips():
    bonus = EntropyBonus(coef=0.3, control="fixed")
    bonus.update(step=5, metrics={"entropy_bonus/entropy": 9.0})
    assert bonus.coef == 0.3
    band = EntropyBonus(coef=0.01, control="band", low=0.2, high=0.5, lr=0.1)
    band.update(step=1, metrics={"entropy_bonus/entropy": 0.0})
    again = EntropyBonus(coef=0.01, control="band", low=0.2, high=0.5, lr=0.1)
    again.load_state_dict(band.state_dict())
    assert again.coef == band.coef
    again.load_state_dict(None)  # nothing saved: unchanged
    assert again.coef == band.coef


def test_bad_settings_refused():
    with pytest.raises(ValueError, match="control"):
        EntropyBonus(control="pid")
    with pytest.raises(ValueError, match="low"):
        EntropyBonus(control="band", low=0.6, high=0.5)
    with pytest.raises(ValueError, match="clamp"):
        EntropyBonus(clamp=1.0)
    with pytest.raises(ValueError, match="two entropy terms"):
        Algorithm(name="x", advantage=grpo, loss=ppo_clip, entropy_coef=0.1, entropy_control=EntropyBonus())


def test_token_loss_subtracts_the_coefficient_times_the_clamped_entropy():
    algo = Algorithm(name="x", advantage=grpo, loss=ppo_clip, entropy_control=EntropyBonus(coef=0.5, clamp=0.4))
    logp = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    adv = torch.tensor([1.0])
    h = torch.tensor([[0.2, 0.4, 0.6]])
    plain = Algorithm(name="y", advantage=grpo, loss=ppo_clip).token_loss(logp, logp, adv, mask)
    out = algo.token_loss(logp, logp, adv, mask, entropy=torch.ones(1, 3), clamped_entropy=h)
    assert torch.allclose(out.per_token, plain.per_token - 0.5 * h)
    assert torch.equal(out.token_stats["entropy_bonus/entropy"], h)
    assert algo.entropy_clamp == 0.4 and not algo.entropy_grad


def test_forward_returns_the_clamped_entropy_with_gradient(tiny):
    model = tiny.model
    p = torch.tensor([[5, 6, 7]])
    c = torch.tensor([[8, 9]])
    ones_p, ones_c = torch.ones_like(p), torch.ones_like(c)
    logp, ent, extra = token_logprobs(model, p, ones_p, c, ones_c, 1.0, with_entropy=True, entropy_clamp=0.5)
    h = extra["clamped_entropy"]
    assert h.shape == c.shape and h.requires_grad
    assert float(h.max()) <= math.log(model.config.vocab_size / 2) + 1e-4  # half the vocabulary: at most log(V/2)
    plain, plain_ent = token_logprobs(model, p, ones_p, c, ones_c, 1.0, with_entropy=True)
    assert torch.allclose(logp, plain, atol=1e-5) and torch.allclose(ent, plain_ent, atol=1e-4)


def test_spine_band_edges_on_the_forking_tokens():
    from rlexp.algorithms.regularisers.entropy import EntropyBand

    band = EntropyBand(coef=2.0, low=0.1, high=0.5)
    h = torch.tensor([[0.1, 0.2, 0.3, 0.4, 1.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])  # the last is padding
    term, stats = band.token_term(h, mask)
    # quantiles of the 5 valid entropies (linear): q_0.1 = 0.1 + 0.4·0.1 = 0.14, q_0.5 = 0.3 (the band's edges)
    want = 2.0 * torch.tensor([[0.04, 0.0, 0.0, 0.1, 0.7, 0.0]])
    assert torch.allclose(term, want, atol=1e-6)
    assert stats["entropy_band/below"][0].tolist() == [1, 0, 0, 0, 0, 0]
    assert stats["entropy_band/above"][0].tolist() == [0, 0, 0, 1, 1, 0]
    term.sum().backward()  # up below the band (negative gradient on H), down above it
    assert h.grad[0].tolist() == pytest.approx([-2.0, 0.0, 0.0, 2.0, 2.0, 0.0])
    selected = torch.tensor([[0, 1, 1, 1, 1, 0]]).bool()  # token 0 is not forking: its own band, it adds nothing
    term, _ = band.token_term(h.detach(), mask, selected)
    # forking entropies 0.2, 0.3, 0.4, 1.0: q_0.1 = 0.2 + 0.3·0.1 = 0.23, q_0.5 = 0.35
    want = 2.0 * torch.tensor([[0.0, 0.03, 0.0, 0.05, 0.65, 0.0]])
    assert torch.allclose(term, want, atol=1e-6)


def test_spine_algorithm_applies_the_band_to_the_top_entropy_tokens():
    from rlexp.algorithms.regularisers.entropy import EntropyBand

    algo = Algorithm(
        name="s", advantage=grpo, loss=ppo_clip, top_entropy_quantile=0.5, entropy_control=EntropyBand(1.0, 0.0, 1.0)
    )
    logp = torch.zeros(1, 4)
    entropy = torch.tensor([[0.1, 0.2, 0.8, 1.0]])
    out = algo.token_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 4), entropy=entropy)
    # the top half (0.8, 1.0) are forking: their band is [0.8, 1.0], nothing outside it; the rest carry no loss
    assert torch.allclose(out.per_token, torch.tensor([[0.0, 0.0, -1.0, -1.0]]))
    assert algo.entropy_grad
    with pytest.raises(ValueError, match="quantiles"):
        EntropyBand(low=0.6, high=0.5)


@pytest.mark.long  # three tiny runs (~25 s)
def test_aent_coefficient_survives_a_resume(tmp_path):
    """The band controller's coefficient is in the checkpoint: a crashed and resumed run uses the same coefficients
    as the uninterrupted one."""
    import json

    from rlexp.runs.training import run
    from tests.conftest import TINY, compose_train
    from tests.trainer.test_resume import CrashAt

    overrides = [
        *TINY,
        "algorithm=aent",
        "algorithm.entropy_control.coef=0.002",
        "algorithm.entropy_control.lr=1e-5",
        "algorithm.entropy_control.warmup_steps=0",
        "trainer.max_steps=3",
        "trainer.checkpoint_every=1",
        "trainer.max_new_tokens=6",
        "trainer.autocast=off",
    ]
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(compose_train(overrides, tmp_path / "run"), callbacks=[CrashAt(2)])
    run(compose_train(overrides, tmp_path / "run"))
    run(compose_train(overrides, tmp_path / "ref"))

    def coefs(d):
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        return [r["entropy_bonus/coef"] for r in rows if "entropy_bonus/coef" in r]

    resumed, ref = coefs(tmp_path / "run"), coefs(tmp_path / "ref")
    assert len(resumed) == 3 and resumed[0] == 0.002 and resumed[2] < resumed[1] < resumed[0]  # entropy above the band
    assert resumed == pytest.approx(ref, rel=1e-6)
