"""The settings that give the other peer's convention (rlexp/algorithms/CONVENTIONS.md, "to get the other"), each
against that peer's formula on random tensors, and each default against the convention it names.

verl's side is transcribed from verl-project/verl @ 1dda039 (verl/trainer/ppo/core_algos.py:
``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage``, ``compute_policy_loss_vanilla``,
``compute_policy_loss_cispo``, ``compute_policy_loss_sapo``, ``compute_policy_loss_gspo``, ``kl_penalty_forward``,
``agg_loss``; verl/trainer/ppo/metric_utils.py: ``calc_maj_val``). TRL's side is its real
``GRPOTrainer._compute_loss`` (the stand-in of test_trl_parity) and its advantage formula with unscorable rows
(grpo_trainer.py, ``sum_then_normalize``), transcribed with TRL's own ``nanstd``.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo, normalize_rewards
from rlexp.algorithms.advantages.leave_one_out import rloo
from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import cispo, ppo_clip
from rlexp.algorithms.losses.divergence import dppo_tv
from rlexp.algorithms.losses.sequence import gspo
from rlexp.algorithms.losses.soft_gates import sapo
from rlexp.algorithms.regularisers.kl import kl_estimate
from rlexp.core.masks import UNSCORED
from rlexp.evaluation.metrics import majority_pick
from rlexp.rewards.functions import FunctionReward
from rlexp.rewards.scoring import score
from rlexp.rewards.terms import RewardTerm
from rlexp.trainer.metrics import batch_metrics
from rlexp.trainer.optimize import _add_seq_extremes
from tests.algorithms.batches import make_batch
from tests.algorithms.test_peer_parity import verl_agg_loss, verl_dppo
from tests.algorithms.test_trl_parity import B, T, make_tensors, ours, trl_loss, trl_sum_then_normalize

# ---------------------------------------------------------------- verl, transcribed


def verl_grpo(scores, index, epsilon=1e-6, norm_by_std=True):
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, vals in id2score.items():
        if len(vals) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(vals)), torch.std(torch.stack(vals))
    out = scores.clone()
    for i in range(len(scores)):
        out[i] = (
            (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            if norm_by_std
            else scores[i] - id2mean[index[i]]
        )
    return out


def verl_rloo(scores, index):
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2mean = {k: torch.tensor(0.0) if len(v) == 1 else torch.mean(torch.stack(v)) for k, v in id2score.items()}
    out = scores.clone()
    for i in range(len(scores)):
        n = len(id2score[index[i]])
        if n > 1:
            out[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return out


def verl_masked_mean(x, mask):
    return (x * mask).sum() / (mask.sum() + 1e-8)


def verl_vanilla(old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c, mode):
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = verl_masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return verl_agg_loss(pg_losses, response_mask, mode), pg_clipfrac, pg_clipfrac_lower


def verl_cispo(old_log_prob, log_prob, advantages, response_mask, low, high, mode):
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    clipped_ratio_sg = torch.clamp(ratio, 1 - low, 1 + high).detach()
    pg_losses = -clipped_ratio_sg * advantages * log_prob
    pg_clipfrac = verl_masked_mean((ratio != clipped_ratio_sg).float(), response_mask)
    return verl_agg_loss(pg_losses, response_mask, mode), pg_clipfrac


def verl_sapo(old_log_prob, log_prob, advantages, response_mask, tau_pos, tau_neg):
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    taus = torch.where(advantages > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    return verl_agg_loss(-gates * advantages, response_mask, "seq-mean-token-mean")


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, low, high):
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq, max=10.0))
    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    return verl_agg_loss(torch.maximum(pg_losses1, pg_losses2), response_mask, "seq-mean-token-mean")


def verl_low_var_kl(logprob, ref_logprob):
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def verl_calc_maj_val(data):
    vote2vals = defaultdict(list)
    for d in data:
        vote2vals[d["pred"]].append(d["val"])
    vote2cnt = {k: len(v) for k, v in vote2vals.items()}
    return vote2vals[max(vote2cnt, key=vote2cnt.get)][0]


# ---------------------------------------------------------------- helpers


def extreme_tensors(seed, spread=15.0):
    """Random log-probs whose log-ratios reach ±40: past verl's clamps (±20, GSPO's 10)."""
    base, old, _, mask, ent, ref = make_tensors(seed)
    g = torch.Generator().manual_seed(100 + seed)
    old = base + torch.randn(B, T, generator=g) * spread
    adv = torch.randn(B, T, generator=g)
    return base, old.detach(), adv, mask.float(), ent, ref


def value_and_grad(fn, base):
    lp = base.clone().requires_grad_(True)
    out = fn(lp)
    val = out[0] if isinstance(out, tuple) else out
    val.backward()
    return val.detach(), lp.grad


def close(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)


def ours_loss(loss_fn, mode, **kw):
    def run(lp, old, adv, mask):
        out = loss_fn(lp, old, adv, mask, **kw)
        return aggregate(out.per_token, mask, mode, Normaliser.from_mask(mask)), out.token_stats

    return run


def token_mean(stat, mask):
    return float((stat * mask).sum() / mask.sum())


# ---------------------------------------------------------------- singleton groups


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", ["group", "none"])
def test_singleton_raw_matches_verl_grpo(seed, scale):
    g = torch.Generator().manual_seed(seed)
    groups = [0, 0, 0, 1, 2, 2, 3]  # groups 1 and 3 are singletons
    r = torch.randn(len(groups), generator=g)
    gid = torch.tensor(groups)
    want = verl_grpo(r, groups, 1e-6, norm_by_std=scale == "group")
    torch.testing.assert_close(normalize_rewards(r, gid, scale, 1e-6, singleton="raw"), want)
    default = normalize_rewards(r, gid, scale, 1e-6)  # TRL: 0 for a singleton, the rest as verl
    torch.testing.assert_close(default[[3, 6]], torch.zeros(2))
    torch.testing.assert_close(default[[0, 1, 2, 4, 5]], want[[0, 1, 2, 4, 5]])
    b = make_batch(r.tolist(), groups)
    torch.testing.assert_close(rloo(b, singleton="raw"), verl_rloo(r, groups))
    torch.testing.assert_close(rloo(b)[[3, 6]], torch.zeros(2))
    with pytest.raises(ValueError, match="algorithm.advantage.singleton='verl'"):
        grpo(b, singleton="verl")


# ---------------------------------------------------------------- rows whose reward failed


class _Raises(RewardTerm):
    def score(self, sample):
        if sample.completion == "bad":
            raise RuntimeError("no verdict")
        return 1.0


def test_reward_stage_marks_rows_no_term_scored():
    """A row is unscored when every term failed (raised) or returned None; one score from any term scores it."""
    b = make_batch([0.0] * 4, [0, 0, 1, 1])
    b.completions = ["bad", "bad", "ok", "bad"]

    def maybe(completions, **kw):  # TRL's convention: None = does not apply
        return [None, 0.5, None, None]

    score(b, {"raises": _Raises(), "fn": FunctionReward(maybe)})
    assert b.extras[UNSCORED].tolist() == [True, False, False, True]
    torch.testing.assert_close(b.reward, torch.tensor([0.0, 0.5, 1.0, 0.0]))  # scored 0, as before


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_unscored_rows_exclude_matches_trl(seed, scale):
    """TRL: an unscorable row's reward is NaN, left out of the nan-aware group mean/std (or the batch std) and its
    advantage forced to 0. One group keeps a single scored row (TRL: NaN std → 0), one has none."""
    g = torch.Generator().manual_seed(seed)
    G = 4
    rewards = torch.rand(5 * G, generator=g).round(decimals=1)
    unscored = torch.zeros(5 * G, dtype=torch.bool)
    unscored[[1, 6, 12, 13, 14, 16, 17, 18, 19]] = True  # group 3: one scored row; group 4: none
    rewards[unscored] = 0.0  # what our reward stage scores them
    groups = torch.arange(5).repeat_interleave(G)
    b = make_batch(rewards.tolist(), groups.tolist())
    b.extras[UNSCORED] = unscored
    algo = Algorithm(name="t", advantage=lambda batch: grpo(batch, scale=scale, eps=1e-4), loss=ppo_clip)
    algo_x = Algorithm(
        name="t", advantage=lambda batch: grpo(batch, scale=scale, eps=1e-4), loss=ppo_clip, unscored_rows="exclude"
    )
    trl_rewards = rewards.clone()
    trl_rewards[unscored] = float("nan")
    want = trl_sum_then_normalize(trl_rewards, G, scale)
    torch.testing.assert_close(algo_x.compute_advantages(b), want, atol=1e-5, rtol=0)
    assert batch_metrics(b, None)["reward/unscored"] == 9.0
    # the default (verl): scored 0 and counted, so the scored rows' advantages differ from TRL's
    counted = algo.compute_advantages(b)
    torch.testing.assert_close(counted, normalize_rewards(rewards, groups, scale, 1e-4))
    assert not torch.allclose(counted, want, atol=1e-3)


def test_unscored_rows_setting_is_checked():
    with pytest.raises(ValueError, match="algorithm.unscored_rows='drop'"):
        Algorithm(name="t", advantage=grpo, loss=ppo_clip, unscored_rows="drop")


# ---------------------------------------------------------------- log-ratio clamps


@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_clip_log_ratio_clamp_and_clip_fractions_match_verl(seed):
    base, old, adv, mask, *_ = extreme_tensors(seed)
    ours_fn = ours_loss(ppo_clip, "token-mean", eps_low=0.2, eps_high=0.28, dual_clip=3.0, log_ratio_clamp=20.0)
    want = value_and_grad(lambda lp: verl_vanilla(old, lp, adv, mask, 0.2, 0.28, 3.0, "token-mean")[0], base)
    close(value_and_grad(lambda lp: ours_fn(lp, old, adv, mask)[0], base), want)
    # without a dual clip, a negative-advantage token's loss grows with r: past the clamp (TRL, the default,
    # has none) the loss is another
    clamped = ours_loss(ppo_clip, "token-mean", eps_low=0.2, eps_high=0.28, log_ratio_clamp=20.0)
    unclamped = ours_loss(ppo_clip, "token-mean", eps_low=0.2, eps_high=0.28)
    assert float(unclamped(base, old, adv, mask)[0]) > 2 * float(clamped(base, old, adv, mask)[0]) > 0
    # clip fractions: region = verl's pg_clipfrac, dual = verl's pg_clipfrac_lower
    _, stats = ours_fn(base, old, adv, mask)
    _, clipfrac, clipfrac_lower = verl_vanilla(old, base, adv, mask, 0.2, 0.28, 3.0, "token-mean")
    assert token_mean(stats["clip/region_frac"], mask) == pytest.approx(float(clipfrac), abs=1e-6)
    assert token_mean(stats["clip/dual_frac"], mask) == pytest.approx(float(clipfrac_lower), abs=1e-6)
    assert float(clipfrac_lower) > 0  # the dual clip acts on these tensors


@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_log_ratio_clamp_and_bound_frac_match_verl(seed):
    base, old, adv, mask, *_ = extreme_tensors(seed)
    ours_fn = ours_loss(cispo, "token-mean", eps_low=0.2, eps_high=4.0, log_ratio_clamp=20.0)
    close(
        value_and_grad(lambda lp: ours_fn(lp, old, adv, mask)[0], base),
        value_and_grad(lambda lp: verl_cispo(old, lp, adv, mask, 0.2, 4.0, "token-mean")[0], base),
    )
    _, stats = ours_fn(base, old, adv, mask)
    _, clipfrac = verl_cispo(old, base, adv, mask, 0.2, 4.0, "token-mean")
    assert token_mean(stats["clip/bound_frac"], mask) == pytest.approx(float(clipfrac), abs=1e-6)
    region = token_mean(stats["clip/region_frac"], mask)
    assert region < float(clipfrac)  # ours counts only the clips that bind on the advantage's side


@pytest.mark.parametrize("seed", [0, 1])
def test_sapo_log_ratio_clamp_matches_verl(seed):
    base, old, adv, mask, *_ = extreme_tensors(seed, spread=0.5)
    old = old.clone()
    old[0, :3] = base[0, :3] - 30.0  # three tokens past the clamp, where the gate is not yet saturated to 0
    ours_fn = ours_loss(sapo, "seq-mean-token-mean", tau_pos=1.0, tau_neg=1.05, log_ratio_clamp=20.0)
    close(
        value_and_grad(lambda lp: ours_fn(lp, old, adv, mask)[0], base),
        value_and_grad(lambda lp: verl_sapo(old, lp, adv, mask, 1.0, 1.05), base),
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_gspo_sequence_log_ratio_clamp_matches_verl(seed):
    base, old, _, mask, *_ = extreme_tensors(seed, spread=0.3)
    old = old.clone()
    old[0] = base[0] - 12.0  # row 0's sequence log-ratio is 12 > 10
    adv = torch.randn(B, generator=torch.Generator().manual_seed(seed))[:, None].expand(B, T).contiguous()
    adv[0] = -1.0  # a negative advantage: the unclipped (clamped) ratio term is the one that counts
    ours_fn = ours_loss(gspo, "seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4, log_ratio_clamp=10.0)
    want = value_and_grad(lambda lp: verl_gspo(old, lp, adv, mask, 3e-4, 4e-4), base)
    close(value_and_grad(lambda lp: ours_fn(lp, old, adv, mask)[0], base), want)
    unclamped = ours_loss(gspo, "seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4)
    assert not torch.allclose(unclamped(base, old, adv, mask)[0], want[0], rtol=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_dppo_log_ratio_clamp_matches_verl(seed):
    base, old, adv, mask, *_ = extreme_tensors(seed)
    ours_fn = ours_loss(dppo_tv, "token-mean", delta_low=0.15, ratio_cap=3.0, log_ratio_clamp=20.0)
    close(
        value_and_grad(lambda lp: ours_fn(lp, old, adv, mask)[0], base),
        value_and_grad(lambda lp: verl_dppo("tv", old, lp, adv, mask, 0.15, 0.15, 3.0, "token-mean")[0], base),
    )


def test_log_ratio_clamp_must_be_positive():
    base, old, adv, mask, *_ = extreme_tensors(0)
    with pytest.raises(ValueError, match="algorithm.loss.log_ratio_clamp must be > 0"):
        ppo_clip(base, old, adv, mask, log_ratio_clamp=0.0)


# ---------------------------------------------------------------- token-count guard


def test_token_count_guard_eps_matches_verl_for_fractional_weights():
    """The guards differ only where a row's mask weights sum below 1 (a half-weighted one-token row)."""
    base, old, adv, mask, *_ = extreme_tensors(0, spread=0.3)
    weights = torch.tensor([1.0, 0.5, 1.0, 1.0, 0.25, 1.0])[:, None]
    m = mask * weights
    per_token = -adv * torch.exp(base - old)
    want = verl_agg_loss(per_token, m, "seq-mean-token-mean")
    eps = Normaliser.from_mask(m, token_count_guard="eps")
    torch.testing.assert_close(aggregate(per_token, m, "seq-mean-token-mean", eps), want)
    clamp = aggregate(per_token, m, "seq-mean-token-mean", Normaliser.from_mask(m))
    assert not torch.allclose(clamp, want)
    # 0/1 masks (every mask rlexp builds today): the same
    torch.testing.assert_close(
        aggregate(per_token, mask, "seq-mean-token-mean", Normaliser.from_mask(mask, token_count_guard="eps")),
        aggregate(per_token, mask, "seq-mean-token-mean", Normaliser.from_mask(mask)),
    )
    with pytest.raises(ValueError, match="algorithm.token_count_guard='1e-8'"):
        Normaliser.from_mask(mask, token_count_guard="1e-8")


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize("seed", [0, 1])
def test_k3_clamp_matches_verl_low_var_kl(seed):
    base, old, *_ = extreme_tensors(seed)
    ref = old  # log-ratios up to ±40
    lp = base.clone().requires_grad_(True)
    lp2 = base.clone().requires_grad_(True)
    got, want = kl_estimate(lp, ref, "k3", clamp=True), verl_low_var_kl(lp2, ref)
    torch.testing.assert_close(got, want)
    got.sum().backward(), want.sum().backward()
    torch.testing.assert_close(lp.grad, lp2.grad)
    assert (kl_estimate(base, ref, "k3") > 10).any()  # unclamped (TRL, the default) goes past 10
    with pytest.raises(ValueError, match="algorithm.kl.clamp=true"):
        kl_estimate(base, ref, "k1", clamp=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_kl_bias_correction_matches_trl(seed, tmp_path):
    """TRL's default use_bias_correction_kl=True: the k3 term times the token ratio, value and gradient."""
    base, old, adv, mask, ent, ref = make_tensors(seed)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
        "ref_per_token_logps": ref,
    }
    overrides = ["algorithm.count_empty_rows=true", "algorithm.kl.coef=0.04", "algorithm.kl.bias_correction=true"]
    want = value_and_grad(lambda lp: trl_loss("grpo", lp, inputs, ent, beta=0.04, use_bias_correction_kl=True), base)
    got = value_and_grad(lambda lp: ours("grpo", overrides, lp, old, adv, mask, ent, ref, tmp_path), base)
    close(got, want)
    plain = value_and_grad(lambda lp: ours("grpo", overrides[:2], lp, old, adv, mask, ent, ref, tmp_path), base)
    assert not torch.allclose(plain[1], want[1], atol=1e-4)


# ---------------------------------------------------------------- clip fractions against TRL's own metrics


@pytest.mark.parametrize("seed", [0, 2])  # seeds where some sequence is high-clipped
def test_clip_fractions_match_trl_metrics(seed):
    base, old, adv, mask, ent, ref = make_tensors(seed, noise=0.5)
    metrics = defaultdict(list)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    trl_loss("dapo", base, inputs, ent, eps_low=0.2, eps_high=0.28, metrics=metrics)
    out = ppo_clip(base, old, adv, mask, eps_low=0.2, eps_high=0.28)
    m = mask.float()
    for ours_key, trl_key in (
        ("clip/low_frac", "clip_ratio/low_mean"),
        ("clip/high_frac", "clip_ratio/high_mean"),
        ("clip/region_frac", "clip_ratio/region_mean"),
    ):
        assert token_mean(out.token_stats[ours_key], m) == pytest.approx(metrics[trl_key][0], abs=1e-6)
    assert metrics["clip_ratio/region_mean"][0] > 0
    # TRL's per-sequence extremes, as the trainer folds them over an optimiser step's micro-batches
    acc = {}
    _add_seq_extremes(acc, {k: v[:3] for k, v in out.token_stats.items()}, m[:3])
    _add_seq_extremes(acc, {k: v[3:] for k, v in out.token_stats.items()}, m[3:])
    assert float(acc["clip/low_seq_min"]) == pytest.approx(metrics["clip_ratio/low_min"][0], abs=1e-6)
    assert float(acc["clip/high_seq_max"]) == pytest.approx(metrics["clip_ratio/high_max"][0], abs=1e-6)
    assert metrics["clip_ratio/high_max"][0] > 0


# ---------------------------------------------------------------- maj@k: a missing answer's vote


def test_missing_answer_vote_matches_verl_calc_maj_val():
    """verl's calc_maj_val: the prediction is the vote key, a missing one (None) included; the first value of the
    most-voted key (first appearance on ties). Ours with missing=vote, tie=first, on random votes."""
    rng = random.Random(0)
    for _ in range(500):
        k = rng.randint(1, 7)
        preds = [rng.choice([None, 0, 1, 2]) for _ in range(k)]
        correct_of = {0: 1.0, 1: 0.0, 2: 0.0}
        data = [{"pred": p, "val": 0.0 if p is None else correct_of[p]} for p in preds]
        assert majority_pick(preds, correct_of, "first", missing="vote") == verl_calc_maj_val(data)
    # the default: a missing answer abstains — two missing answers do not outvote one correct answer
    assert majority_pick([None, None, 0], {0: 1.0}, "first") == 1.0
    assert majority_pick([None, None, 0], {0: 1.0}, "first", missing="vote") == 0.0
    with pytest.raises(ValueError, match="eval.maj_missing='count'"):
        majority_pick([0], {0: 1.0}, missing="count")


def verl_kl_penalty(logprob, ref_logprob, name):
    """verl kl_penalty: a trailing '+' keeps the estimator's value and takes k2's gradient."""
    base = name[:-1] if name.endswith("+") else name
    if base == "k1":
        forward = logprob - ref_logprob
    elif base == "abs":
        forward = (logprob - ref_logprob).abs()
    else:
        forward = verl_low_var_kl(logprob, ref_logprob)
    if not name.endswith("+"):
        return forward
    backward = 0.5 * (logprob - ref_logprob).square()
    return backward - backward.detach() + forward.detach()


@pytest.mark.parametrize("name", ["k1+", "k3+", "abs+"])
def test_straight_through_estimators_match_verl(name):
    base, old, *_ = extreme_tensors(0, spread=1.0)
    lp, lp2 = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    got = kl_estimate(lp, old, name, clamp=name == "k3+")
    want = verl_kl_penalty(lp2, old, name)
    torch.testing.assert_close(got, want)
    got.sum().backward(), want.sum().backward()
    torch.testing.assert_close(lp.grad, lp2.grad)
    torch.testing.assert_close(lp.grad, base - old)  # k2's gradient: log π_θ − log π_ref


@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_token_level_batch_step_matches_verl(seed):
    """verl's gdpo: the weighted sum of each term's GRPO advantage, whitened over the valid tokens."""
    from rlexp.algorithms.advantages.multi_reward import gdpo
    from tests.algorithms.test_token_rewards import verl_masked_whiten

    g = torch.Generator().manual_seed(seed)
    G = 4
    groups = torch.arange(3).repeat_interleave(G).tolist()
    terms = (torch.rand(3 * G, 2, generator=g) > 0.5).float()
    weights = torch.tensor([1.0, 0.5])
    lengths = torch.randint(0, 6, (3 * G,), generator=g).tolist()
    b = make_batch(None, groups, lengths=lengths, width=6, terms=terms.tolist(), weights=weights.tolist())
    mask = b.completion_mask.float()
    summed = sum(weights[k] * verl_grpo(terms[:, k].clone(), groups) for k in range(2))
    want = verl_masked_whiten(summed[:, None] * mask, mask) * mask
    torch.testing.assert_close(gdpo(b, batch_level="token"), want, atol=1e-5, rtol=1e-5)
    seq = gdpo(b)  # the default (TRL): one value per completion
    assert seq.shape == (3 * G,)
    with pytest.raises(ValueError, match="algorithm.advantage.batch_level='tokens'"):
        gdpo(b, batch_level="tokens")
