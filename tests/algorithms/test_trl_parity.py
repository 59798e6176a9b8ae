"""Our losses and reward scalings against TRL 1.16's, on the same random tensors (within 1e-5).

Losses: TRL's real ``GRPOTrainer._compute_loss`` is called, unbound, on a stand-in ``self`` that
carries the settings it reads and returns our tensors from ``_get_per_token_logps_and_entropies``
(single process, no gradient accumulation, no vLLM, ``use_bias_correction_kl=False``). Our side is
the shipped method config (conf/algorithm/<method>.yaml, composed by Hydra) run through
``Algorithm.token_loss`` and ``aggregate`` — the path the trainer takes. Where our default
convention differs on purpose, the test sets the documented option (``count_empty_rows=true``:
TRL divides per-sequence means by all rows).

Reward scaling: TRL computes advantages inside the 613-line ``_generate_and_score_completions``,
which cannot be called standalone; its formula is transcribed below from
trl/trainer/grpo_trainer.py (L2754-2812, ``sum_then_normalize`` and ``normalize_then_sum``), using
TRL's own ``nanstd``.
"""

from collections import defaultdict
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.algorithms.advantages.multi_reward import gdpo
from rlexp.algorithms.aggregation import Normaliser, aggregate
from tests.algorithms.batches import make_batch
from tests.conftest import TINY, compose_train

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
from trl.trainer.utils import nanstd  # noqa: E402

B, T = 6, 7


class _Accelerator:
    num_processes = 1

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def gather_for_metrics(self, x):
        return x


def trl_loss(
    loss_type,
    logp,
    inputs,
    entropies,
    *,
    eps_low=0.2,
    eps_high=0.2,
    level="token",
    beta=0.0,
    top_entropy_quantile=1.0,
    tau_pos=1.0,
    tau_neg=1.05,
    use_bias_correction_kl=False,
    metrics=None,
):
    stub = SimpleNamespace(
        top_entropy_quantile=top_entropy_quantile,
        accelerator=_Accelerator(),
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
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
        _metrics={"train": defaultdict(list) if metrics is None else metrics, "eval": defaultdict(list)},
        args=SimpleNamespace(
            use_bias_correction_kl=use_bias_correction_kl,
            delta=None,
            sapo_temperature_pos=tau_pos,
            sapo_temperature_neg=tau_neg,
            steps_per_generation=1,
        ),
    )
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropies, None)
    stub.get_high_entropy_mask = partial(trl_grpo.GRPOTrainer.get_high_entropy_mask, stub)
    return trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)


def make_tensors(seed, noise=0.3, seq_advantage=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 1, 4, 0, 6, 3])  # a single-token row and an empty row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    base = -torch.rand(B, T, generator=g) * 3 - 0.05
    old = base + torch.randn(B, T, generator=g) * noise
    adv = torch.randn(B, generator=g) if seq_advantage else torch.randn(B, T, generator=g)
    ent = torch.rand(B, T, generator=g) * 2
    ref = base + torch.randn(B, T, generator=g) * 0.2
    return base, old, adv, mask, ent, ref


def ours(method, overrides, logp, old, adv, mask, ent, ref, tmp_path):
    cfg = compose_train([*TINY, f"algorithm={method}", f"trainer.max_new_tokens={T}", *overrides], tmp_path / "run")
    algo = instantiate(cfg.algorithm, _convert_="all")
    out = algo.token_loss(logp, old, adv, mask, ent, ref)
    norm = Normaliser.from_mask(mask, algo.count_empty_rows, algo.norm_length)
    return aggregate(out.per_token, mask, algo.aggregation, norm)


CASES = [
    # (our method, our overrides, TRL loss_type, TRL settings)
    ("grpo", ["algorithm.count_empty_rows=true"], "grpo", {}),
    ("dr_grpo", [], "dr_grpo", {}),
    ("dapo", [], "dapo", {"eps_high": 0.28}),
    # TRL's `bnpo` loss type is a token-mean normaliser; our bnpo config carries BNPO's released run (seq-mean-
    # token-sum, dual clip 10): the token-mean aggregation and no dual clip give TRL's form
    ("bnpo", ["algorithm.aggregation=token-mean", "algorithm.loss.dual_clip=null"], "bnpo", {"eps_high": 0.28}),
    ("cispo", [], "cispo", {"eps_high": 5.0}),
    ("sapo", ["algorithm.count_empty_rows=true"], "sapo", {}),
    ("gspo", ["algorithm.count_empty_rows=true"], "grpo", {"level": "sequence", "eps_low": 3e-4, "eps_high": 4e-4}),
    (
        "gspo",
        ["algorithm.count_empty_rows=true", "algorithm.loss.eps_low=0.2", "algorithm.loss.eps_high=0.2"],
        "grpo",
        {"level": "sequence"},
    ),
    # TRL divides the 80/20 loss by all tokens; our config follows the authors (selected tokens only)
    ("dapo_8020", ["algorithm.top_entropy_normaliser=all"], "dapo", {"eps_high": 0.28, "top_entropy_quantile": 0.2}),
    ("grpo", ["algorithm.count_empty_rows=true", "algorithm.kl.coef=0.04"], "grpo", {"beta": 0.04}),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "method,overrides,loss_type,trl_kwargs",
    CASES,
    ids=[f"{c[0]}~{c[2]}{'-' + '-'.join(f'{k}{v}' for k, v in c[3].items()) if c[3] else ''}" for c in CASES],
)
def test_loss_and_gradient_match_trl(method, overrides, loss_type, trl_kwargs, seed, tmp_path):
    base, old, adv, mask, ent, ref = make_tensors(seed)
    lp_ours = base.clone().requires_grad_(True)
    lp_trl = base.clone().requires_grad_(True)
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
    expected = trl_loss(loss_type, lp_trl, inputs, ent, **trl_kwargs)
    got = ours(method, overrides, lp_ours, old, adv, mask, ent, ref, tmp_path)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    expected.backward()
    got.backward()
    torch.testing.assert_close(lp_ours.grad, lp_trl.grad, atol=1e-5, rtol=0)


def test_on_policy_ratio_one_matches_trl(tmp_path):
    """μ = 1: old log-probs are logp.detach() on both sides (TRL drops old_per_token_logps)."""
    base, _, adv, mask, ent, ref = make_tensors(3)
    lp_ours, lp_trl = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "num_items_in_batch": mask.sum(),
    }
    expected = trl_loss("dapo", lp_trl, inputs, ent, eps_high=0.28)
    got = ours("dapo", [], lp_ours, lp_ours.detach(), adv, mask, ent, None, tmp_path)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    expected.backward(), got.backward()
    torch.testing.assert_close(lp_ours.grad, lp_trl.grad, atol=1e-5, rtol=0)


# ---- reward scaling (transcribed) -------------------------------------------------------------------


def trl_sum_then_normalize(rewards, G, scale):
    """grpo_trainer.py L2765-2792 (sum_then_normalize), with the weighted sum already taken."""
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale in ("group", "none"):
        std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    else:
        std = nanstd(rewards).expand_as(rewards)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


def trl_normalize_then_sum(per_func, weights, G):
    """grpo_trainer.py L2794-2803 (normalize_then_sum, GDPO)."""
    grouped = per_func.view(-1, G, per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, per_func.shape[1])
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    std = nanstd(rewards).expand_as(rewards)
    return torch.nan_to_num((rewards - torch.nanmean(rewards)) / (std + 1e-4), nan=0.0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reward_scaling_matches_trl(scale, seed):
    g = torch.Generator().manual_seed(seed)
    G = 4
    rewards = torch.rand(5 * G, generator=g).round(decimals=1)
    rewards[:G] = 0.5  # a zero-variance group
    groups = torch.arange(5).repeat_interleave(G)
    got = normalize_rewards(rewards, groups, scale=scale, eps=1e-4)
    torch.testing.assert_close(got, trl_sum_then_normalize(rewards, G, scale), atol=1e-5, rtol=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_matches_trl_normalize_then_sum(seed):
    g = torch.Generator().manual_seed(seed)
    G = 4
    terms = (torch.rand(4 * G, 3, generator=g) > 0.5).float()
    terms[:G, 0] = 1.0  # term 0 degenerate in group 0
    weights = torch.tensor([1.0, 0.2, 0.5])
    batch = make_batch(
        None, torch.arange(4).repeat_interleave(G).tolist(), terms=terms.tolist(), weights=weights.tolist()
    )
    torch.testing.assert_close(gdpo(batch, eps=1e-4), trl_normalize_then_sum(terms, weights, G), atol=1e-5, rtol=0)
