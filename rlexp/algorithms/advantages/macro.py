"""GAE over macro actions: MA-RLHF's MA-PPO ("MA-RLHF: Reinforcement Learning from Human Feedback with Macro Actions",
Chai et al., ICLR 2025, arXiv 2410.02743; released code ernie-research/MA-RLHF, ``dschat/rlhf/ppo_trainer.py``).

Each completion is cut into macro actions ω_1 … ω_M (token segments) by a termination rule (``termination``):

* ``fixed`` (the release's default, n = ``ngram`` = 5): a macro every n valid tokens;
* ``randomized``: macro lengths drawn from {1, 2, 3, 5, 10}, each ``repeat_times`` times, shuffled; the tokens left
  after the list is spent form one last macro (the release's "length ∞");
* ``ppl``: a new macro begins at token t when the next token's perplexity is higher than token t's,
  ppl_{t+1} > ppl_t ⇔ log p_{t+1} < log p_t (the release's ``ppl_selection``, which reads the reference model's
  log-probs: ``batch.ref_logprobs``, else the sampling policy's when no reference was computed).

In every rule the completion's last token is a macro of its own (the release's cut at the last position; its note:
otherwise the outcome reward would be averaged with the KL rewards of the macro's other tokens), and the first
token starts the first macro. ``fixed`` with n = 1 is token-level PPO (the release's vanilla PPO).

A macro's value and reward are σ-weighted sums of its tokens' (``value_function``, the release's
``modeling_macro_action``): ``equal`` (default) σ = 1/|ω| — the mean; ``unit`` σ = 1 on the macro's last token;
``position`` σ_k ∝ 1/(k+1) for its k-th token. The token rewards are
:func:`~rlexp.algorithms.advantages.reinforce.token_level_rewards` (the outcome at the last token, −β·KL_t at each
token under ``algorithm.kl.mode=reward``). GAE then runs over the macro steps (V after the last macro 0):

    δ_τ = R_τ + γ·V_{τ+1} − V_τ,   A_τ = δ_τ + γλ·A_{τ+1},   G_τ = A_τ + V_τ,

and every token of macro τ gets A_τ (the actor's per-token clipped ratio, ``ppo_clip``, then uses the macro's
advantage on each token — the release's ``actor_loss_fn``) and G_τ as its value target (the critic regresses every
token's value on its macro's return — the release's ``critic_loss_fn``). ``whiten`` standardises A over the valid
tokens (the release does not whiten). Returns (N, T); ``batch.extras["returns"]`` as ``gae``.

Stats: ``ma_rlhf/macro_len_mean`` (valid tokens per macro over the batch), ``ma_rlhf/macros_per_row`` (mean M over
rows with tokens), ``ma_rlhf/macro_adv_abs_mean`` (mean |A_τ| over the macros, before whitening)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.reinforce import token_level_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import masked_whiten

TERMINATIONS = ("fixed", "randomized", "ppl", "parsing")
VALUE_FUNCTIONS = ("equal", "unit", "position")
RANDOMIZED_LENGTHS = (1, 2, 3, 5, 10)  # the release's randomized n-gram lengths


def macro_starts(
    mask: torch.Tensor,
    termination: str = "fixed",
    ngram: int = 5,
    repeat_times: int = 3,
    logprobs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(N, T) bool: True on the valid token that begins each macro action (module doc). ``mask`` (N, T) marks the valid
    tokens; ``logprobs`` (N, T) are read by ``termination="ppl"``."""
    if termination not in TERMINATIONS:
        raise ValueError(f"algorithm.advantage.termination={termination!r} is not one of {list(TERMINATIONS)}")
    if termination == "parsing":
        raise ValueError(
            "algorithm.advantage.termination='parsing' needs a constituency parser (the release's Constituent-Treelib "
            "over spaCy/benepar), which rlexp does not ship: use fixed, randomized or ppl"
        )
    valid = mask.bool()
    k = valid.long().cumsum(-1) - 1  # index of each valid token among its row's valid tokens
    length = valid.long().sum(-1, keepdim=True)
    last = valid & (k == length - 1)
    first = valid & (k == 0)
    if termination == "fixed":
        if ngram < 1:
            raise ValueError(f"algorithm.advantage.ngram={ngram} must be >= 1")
        return first | last | (valid & (k % ngram == 0))
    if termination == "randomized":
        if repeat_times < 1:
            raise ValueError(f"algorithm.advantage.repeat_times={repeat_times} must be >= 1")
        lengths = torch.tensor(RANDOMIZED_LENGTHS).repeat_interleave(repeat_times)
        starts = first | last
        for i in range(mask.shape[0]):
            order = lengths[torch.randperm(len(lengths), generator=generator)]
            cuts = order.cumsum(0)  # valid-token indices where a new macro begins
            row = torch.zeros(mask.shape[1] + int(cuts[-1]) + 1, dtype=torch.bool)
            row[cuts] = True
            hit = row[k[i].clamp(min=0)].to(mask.device) & valid[i]
            starts[i] |= hit
        return starts
    # ppl: a cut at token t when log p_{t+1} < log p_t (the next token's perplexity is higher)
    if logprobs is None:
        raise ValueError("algorithm.advantage.termination='ppl' needs per-token log-probs")
    lp = logprobs.float()
    nxt = torch.cat([lp[:, 1:], lp[:, -1:]], dim=-1)
    nxt_valid = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], dim=-1)
    return first | last | (valid & nxt_valid & (nxt < lp))


def macro_weights(starts: torch.Tensor, mask: torch.Tensor, value_function: str = "equal"):
    """(macro id (N, T) long, −1 on padding; σ (N, T), the token's weight within its macro; number of macros M (N,))."""
    if value_function not in VALUE_FUNCTIONS:
        raise ValueError(f"algorithm.advantage.value_function={value_function!r} is not one of {list(VALUE_FUNCTIONS)}")
    valid = mask.bool()
    starts = starts & valid
    ids = torch.where(valid, starts.long().cumsum(-1) - 1, torch.full_like(starts, -1, dtype=torch.long))
    count = starts.long().sum(-1)
    N, T = mask.shape
    width = max(int(count.max()) if N else 0, 1)
    safe = ids.clamp(min=0)
    sizes = torch.zeros(N, width, device=mask.device).scatter_add_(1, safe, valid.float())
    if value_function == "equal":
        sigma = 1.0 / sizes.gather(1, safe).clamp(min=1)
    else:
        t = torch.arange(T, device=mask.device).expand(N, T)
        begin = torch.where(starts, t, torch.zeros_like(t)).cummax(-1).values
        pos = (valid.long().cumsum(-1) - valid.long().cumsum(-1).gather(1, begin)).float()  # k within the macro
        if value_function == "unit":
            sigma = (pos == sizes.gather(1, safe) - 1).float()
        else:
            raw = 1.0 / (pos + 1.0) * valid.float()
            norm = torch.zeros(N, width, device=mask.device).scatter_add_(1, safe, raw)
            sigma = raw / norm.gather(1, safe).clamp(min=1e-12)
    return ids, sigma * valid.float(), count


def macro_sum(x: torch.Tensor, ids: torch.Tensor, sigma: torch.Tensor, width: int) -> torch.Tensor:
    """(N, width): Σ over each macro's tokens of σ·x."""
    out = torch.zeros(x.shape[0], width, device=x.device, dtype=torch.float32)
    return out.scatter_add_(1, ids.clamp(min=0), (sigma * x.float()) * (ids >= 0).float())


@ADVANTAGES.register
def macro_gae(
    batch: RolloutBatch,
    termination: str = "fixed",
    ngram: int = 5,
    repeat_times: int = 3,
    value_function: str = "equal",
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = False,
    eps: float = 1e-8,
) -> torch.Tensor:
    """MA-PPO's advantages: GAE over macro actions (module doc). Needs ``batch.values`` from the critic. (N, T)."""
    if batch.values is None:
        raise ValueError("advantage macro_gae needs batch.values: configure algorithm.critic")
    mask = batch.completion_mask.float()
    lp = None
    if termination == "ppl":
        lp = batch.ref_logprobs if batch.ref_logprobs is not None else batch.sampling_logprobs
        lp = lp.to(mask.device)
    starts = macro_starts(mask, termination, ngram, repeat_times, lp)
    ids, sigma, count = macro_weights(starts, mask, value_function)
    N, T = mask.shape
    width = max(int(count.max()) if N else 0, 1)
    values = batch.values.float().to(mask.device) * mask
    v = macro_sum(values, ids, sigma, width)
    r = macro_sum(token_level_rewards(batch), ids, sigma, width)
    live = (torch.arange(width, device=mask.device)[None, :] < count[:, None]).float()
    adv = torch.zeros(N, width, device=mask.device)
    running = torch.zeros(N, device=mask.device)
    next_value = torch.zeros(N, device=mask.device)
    for tau in reversed(range(width)):
        m = live[:, tau]
        delta = r[:, tau] + gamma * next_value - v[:, tau]
        running = (delta + gamma * lam * running) * m
        next_value = v[:, tau] * m
        adv[:, tau] = running
    returns = adv + v
    safe = ids.clamp(min=0)
    token_adv = adv.gather(1, safe) * mask
    batch.extras["returns"] = returns.gather(1, safe) * mask
    rows = count > 0
    total = float(count.sum())
    batch.stats["ma_rlhf/macro_len_mean"] = float(mask.sum()) / max(total, 1.0)
    batch.stats["ma_rlhf/macros_per_row"] = float(count[rows].float().mean()) if bool(rows.any()) else 0.0
    batch.stats["ma_rlhf/macro_adv_abs_mean"] = float((adv.abs() * live).sum()) / max(total, 1.0)
    if whiten:
        token_adv = masked_whiten(token_adv, mask, eps) * mask
    return token_adv


macro_gae.token_rewards = True  # consumes batch.extras["token_rewards"] (Algorithm.compute_advantages)
