"""CAPO's curvature mask ("Stabilizing Policy Gradients for Sample-Efficient Reinforcement Learning in LLM Reasoning",
Melo, Abate and Gal, 2025; arXiv 2510.00819; released code luckeciano/stable-pg-llm, ``grpo_entropy_trainer.py`` and
``sparse_optim_models``).

A last-layer model of the update: the policy's logits at a completion position are z = W·h̃, with h̃ the final hidden
state (the final norm's output) divided by the sampling temperature and W the LM head restricted to the position's
top-K tokens, whose probabilities π are renormalised on those K. A token's own ascent gradient on W is
g = A·v ⊗ h̃ with v = e_a − π (e_a: the sampled token's slot, all zeros when it is outside the top K). The optimiser
would move W along d, the Adam direction of g under a model of the LM head's Adam moments (``AdamMoments``: one
row of first and second moments per vocabulary id). With u = d·h̃ (the logits' change per unit step, K values) and
s = v·u, a step of size η (the learning rate) changes

* the token's surrogate objective A·π_θ/π_old by about  η·⟨g, d⟩ + ½·η²·dᵀH d = η·A·s + ½·η²·A·(s² − uᵀF u)
  (the objective shift; H the Hessian of the ratio objective on W, F = diag π − ππᵀ), and
* its policy by a KL of about  ½·η²·s²  (the policy shift; the Fisher of the sampled token along d).

CAPO leaves out of the loss every token whose objective shift is not inside (−τ_H, τ_H) (``symmetric``; else
[0, τ_H)) or whose policy shift is not below τ_F. The moment model then takes one Adam step on the kept tokens'
gradients, averaged per vocabulary id (a row is updated only where its id is in some kept token's top K).

What runs where: the old policy's forward (``rlexp.trainer.optimize.batch_logprobs``) keeps the final hidden states
and top-K log-probs (``batch.extras`` keys ``CURVATURE_*`` of ``rlexp.core.masks``); ``policy_update`` calls the mask
once per mini-batch (optimiser step), in order, before the update, and multiplies it into that mini-batch's loss mask
(out of the loss and the loss normalisers, as the release drops them from the per-sequence token counts).
"""

from __future__ import annotations

import torch

from rlexp.core.masks import CURVATURE_HIDDEN, CURVATURE_TOPK_IDX, CURVATURE_TOPK_LOGP
from rlexp.core.registry import REGULARISERS

CURVATURE_FEATURES = (CURVATURE_HIDDEN, CURVATURE_TOPK_IDX, CURVATURE_TOPK_LOGP)
OPTIMIZER_MODELS = ("adam", "sgd")


class AdamMoments:
    """A model of Adam's moments on the LM head, one row per vocabulary id (the release's ``SparseAdamModel``, kept in
    dense rows that grow to the largest id seen): ``direction`` is the Adam step of a token's own gradient taken from
    the current moments without changing them (bias correction at t + 1), ``update`` one Adam moment step on the mean
    gradient of each id present. Before the first update there are no moments and the direction is the gradient itself
    (the release's behaviour). ``sgd``: the direction is always the gradient."""

    def __init__(self, kind: str = "adam", beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        if kind not in OPTIMIZER_MODELS:
            raise ValueError(
                f"algorithm.curvature_mask.optimizer_model={kind!r} is not one of {list(OPTIMIZER_MODELS)}"
            )
        self.kind, self.beta1, self.beta2, self.eps = kind, float(beta1), float(beta2), float(eps)
        self.m: torch.Tensor | None = None  # (R, H) first moments, row = vocabulary id
        self.v: torch.Tensor | None = None  # (R, H) second moments
        self.t = 0  # updates so far

    def _grow(self, rows: int, hidden: int, device, dtype=torch.float32) -> None:
        if self.m is not None and self.m.shape[0] >= rows:
            return
        rows = -(-rows // 1024) * 1024
        old = 0 if self.m is None else self.m.shape[0]
        pad = torch.zeros(rows - old, hidden, device=device, dtype=dtype)
        self.m = pad if self.m is None else torch.cat([self.m, pad])
        self.v = pad.clone() if self.v is None else torch.cat([self.v, pad])

    def direction(self, ids: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """(n, K, H) the Adam direction of the per-token gradients ``g`` (n, K, H) on the rows ``ids`` (n, K)."""
        if self.kind == "sgd" or self.t == 0:
            return g
        self._grow(int(ids.max()) + 1, g.shape[-1], g.device)
        t = self.t + 1
        m = self.beta1 * self.m[ids] + (1 - self.beta1) * g
        v = self.beta2 * self.v[ids] + (1 - self.beta2) * g * g
        return (m / (1 - self.beta1**t)) / ((v / (1 - self.beta2**t)).sqrt() + self.eps)

    @torch.no_grad()
    def update(self, ids: torch.Tensor, coef: torch.Tensor, hidden: torch.Tensor, chunk: int) -> None:
        """One moment step on the mean gradient of each id: over the tokens given, ḡ_w = mean of coef[i, j]·hidden[i]
        over the (token i, slot j) with ids[i, j] = w; rows of absent ids are left as they are."""
        self.t += 1
        if self.kind == "sgd" or ids.numel() == 0:
            return
        H = hidden.shape[-1]
        self._grow(int(ids.max()) + 1, H, hidden.device)
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        inverse = inverse.view(ids.shape)
        sums = torch.zeros(uniq.numel(), H, device=hidden.device, dtype=torch.float32)
        for s in range(0, ids.shape[0], chunk):
            g = coef[s : s + chunk, :, None] * hidden[s : s + chunk, None, :]  # (n, K, H)
            sums.index_add_(0, inverse[s : s + chunk].reshape(-1), g.reshape(-1, H))
        counts = torch.bincount(inverse.reshape(-1), minlength=uniq.numel()).to(sums.dtype)
        mean = sums / counts[:, None]
        self.m[uniq] = self.beta1 * self.m[uniq] + (1 - self.beta1) * mean
        self.v[uniq] = self.beta2 * self.v[uniq] + (1 - self.beta2) * mean * mean

    def state_dict(self) -> dict:
        return {
            "m": self.m,
            "v": self.v,
            "t": self.t,
            "kind": self.kind,
            "betas": (self.beta1, self.beta2),
            "eps": self.eps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.m, self.v, self.t = state["m"], state["v"], int(state["t"])
        if "betas" in state:
            self.kind, (self.beta1, self.beta2), self.eps = state["kind"], state["betas"], float(state["eps"])


@torch.no_grad()
def curvature_scores(
    hidden: torch.Tensor,
    probs: torch.Tensor,
    picked: torch.Tensor,
    ids: torch.Tensor,
    adv: torch.Tensor,
    lr: float,
    moments: AdamMoments,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token (n,): the objective shift η·A·s + ½η²·A·(s² − uᵀF u) and the policy shift ½η²·s² of one step of size
    η = ``lr`` along the moment model's direction of the token's own gradient g = A·(e_a − π) ⊗ h̃.
    ``hidden`` (n, H): h̃, the final hidden states already divided by the temperature; ``probs`` (n, K): π on the
    top-K, renormalised; ``picked`` (n, K): e_a, 1 at the sampled token's slot; ``ids`` (n, K): the slots' vocabulary
    ids; ``adv`` (n,): A."""
    v = picked - probs
    coef = adv[:, None] * v
    objective = torch.empty_like(adv)
    policy = torch.empty_like(adv)
    for s in range(0, hidden.shape[0], chunk):
        sl = slice(s, s + chunk)
        g = coef[sl, :, None] * hidden[sl, None, :]
        d = moments.direction(ids[sl], g)
        u = torch.einsum("nkh,nh->nk", d, hidden[sl])  # logit change per unit step
        dot = (v[sl] * u).sum(-1)  # s = v·u; ⟨g, d⟩ = A·s
        pu = (probs[sl] * u).sum(-1)
        quad = (probs[sl] * u * u).sum(-1) - pu * pu  # uᵀ(diag π − ππᵀ)u
        a = adv[sl]
        objective[sl] = lr * a * dot + 0.5 * lr * lr * a * (dot * dot - quad)
        policy[sl] = 0.5 * lr * lr * dot * dot
    return objective, policy


def threshold_mask(
    objective: torch.Tensor, policy: torch.Tensor, hessian_tau: float, fisher_tau: float, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hessian_keep, fisher_keep) bool: the objective shift in (−τ_H, τ_H) (``symmetric``; else [0, τ_H)) and the
    policy shift below τ_F; a τ of 0 keeps every token (that test is off, as in the release)."""
    if hessian_tau > 0:
        low = objective > -hessian_tau if symmetric else objective >= 0
        keep_h = low & (objective < hessian_tau)
    else:
        keep_h = torch.ones_like(objective, dtype=torch.bool)
    keep_f = policy < fisher_tau if fisher_tau > 0 else torch.ones_like(policy, dtype=torch.bool)
    return keep_h, keep_f


@REGULARISERS.register
class CurvatureMask:
    """CAPO's token mask (module docstring). ``fisher_tau`` τ_F, ``hessian_tau`` τ_H (0: that test off),
    ``symmetric`` (the release's ``hessian_symmetric_clipping``), ``top_k`` K (the release: 50, transformers'
    default ``top_k`` its sampler used), ``optimizer_model`` adam | sgd (the release's ``optim_model_type``), ``betas``
    and ``eps`` of the moment model (null: the optimiser's own, as the release takes the trainer's Adam settings;
    (0.9, 0.999) and 1e-8 for an optimiser without them)."""

    def __init__(
        self,
        fisher_tau: float = 1e-4,
        hessian_tau: float = 0.01,
        symmetric: bool = True,
        top_k: int = 50,
        optimizer_model: str = "adam",
        betas: list[float] | tuple[float, float] | None = None,
        eps: float | None = None,
        chunk_elements: int | None = None,
    ):
        if fisher_tau < 0 or hessian_tau < 0:
            raise ValueError(
                f"algorithm.curvature_mask.fisher_tau={fisher_tau} and hessian_tau={hessian_tau} must be >= 0"
            )
        if fisher_tau == 0 and hessian_tau == 0:
            raise ValueError("algorithm.curvature_mask: fisher_tau and hessian_tau are both 0, so nothing is masked")
        if top_k < 1:
            raise ValueError(f"algorithm.curvature_mask.top_k={top_k} must be >= 1")
        if optimizer_model not in OPTIMIZER_MODELS:
            raise ValueError(
                f"algorithm.curvature_mask.optimizer_model={optimizer_model!r} is not one of {list(OPTIMIZER_MODELS)}"
            )
        if betas is not None and (len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"algorithm.curvature_mask.betas={betas} must be two numbers in [0, 1) or null")
        self.fisher_tau, self.hessian_tau, self.symmetric = float(fisher_tau), float(hessian_tau), bool(symmetric)
        self.top_k, self.optimizer_model = int(top_k), optimizer_model
        self.betas = None if betas is None else (float(betas[0]), float(betas[1]))
        self.eps = eps
        self.chunk_elements = chunk_elements
        self.moments: AdamMoments | None = None

    def _moments(self, optimizer) -> AdamMoments:
        if self.moments is None:
            group = optimizer.param_groups[0] if optimizer is not None else {}
            betas = self.betas or tuple(group.get("betas", (0.9, 0.999)))
            eps = self.eps if self.eps is not None else group.get("eps", 1e-8)
            self.moments = AdamMoments(self.optimizer_model, betas[0], betas[1], eps)
        return self.moments

    @torch.no_grad()
    def __call__(
        self, batch, mask: torch.Tensor, *, lr: float, temperature: float = 1.0, optimizer=None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(N, T) keep mask (1: in the loss) of ``batch``'s tokens under ``mask`` and the counts for
        ``curvature_metrics``; consumes the features in ``batch.extras`` and steps the moment model once."""
        missing = [k for k in CURVATURE_FEATURES if k not in batch.extras]
        if missing:
            raise ValueError(
                f"algorithm.curvature_mask needs batch.extras{missing}, kept by the old policy's forward "
                "(batch_logprobs with curvature_topk > 0)"
            )
        hidden_all, idx_all, logp_all = (batch.extras.pop(k) for k in CURVATURE_FEATURES)
        T = mask.shape[1]
        valid = mask[:, :T] > 0
        keep = torch.ones_like(mask, dtype=torch.bool)
        n_valid = int(valid.sum())
        counts = {"tokens": float(n_valid), "masked": 0.0, "hessian": 0.0, "fisher": 0.0}
        moments = self._moments(optimizer)
        if n_valid == 0:
            moments.t += 1
            return keep.to(mask.dtype), {**counts, "objective_abs": 0.0, "policy": 0.0, "t": float(moments.t)}
        valid_dev = valid.to(hidden_all.device)
        hidden = hidden_all[:, :T][valid_dev].float() / temperature  # h̃ (n, H)
        ids = idx_all[:, :T][valid_dev]  # (n, K)
        probs = torch.softmax(logp_all[:, :T][valid_dev].float(), -1)  # π renormalised on the top K
        tokens = batch.completion_ids[:, :T].to(ids.device)[valid_dev]
        picked = (ids == tokens[:, None]).float()
        adv = batch.advantages.to(hidden.device).float()
        adv = (adv[:, None].expand(-1, T) if adv.dim() == 1 else adv[:, :T])[valid_dev]
        budget = self.chunk_elements or (2**25 if hidden.is_cuda else 2**21)
        chunk = max(1, budget // (ids.shape[1] * hidden.shape[1]))
        objective, policy = curvature_scores(hidden, probs, picked, ids, adv, lr, moments, chunk)
        keep_h, keep_f = threshold_mask(objective, policy, self.hessian_tau, self.fisher_tau, self.symmetric)
        kept = keep_h & keep_f
        coef = adv[:, None] * (picked - probs)
        moments.update(ids[kept], coef[kept], hidden[kept], chunk)
        keep[valid] = kept.to(keep.device)
        counts.update(
            masked=float((~kept).sum()),
            hessian=float((~keep_h).sum()),
            fisher=float((~keep_f).sum()),
            objective_abs=float(objective.abs().sum()),
            objective_abs_max=float(objective.abs().max()),
            policy=float(policy.sum()),
            policy_max=float(policy.max()),
            t=float(moments.t),
        )
        return keep.to(mask.dtype), counts

    def state_dict(self) -> dict:
        return {} if self.moments is None else self.moments.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self._moments(None).load_state_dict(state)


def curvature_metrics(counts: list[dict[str, float]]) -> dict[str, float]:
    """The update's CAPO metrics from each mini-batch's counts: token shares masked (by either test, by the objective
    shift, by the policy shift), the mean and largest |objective shift| and policy shift over the valid tokens, and the
    moment model's step count."""
    n = max(sum(c["tokens"] for c in counts), 1.0)
    out = {
        "capo/masked_token_frac": sum(c["masked"] for c in counts) / n,
        "capo/hessian_masked_frac": sum(c["hessian"] for c in counts) / n,
        "capo/fisher_masked_frac": sum(c["fisher"] for c in counts) / n,
        "capo/objective_shift_abs_mean": sum(c["objective_abs"] for c in counts) / n,
        "capo/policy_shift_mean": sum(c["policy"] for c in counts) / n,
        "capo/moment_steps": counts[-1]["t"],
    }
    maxima = [c for c in counts if "policy_max" in c]
    if maxima:
        out["capo/objective_shift_abs_max"] = max(c["objective_abs_max"] for c in maxima)
        out["capo/policy_shift_max"] = max(c["policy_max"] for c in maxima)
    return out
