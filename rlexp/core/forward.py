"""Per-token log-probs (and entropies) of completion tokens under a causal LM.

Only the completion positions go through the LM head (``logits_to_keep``), so full-vocabulary
logits exist for at most one micro-batch of completion tokens at a time. Position ids follow the
attention mask, matching ``generate`` with left-padded prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlexp.models.heads import last_position


def sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask):
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention = torch.cat([prompt_mask, completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention, positions


def padded_causal_mask(mask: torch.Tensor) -> torch.Tensor:
    """(N, 1, L, L) boolean attention mask: causal, padding keys hidden, and every padding query
    attending to itself. Without that last part the left-padding query rows are fully masked, and
    the fused SDPA kernels on CUDA return NaN gradients for such rows once sequences pass ~128
    tokens (seen on an H100 with torch 2.11: finite loss, NaN grad norm). transformers uses a 4D mask
    as given."""
    L = mask.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=mask.device).tril()
    keys = mask.bool()[:, None, None, :] | torch.eye(L, dtype=torch.bool, device=mask.device)
    return causal & keys


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """(N, T, V) logits predicting each completion token: one forward of every row (no prompt sharing), only the
    completion positions through the LM head."""
    input_ids, attention, positions = sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    return model(
        input_ids=input_ids,
        attention_mask=padded_causal_mask(attention),
        position_ids=positions,
        logits_to_keep=completion_ids.shape[1] + 1,
        use_cache=False,
    ).logits[:, :-1]


def token_logprobs(
    model,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    temperature: float = 1.0,
    with_entropy: bool = False,
    autocast_dtype: torch.dtype | None = None,
    entropy_grad: bool = False,
    share_prompts: bool = True,
    prompt_groups: PromptGroups | None = None,
    support: torch.Tensor | None = None,
    topk: int = 0,
    vocab_mask: torch.Tensor | None = None,
    entropy_clamp: float = 0.0,
    minp_proxy: float = 0.0,
    vocab_mean: bool = False,
    hidden_out: list | None = None,
):
    """(N, T) log π(token) at ``temperature``, and (N, T) token entropies if asked. With
    ``autocast_dtype`` the model's matmuls run in that dtype (weights stay fp32); log-softmax is fp32.

    ``share_prompts``: rows with the same prompt (the G completions of a group) run the prompt
    through the model once and reuse its KV cache (gradients flow back through it), which removes
    (G−1)/G of the prompt compute; the result equals the unshared forward. ``prompt_groups``: which
    rows share a prompt, worked out beforehand (``PromptGroups.from_index``), so the forward needs no
    device round trip; otherwise found with ``torch.unique`` on the device.

    ``support`` (N, T, S) vocabulary ids and/or ``topk`` K > 0 (a trust-region loss, TROLL): the log-probs on those
    ids (with gradient) and/or the top-K ids and log-probs of each position come back as a third value, a dict with
    ``support_logp`` (N, T, S), ``topk_idx`` and ``topk_logp`` (N, T, K); these go through the full-vocabulary
    log-softmax of each piece. ``vocab_mask`` (N, T, V) bool (NLPO's action mask): the log-softmax is taken over the
    allowed tokens only (the others' logits −inf), so log-probs and entropies are those of the renormalised policy.
    ``entropy_clamp`` p > 0 (AEnt's entropy bonus): the third value also holds ``clamped_entropy`` (N, T), with
    gradient, the entropy renormalised on each position's top (1 − p) share of the vocabulary (``clamped_entropy``).
    ``minp_proxy`` κ > 0 (Lp-Reg): the third value holds ``proxy_logp`` (N, T), the token's log-prob under the policy
    renormalised on the tokens with probability ≥ κ × the position's largest (−1e4 for a token filtered out).
    ``vocab_mean`` (ROVER): the third value holds ``mean_logp`` (N, T), no gradient, the mean over the vocabulary of
    log π(v) at each position (``vocab_mean_logprobs``).
    ``hidden_out`` (VERL): a list that receives the (N, T, d) final hidden states (the final norm's output) that
    predict each completion token, from the same forward (no gradient)."""
    if vocab_mean and vocab_mask is not None:
        raise ValueError("the vocabulary mean of the log-probs is not defined under an action mask (NLPO)")
    captured: list[torch.Tensor] = []
    with (
        torch.autocast(
            prompt_ids.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
        ),
        _capture_final_hidden(model, captured if hidden_out is not None else None),
    ):
        pieces, groups = None, None
        if share_prompts:
            groups = prompt_groups or PromptGroups.from_index(
                torch.unique(prompt_ids, dim=0, return_inverse=True)[1], prompt_ids.device
            )
            if groups is not None:
                pieces = _shared_prefix_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, groups)
        if pieces is None:
            pieces = [completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask)]
    if hidden_out is not None:
        hidden_out.append(_completion_hidden(captured, prompt_ids.shape[1], groups))
    # per piece of logits (the shared path's first token and the rest: never concatenated, a copy
    # of N × T × V logits), then the small (N, t) results are joined
    logps, entropies, start = [], [], 0
    # a third value comes back
    sparse = support is not None or topk > 0 or entropy_clamp > 0 or minp_proxy > 0 or vocab_mean
    # the full-vocabulary log-softmax (its gradient kept): what needs more than the sampled token's log-prob (ROVER's
    # vocabulary mean does not: it is taken in chunks, without gradient)
    full = support is not None or topk > 0 or entropy_clamp > 0 or minp_proxy > 0 or vocab_mask is not None
    extra: dict[str, list] = {
        "support_logp": [],
        "topk_idx": [],
        "topk_logp": [],
        "clamped_entropy": [],
        "proxy_logp": [],
        "mean_logp": [],
    }
    for logits in pieces:
        tokens = completion_ids[:, start : start + logits.shape[1]]
        if full:  # the full-vocabulary log-softmax (of the allowed tokens), gathered where asked
            scaled = logits.float() / temperature
            if vocab_mask is not None:
                scaled = scaled.masked_fill(~vocab_mask[:, start : start + logits.shape[1]], float("-inf"))
            logp_all = torch.log_softmax(scaled, -1)
            lp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            ent = None
            if with_entropy:
                p_all = logp_all.exp()
                ent = -torch.where(p_all > 0, p_all * logp_all, torch.zeros_like(p_all)).sum(-1)
                ent = ent if entropy_grad else ent.detach()
            if support is not None:
                extra["support_logp"].append(logp_all.gather(-1, support[:, start : start + logits.shape[1]]))
            if entropy_clamp > 0:
                extra["clamped_entropy"].append(clamped_entropy(scaled, entropy_clamp))
            if minp_proxy > 0:
                extra["proxy_logp"].append(minp_proxy_logprobs(logp_all, tokens, minp_proxy))
            if vocab_mean:
                extra["mean_logp"].append(logp_all.detach().mean(-1))
            if topk > 0:
                values, ids = logp_all.detach().topk(min(topk, logp_all.shape[-1]), -1)
                extra["topk_idx"].append(ids)
                extra["topk_logp"].append(values)
            start += logits.shape[1]
            logps.append(lp)
            entropies.append(ent)
            continue
        start += logits.shape[1]
        if vocab_mean:  # chunked, no gradient: no (N, T, V) fp32 tensor
            extra["mean_logp"].append(vocab_mean_logprobs(logits, temperature))
        if not (with_entropy and entropy_grad and torch.is_grad_enabled()):
            lp, ent = selected_logprobs(logits, tokens, temperature, with_entropy)
        else:  # an entropy bonus needs the entropy's gradient: the plain full-vocabulary form
            logp_all = torch.log_softmax(logits.float() / temperature, -1)
            lp, ent = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)
        logps.append(lp)
        entropies.append(ent)
    logp = logps[0] if len(logps) == 1 else torch.cat(logps, 1)
    entropy = None
    if with_entropy:
        entropy = entropies[0] if len(entropies) == 1 else torch.cat(entropies, 1)
    if not sparse:
        return logp, entropy
    return logp, entropy, {k: torch.cat(v, 1) for k, v in extra.items() if v}


class _capture_final_hidden:
    """Context: a forward hook on the model's final norm (``model.get_decoder().norm``, Llama / Qwen families) that
    appends its outputs, detached, to ``into``; nothing when ``into`` is None."""

    def __init__(self, model, into: list | None):
        self.model, self.into, self.handle = model, into, None

    def __enter__(self):
        if self.into is None:
            return self
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        norm = getattr(decoder, "norm", None)
        if norm is None:
            raise ValueError("hidden states (VERL): the model has no final norm at model.get_decoder().norm")
        into = self.into
        self.handle = norm.register_forward_hook(lambda _m, _i, out: into.append(out.detach()))
        return self

    def __exit__(self, *exc):
        if self.handle is not None:
            self.handle.remove()
        return False


def _completion_hidden(captured: list[torch.Tensor], prompt_len: int, groups: PromptGroups | None) -> torch.Tensor:
    """(N, T, d) the final hidden states predicting each completion token, from the final norm's outputs: of the
    unshared forward (N, P + T, d), or (``groups``) of the shared prompts (U, P, d) and the completions
    (N, T − 1, d)."""
    if groups is None:
        return captured[0][:, prompt_len - 1 : -1]
    first = captured[0][:, -1][groups.inverse].unsqueeze(1)  # each row's prompt's last position
    return torch.cat([first, *captured[1:]], 1)


def clamped_entropy(scaled_logits: torch.Tensor, clamp: float) -> torch.Tensor:
    """(…) entropy of the policy renormalised on each position's top (1 − p) share of the vocabulary (AEnt, "On
    Entropy Control in LLM-RL Algorithms", 2025; arXiv 2509.03493): the ⌊p·|V|⌋ tokens with the lowest logits are
    dropped, the rest renormalised, H̃ = −Σ π̃ log π̃ — differentiable through π̃, the dropped set chosen without
    gradient. ``scaled_logits``: (…, V) logits already divided by the temperature. p = 0: the plain entropy."""
    if not 0.0 <= clamp < 1.0:
        raise ValueError(f"entropy clamp p={clamp} must be in [0, 1)")
    x = scaled_logits.float()
    k = int(x.shape[-1] * clamp)
    if k == 0:
        logp = torch.log_softmax(x, -1)
        return -(logp.exp() * logp).sum(-1)
    with torch.no_grad():
        keep = x > torch.kthvalue(x, k, dim=-1, keepdim=True).values  # above the k-th lowest logit
    logp = torch.log_softmax(x.masked_fill(~keep, float("-inf")), -1)
    logp = torch.where(keep, logp, torch.zeros_like(logp))  # 0·(−inf) would make the gradient NaN
    return -(logp.exp() * keep * logp).sum(-1)


@torch.no_grad()
def vocab_mean_logprobs(
    logits: torch.Tensor, temperature: float = 1.0, chunk_elements: int | None = None
) -> torch.Tensor:
    """(…) mean over the vocabulary of log softmax(logits / τ), fp32, no gradient: mean_v x_v − logsumexp_v x_v with
    x = logits / τ (ROVER, "Random Policy Valuation is Enough for LLM Reasoning with Verifiable Rewards", 2025: the
    uniform policy's average of Q = ρ·(log π_θ − log π_old) over the next state's actions is ρ times the difference of
    this mean under the two policies). Chunked over rows like ``selected_logprobs``."""
    V = logits.shape[-1]
    if chunk_elements is None:
        chunk_elements = 2**26 if logits.is_cuda else 2**18
    chunk = max(1, chunk_elements // V)
    flat = logits.reshape(-1, V)
    ct = torch.promote_types(logits.dtype, torch.float32)
    out = torch.empty(flat.shape[0], dtype=ct, device=logits.device)
    for s in range(0, flat.shape[0], chunk):
        x = _scaled(flat[s : s + chunk], ct, temperature)
        out[s : s + chunk] = x.mean(-1) - torch.logsumexp(x, -1)
    return out.view(logits.shape[:-1])


def minp_proxy_logprobs(logp_all: torch.Tensor, tokens: torch.Tensor, kappa: float) -> torch.Tensor:
    """(…) log-prob of ``tokens`` under the min-p proxy of the distribution ``logp_all`` (…, V) (Lp-Reg,
    "Low-probability Tokens Sustain Exploration in Reinforcement Learning with Verifiable Reward", 2025; arXiv
    2510.03222): the tokens with p ≥ κ·max p kept and renormalised; a token filtered out gets −1e4 (as its logit in the
    released code)."""
    with torch.no_grad():
        lp = logp_all.detach().float()
        keep = lp >= lp.max(-1, keepdim=True).values + torch.log(torch.tensor(kappa))
        kept_lse = torch.logsumexp(lp.masked_fill(~keep, float("-inf")), -1)
        picked = lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        kept = keep.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return torch.where(kept, picked - kept_lse, torch.full_like(picked, -1e4))


class _SelectedLogprobs(torch.autograd.Function):
    """log softmax(logits / τ)[token] (and, without gradient, the entropy of softmax(logits / τ)),
    computed in fp32 over chunks of rows: the forward keeps only the logits (in their own dtype)
    and one log-sum-exp per token; the backward recomputes each chunk's softmax,
    ∂logp/∂logits = (onehot − softmax) / τ. No (N, T, V) fp32 tensor is ever alive — the
    full-vocabulary log-softmax, its exp for the entropy and its gradient were 3–5 of them."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature: float, with_entropy: bool, chunk: int):
        V = logits.shape[-1]
        flat, tok = logits.reshape(-1, V), tokens.reshape(-1)
        ct = torch.promote_types(logits.dtype, torch.float32)  # compute dtype: fp32 (fp64 stays fp64)
        lse = torch.empty(flat.shape[0], dtype=ct, device=logits.device)
        picked = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        for s in range(0, flat.shape[0], chunk):
            x = _scaled(flat[s : s + chunk], ct, temperature)
            lse[s : s + chunk] = torch.logsumexp(x, -1)
            picked[s : s + chunk] = x.gather(-1, tok[s : s + chunk, None]).squeeze(-1)
            if with_entropy:  # H = lse − Σ p·x
                entropy[s : s + chunk] = lse[s : s + chunk] - (torch.softmax(x, -1) * x).sum(-1)
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        entropy = entropy.view(tokens.shape) if with_entropy else entropy
        ctx.mark_non_differentiable(entropy)
        return (picked - lse).view(tokens.shape), entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        logits, tokens, lse = ctx.saved_tensors
        V, tau = logits.shape[-1], ctx.temperature
        flat, tok, g = logits.reshape(-1, V), tokens.reshape(-1), grad_logp.reshape(-1).to(lse.dtype)
        grad = torch.empty_like(flat)
        for s in range(0, flat.shape[0], ctx.chunk):
            p = torch.exp(_scaled(flat[s : s + ctx.chunk], lse.dtype, tau) - lse[s : s + ctx.chunk, None])
            gs = g[s : s + ctx.chunk, None] if tau == 1.0 else g[s : s + ctx.chunk, None] / tau
            grad[s : s + ctx.chunk] = (-p * gs).scatter_add_(-1, tok[s : s + ctx.chunk, None], gs)
        return grad.view(logits.shape), None, None, None, None


def _scaled(chunk: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    x = chunk.to(dtype)
    return x if temperature == 1.0 else x / temperature


def selected_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) fp32 (fp64 for fp64 logits) log-probs of ``tokens`` under softmax(logits / temperature) and, if asked, the
    (N, T) entropies (no gradient), from (N, T, V) logits of any dtype; differentiable in the
    log-probs. Works in chunks of about ``chunk_elements`` logits: by default 2^26 on CUDA (few
    launches) and 2^18 on the CPU, where a chunk that stays in cache matters — SmolLM2, 1,024 tokens,
    forward + backward on one thread: 1.15 s with 2^26-element chunks, 0.26 s with 2^18."""
    if chunk_elements is None:
        chunk_elements = 2**26 if logits.is_cuda else 2**18
    chunk = max(1, chunk_elements // logits.shape[-1])
    return _SelectedLogprobs.apply(logits, tokens, temperature, with_entropy, chunk)


@dataclass(frozen=True)
class PromptGroups:
    """Rows that share a prompt: ``first`` (U,), one row of each distinct prompt, and ``inverse``
    (N,), each row's prompt — both on the model's device."""

    first: torch.Tensor
    inverse: torch.Tensor

    @staticmethod
    def from_index(index: torch.Tensor, device) -> PromptGroups | None:
        """From (N,) labels (equal label = same prompt), worked out on the host and moved to the device
        in one go — a copy from pageable host memory waits for the device's queue, so it belongs
        before the forward/backward loop, not inside it. None when no prompt repeats."""
        _, inverse = torch.unique(index.cpu(), return_inverse=True)
        n_unique = int(inverse.max()) + 1 if inverse.numel() else 0
        if n_unique == len(inverse):
            return None
        first = torch.zeros(n_unique, dtype=torch.long).scatter_(0, inverse, torch.arange(len(inverse)))
        return PromptGroups(first.to(device), inverse.to(device))


def _shared_prefix_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, groups: PromptGroups):
    """Logits predicting each completion token, running each distinct prompt once: a list of pieces
    along the token axis, (N, 1, V) for the first token and (N, T − 1, V) for the rest."""
    first, inverse = groups.first, groups.inverse
    uniq, umask = prompt_ids[first], prompt_mask[first]
    upos = (umask.cumsum(-1) - 1).clamp(min=0)
    head = model(
        input_ids=uniq,
        attention_mask=padded_causal_mask(umask),
        position_ids=upos,
        use_cache=True,
        logits_to_keep=last_position(uniq.shape[1], uniq.device),
    )
    cache = head.past_key_values
    cache.reorder_cache(inverse)  # (U, …) → (N, …): index_select, differentiable
    first_logits = head.logits[:, -1][inverse].unsqueeze(1)
    T = completion_ids.shape[1]
    if T == 1:
        return [first_logits]
    attention = torch.cat([prompt_mask, completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, prompt_ids.shape[1] :]
    tail = model(
        input_ids=completion_ids[:, :-1],
        attention_mask=attention[:, :-1],
        position_ids=positions[:, :-1],
        past_key_values=cache,
        use_cache=True,
    ).logits
    return [first_logits, tail]


def trim_window(prompt_mask, completion_mask) -> tuple[int, int]:
    """(start, end): prompt columns before ``start`` and completion columns from ``end`` on are
    padding in every row (``end`` ≥ 1)."""
    keep_p = prompt_mask.any(0).nonzero()
    start = int(keep_p[0]) if keep_p.numel() else prompt_mask.shape[1]
    keep_c = completion_mask.any(0).nonzero()
    end = int(keep_c[-1]) + 1 if keep_c.numel() else 1
    return start, end
