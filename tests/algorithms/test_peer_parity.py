"""Issue 20 §2's losses against the peers' formulas, on random tensors (value and gradient, 1e-5).

Our side is the shipped method config (conf/algorithm/<method>.yaml) through ``Algorithm.token_loss`` and
``aggregate``, the trainer's path (``ours`` from test_trl_parity). The peer's side is written out below,
transcribed from the peer's code:

* verl (verl-project/verl @ 1dda039, verl/trainer/ppo/core_algos.py): ``compute_policy_loss_dppo_tv``,
  ``compute_policy_loss_dppo_kl``, ``compute_policy_loss_dro`` and ``agg_loss`` (dp_size 1, no global counts);
* TRL 1.16 (trl/trainer/grpo_trainer.py): ``GRPOTrainer._compute_loss`` (the loss_type branches luspo, vespo,
  cispo, sapo, grpo with ``delta``; ``importance_sampling_level``) and ``GRPOTrainer.get_gamma_weights``.

For TRL the real ``_compute_loss`` is also called, on the stand-in ``self`` of test_trl_parity.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from tests.algorithms.test_trl_parity import B, T, _Accelerator, make_tensors, ours

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


# ---------------------------------------------------------------- verl, transcribed


def verl_agg_loss(loss_mat, loss_mask, mode, loss_scale_factor=None):
    """verl core_algos.agg_loss, dp_size = 1, batch_num_tokens / global_batch_size None."""
    if mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if mode == "token-sum":
        return (loss_mat * loss_mask).sum()
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        loss = (seq_losses * seq_mask).sum() / seq_mask.sum()
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
        return loss
    if mode == "seq-mean-token-mean":
        count = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (count + 1e-8)
        seq_mask = (count > 0).float()
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    raise ValueError(mode)


def verl_dppo(kind, old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c, loss_agg_mode):
    """verl compute_policy_loss_dppo_tv / compute_policy_loss_dppo_kl (clip_ratio_low/high = the divergence
    thresholds, clip_ratio_c = the truncated-IS cap)."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    if kind == "tv":
        valid_positive_mask = (prob - old_prob) <= high
        valid_negative_mask = (prob - old_prob) >= -low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        valid_positive_mask = (binary_kl <= high) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= low) | (prob >= old_prob)
    valid_mask = torch.where(advantages > 0, valid_positive_mask, valid_negative_mask).detach().float()
    pg_losses = -advantages * truncated_ratio * log_prob * valid_mask
    return verl_agg_loss(pg_losses, response_mask, loss_agg_mode), valid_mask


def verl_dro(old_log_prob, log_prob, advantages, response_mask, beta, loss_agg_mode):
    """verl compute_policy_loss_dro."""
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    return verl_agg_loss(pg_losses, response_mask, loss_agg_mode)


def _verl_side(fn, lp, old, adv, mask, *args):
    """verl's functions take token-level advantages (B, T)."""
    return fn(old, lp, adv.unsqueeze(-1).expand_as(lp), mask, *args)


# ---------------------------------------------------------------- TRL, transcribed


@torch.no_grad()
def trl_gamma_weights(advantages, log_ratio_per_token, mask, k_pos, lambda_pos, k_neg, lambda_neg):
    """TRL GRPOTrainer.get_gamma_weights (a no-grad static method: φ is detached), no vLLM IS ratio."""
    lower_clamp = math.log(1e-8)
    log_ratio_clamped = torch.clamp(log_ratio_per_token, -20.0, 20.0)
    seq_log_ratio = torch.sum(log_ratio_clamped * mask, dim=-1, keepdim=True)
    log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
    w_seq = torch.exp(log_w_seq)
    is_nonneg_adv = advantages >= 0
    k_seq = torch.where(is_nonneg_adv, k_pos, k_neg)
    lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)
    log_phi = lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def trl_formula(loss_type, logp, old, adv, mask, *, level="token", eps_low=0.2, eps_high=0.2, delta=None, **kw):
    """TRL GRPOTrainer._compute_loss for one process, no accumulation, no vLLM, no KL, no entropy terms."""
    advantages = adv.unsqueeze(1) if adv.dim() == 1 else adv
    log_ratio = logp - old
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if loss_type == "cispo":
        per_token_loss = -torch.clamp(coef_1, max=eps_high).detach() * advantages * logp
    elif loss_type in ("grpo", "dapo", "luspo"):
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, kw.get("tau_pos", 1.0), kw.get("tau_neg", 1.05))
        per_token_loss = -(torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures) * advantages
    elif loss_type == "vespo":
        phi_seq = trl_gamma_weights(advantages, log_ratio, mask, 2.0, 3.0, 3.0, 2.0)
        per_token_loss = -phi_seq * advantages * logp
    if loss_type in ("grpo", "sapo"):
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("cispo", "dapo", "vespo"):
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)  # num_items_in_batch, P = GA = S = 1
    return (per_token_loss * mask).sum(-1).mean()  # luspo


def trl_real(loss_type, logp, old, adv, mask, ent, *, level="token", eps_low=0.2, eps_high=0.2, delta=None):
    """TRL's own _compute_loss on a stand-in self (as test_trl_parity.trl_loss, plus delta and VESPO's knobs)."""
    stub = SimpleNamespace(
        top_entropy_quantile=1.0,
        accelerator=_Accelerator(),
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(
            use_bias_correction_kl=False,
            delta=delta,
            sapo_temperature_pos=1.0,
            sapo_temperature_neg=1.05,
            vespo_k_pos=2.0,
            vespo_lambda_pos=3.0,
            vespo_k_neg=3.0,
            vespo_lambda_neg=2.0,
            steps_per_generation=1,
        ),
    )
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (logp, ent, None)
    stub.get_high_entropy_mask = partial(trl_grpo.GRPOTrainer.get_high_entropy_mask, stub)
    stub.get_gamma_weights = trl_grpo.GRPOTrainer.get_gamma_weights
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    return trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)


def _value_and_grad(fn, base):
    lp = base.clone().requires_grad_(True)
    out = fn(lp)
    value = out[0] if isinstance(out, tuple) else out
    value.backward()
    return value.detach(), lp.grad, out


def _close(got, want):
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- verl's losses

VERL_CASES = [
    # (our config, our overrides, verl kind, thresholds low/high, verl clip_ratio_c): the released run's
    # clip_ratio_c = 1e4 is our ratio_cap = null; verl's config default 3 is ratio_cap = 3
    ("dppo_tv", [], "tv", 0.15, 0.15, 1e4),
    ("dppo_tv", ["algorithm.loss.delta_high=0.08", "algorithm.loss.ratio_cap=1.2"], "tv", 0.15, 0.08, 1.2),
    ("dppo_kl", [], "kl", 0.05, 0.05, 1e4),
    ("dppo_kl", ["algorithm.loss.delta_low=0.02", "algorithm.loss.ratio_cap=3.0"], "kl", 0.02, 0.05, 3.0),
    ("dppo_tv", ["algorithm.aggregation=token-mean"], "tv", 0.15, 0.15, 1e4),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("method,overrides,kind,low,high,c", VERL_CASES)
def test_dppo_matches_verl(method, overrides, kind, low, high, c, seed, tmp_path):
    base, old, adv, mask, ent, _ = make_tensors(seed, noise=0.5)
    mode = "token-mean" if "algorithm.aggregation=token-mean" in overrides else "seq-mean-token-sum-norm"
    want = _value_and_grad(
        lambda lp: _verl_side(partial(verl_dppo, kind), lp, old, adv, mask, low, high, c, mode), base
    )
    got = _value_and_grad(lambda lp: ours(method, overrides, lp, old, adv, mask, ent, None, tmp_path), base)
    _close(got, want)
    valid = want[2][1] * mask
    assert 0 < valid.sum() < mask.sum(), "the trust-region mask should keep some tokens and drop others"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean"])
def test_dro_matches_verl(mode, seed, tmp_path):
    base, old, adv, mask, ent, _ = make_tensors(seed, noise=0.5)
    want = _value_and_grad(lambda lp: _verl_side(verl_dro, lp, old, adv, mask, 0.05, mode), base)
    got = _value_and_grad(
        lambda lp: ours("dro", [f"algorithm.aggregation={mode}"], lp, old, adv, mask, ent, None, tmp_path), base
    )
    _close(got, want)


def test_token_sum_matches_verl(tmp_path):
    base, old, adv, mask, ent, _ = make_tensors(2)
    want = _value_and_grad(
        lambda lp: _verl_side(partial(verl_dppo, "tv"), lp, old, adv, mask, 0.15, 0.15, 1e4, "token-sum")[0], base
    )
    got = _value_and_grad(
        lambda lp: ours("dppo_tv", ["algorithm.aggregation=token-sum"], lp, old, adv, mask, ent, None, tmp_path), base
    )
    _close(got, want)


# ---------------------------------------------------------------- TRL's losses

TRL_CASES = [
    # (our config, our overrides, TRL loss_type, TRL settings). TRL's per-sequence means divide by all rows:
    # count_empty_rows=true where our default excludes empty rows.
    ("luspo", ["algorithm.count_empty_rows=true"], "luspo", {"level": "sequence", "eps_low": 2e-3, "eps_high": 2.5e-3}),
    ("luspo", ["algorithm.count_empty_rows=true", "algorithm.loss.eps_low=0.2", "algorithm.loss.eps_high=0.2"],
     "luspo", {"level": "sequence"}),
    ("vespo", [], "vespo", {}),
    ("cispo", ["algorithm.loss.level=sequence"], "cispo", {"level": "sequence", "eps_high": 5.0}),
    ("cispo", ["algorithm.loss.level=sequence", "algorithm.loss.eps_high=0.1"], "cispo",
     {"level": "sequence", "eps_high": 1.1}),
    ("sapo", ["algorithm.count_empty_rows=true", "algorithm.loss.level=sequence"], "sapo", {"level": "sequence"}),
    ("grpo", ["algorithm.count_empty_rows=true", "algorithm.loss.delta=4.0"], "grpo", {"delta": 4.0}),
    ("grpo", ["algorithm.count_empty_rows=true", "algorithm.loss.delta=1.1"], "grpo", {"delta": 1.1}),
    # TRL's recipe for INTELLECT-2 leaves loss_type at dapo; its KL term is test_trl_parity's
    ("intellect_2", ["algorithm.kl.coef=0.0"], "dapo", {"delta": 4.0}),
]  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "method,overrides,loss_type,trl_kwargs",
    TRL_CASES,
    ids=[f"{c[0]}~{c[2]}-{'-'.join(f'{k}{v}' for k, v in c[3].items())}" for c in TRL_CASES],
)
def test_loss_matches_trl(method, overrides, loss_type, trl_kwargs, seed, tmp_path):
    noise = 1.0 if "delta" in trl_kwargs else 0.3  # ratios past δ = 4 need large log-ratios
    base, old, adv, mask, ent, _ = make_tensors(seed, noise=noise)
    got = _value_and_grad(lambda lp: ours(method, overrides, lp, old, adv, mask, ent, None, tmp_path), base)
    formula = _value_and_grad(lambda lp: trl_formula(loss_type, lp, old, adv, mask, **trl_kwargs), base)
    real = _value_and_grad(lambda lp: trl_real(loss_type, lp, old, adv, mask, ent, **trl_kwargs), base)
    _close(formula, real)  # the transcription is TRL's own computation
    _close(got, formula)


def test_delta_below_the_band_is_not_dual_clip(tmp_path):
    """δ = 1.1 < 1 + ε: TRL's δ also caps positive-advantage ratios; dual clip (negative advantages only) cannot
    say that, so the two part here — which is why ppo_clip takes ``delta`` beside ``dual_clip``."""
    base, old, adv, mask, ent, _ = make_tensors(0, noise=1.0)
    with_delta = ours("grpo", ["algorithm.loss.delta=1.1"], base, old, adv, mask, ent, None, tmp_path)
    with_dual = ours("grpo", ["algorithm.loss.dual_clip=1.1"], base, old, adv, mask, ent, None, tmp_path)
    assert not torch.allclose(with_delta, with_dual)
