"""Per-prompt value anchors that replace the group mean as the baseline (the advantage
``rlexp.algorithms.advantages.prompt_value.anchored`` reads them from ``batch.extras[key]``).

``SingleStreamValues`` — "Single-stream Policy Optimization" (Xu & Ding, 2025; arXiv 2509.13232; released code:
verl-project/verl-recipe ``spo/``): a persistent Beta tracker per prompt, v̂(x) = α/(α+β), read before the step's
update; after it, α ← ρ·α + r, β ← ρ·β + (1 − r), with the KL-adaptive forgetting factor
ρ = clip(2^(−D/D_half), ρ_min, ρ_max), D the token-mean |log π_then − log π_now| of the prompt's last stored response
(D_half = 0.06, ρ_min = 0.875, ρ_max = 0.96 as the release). A prompt seen for the first time has no stored response:
the release measures its D on the new response itself (D = 0), so ρ = ρ_max; we give it ρ_max directly.

``ReferenceAnchor`` — "PVPO: Pre-Estimated Value-Based Policy Optimization for Agentic Reasoning" (Feng et al., 2025;
arXiv 2508.21104): the reference model (the initial policy, frozen) rolls each prompt out ``samples`` times the first
time the prompt is seen; the mean reward is the prompt's static anchor (cached), and prompts the reference always
(or, optionally, never) solves are dropped from training (the paper's pre-sampling filter, done lazily)."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.samplers.feedback import record_key
from rlexp.samplers.prioritized import BetaTracker, kl_rho, priority_weight  # noqa: F401 (kl_rho, priority_weight: re-exported)


def _pad_rows(rows: list[tuple[list[int], list[int]]], pad: int, device) -> tuple[torch.Tensor, ...]:
    """(prompt, completion) token lists → left-padded prompts and right-padded completions with masks."""
    p_len = max(len(p) for p, _ in rows)
    c_len = max(len(c) for _, c in rows)
    pi = torch.full((len(rows), p_len), pad, dtype=torch.long)
    pm = torch.zeros((len(rows), p_len), dtype=torch.long)
    ci = torch.full((len(rows), c_len), pad, dtype=torch.long)
    cm = torch.zeros((len(rows), c_len), dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        pi[i, p_len - len(p) :], pm[i, p_len - len(p) :] = torch.tensor(p), 1
        ci[i, : len(c)], cm[i, : len(c)] = torch.tensor(c), 1
    return pi.to(device), pm.to(device), ci.to(device), cm.to(device)


@GROUP_STAGES.register
class SingleStreamValues:
    """Group stage: SPO's KL-adaptive Beta value tracker. Writes v̂(x) (before the update) to ``batch.extras[key]``,
    then updates each row's prompt with its reward (rows of one prompt in order, one ρ per prompt).

    ``rho``: ``kl`` (the paper's KL-adaptive ρ; one no-grad forward of the revisited prompts' stored responses and
    one of the step's) or a number (a constant ρ, the release's ``rho.type=constant``). Metrics: ``spo/value_mean``,
    ``spo/rho_mean``, ``spo/kl_mean`` (revisited prompts), ``spo/revisited_share``, ``spo/tracked_prompts``.
    The tracker (and the stored responses) are kept in checkpoints."""

    needs_reference = False

    def __init__(
        self,
        key: str = "prompt_value",
        rho: str | float = "kl",
        d_half: float = 0.06,
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        alpha0: float = 0.5,
        beta0: float = 0.5,
    ):
        where = "algorithm.group_stages: SingleStreamValues"
        if isinstance(rho, str) and rho != "kl":
            raise ValueError(f"{where}.rho={rho!r} must be 'kl' or a number in (0, 1]")
        if not isinstance(rho, str) and not 0.0 < float(rho) <= 1.0:
            raise ValueError(f"{where}.rho={rho} must be in (0, 1]")
        if d_half <= 0:
            raise ValueError(f"{where}.d_half={d_half} must be > 0")
        if not 0.0 < rho_min <= rho_max <= 1.0:
            raise ValueError(f"{where}: need 0 < rho_min ({rho_min}) ≤ rho_max ({rho_max}) ≤ 1")
        self.key, self.rho = key, rho if isinstance(rho, str) else float(rho)
        self.d_half, self.rho_min, self.rho_max = float(d_half), float(rho_min), float(rho_max)
        self.tracker = BetaTracker(alpha0, beta0)
        self.last: dict[str, dict] = {}  # key → {"prompt", "completion", "logprobs"} at its last visit

    def _logprobs(self, ctx, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
        from rlexp.core.forward import token_logprobs

        device = next(ctx.policy.parameters()).device
        pad = getattr(ctx.tokenizer, "pad_token_id", None) or 0
        pi, pm, ci, cm = _pad_rows(rows, pad, device)
        with torch.no_grad():
            logp, _ = token_logprobs(ctx.policy, pi, pm, ci, cm, autocast_dtype=getattr(ctx, "autocast_dtype", None))
        return [logp[i, : len(c)].float().cpu() for i, (_, c) in enumerate(rows)]

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        keys = [record_key(r) for r in batch.records]
        batch.extras[self.key] = torch.tensor(
            [self.tracker.value(k) for k in keys], dtype=torch.float32, device=batch.reward.device
        )
        firsts: dict[str, int] = {}
        for i, k in enumerate(keys):
            firsts.setdefault(k, i)
        rho: dict[str, float] = {}
        kls: list[float] = []
        if self.rho == "kl":
            if ctx is None or getattr(ctx, "policy", None) is None:
                raise RuntimeError("SingleStreamValues(rho='kl') needs the policy (ctx.policy) to measure D")
            revisit = [k for k in firsts if k in self.last]
            if revisit:
                old = [self.last[k] for k in revisit]
                now = self._logprobs(ctx, [(s["prompt"], s["completion"]) for s in old])
                for k, s, lp in zip(revisit, old, now):
                    d = float((torch.tensor(s["logprobs"]) - lp).abs().mean()) if len(lp) else 0.0
                    kls.append(d)
                    rho[k] = kl_rho(d, self.d_half, self.rho_min, self.rho_max)
            rows = []
            for k, i in firsts.items():
                p = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
                c = batch.completion_ids[i][batch.completion_mask[i].bool()].tolist()
                rows.append((k, p, c))
            rows = [r for r in rows if r[2]]  # an empty completion has no tokens to compare
            if rows:
                lps = self._logprobs(ctx, [(p, c) for _, p, c in rows])
                for (k, p, c), lp in zip(rows, lps):
                    self.last[k] = {"prompt": p, "completion": c, "logprobs": lp.tolist()}
        for k in firsts:
            rho.setdefault(k, self.rho_max if self.rho == "kl" else self.rho)  # first sight: D = 0 → ρ_max
        for k, r in zip(keys, batch.reward.tolist()):
            self.tracker.update(k, r, rho[k])
        batch.stats["spo/value_mean"] = float(batch.extras[self.key].mean()) if len(batch) else 0.0
        batch.stats["spo/rho_mean"] = sum(rho.values()) / max(len(rho), 1)
        if kls:
            batch.stats["spo/kl_mean"] = sum(kls) / len(kls)
        batch.stats["spo/revisited_share"] = len(kls) / max(len(firsts), 1)
        batch.stats["spo/tracked_prompts"] = float(len(self.tracker.alpha))
        return batch

    def state_dict(self) -> dict:
        return {"tracker": self.tracker.state_dict(), "last": dict(self.last)}

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.tracker.load_state_dict(state.get("tracker"))
            self.last = dict(state.get("last", {}))


@GROUP_STAGES.register
class ReferenceAnchor:
    """Group stage: PVPO's static value anchor. A prompt seen for the first time is rolled out ``samples`` times by
    the reference model (the frozen initial policy; ``ctx.reference``), scored by the run's reward terms; the mean
    reward is cached as its anchor and written to every row of the prompt as ``batch.extras[key]``. Groups whose
    anchor is ≥ ``solved`` (the reference always solves them) are dropped, and with ``drop_unsolved`` those whose
    anchor is ≤ 0 too (unless that would drop every group: then the batch is kept whole and counted).

    Metrics: ``pvpo/anchor_mean``, ``pvpo/new_prompts``, ``pvpo/dropped_share``, ``pvpo/kept_all``. The anchors are
    kept in checkpoints."""

    needs_reference = True

    def __init__(
        self,
        key: str = "prompt_value",
        samples: int = 4,
        solved: float = 1.0,
        drop_unsolved: bool = False,
        greedy: bool = False,
    ):
        if samples < 1:
            raise ValueError(f"algorithm.group_stages: ReferenceAnchor.samples={samples} must be ≥ 1")
        self.key, self.samples, self.solved = key, int(samples), float(solved)
        self.drop_unsolved, self.greedy = bool(drop_unsolved), bool(greedy)
        self.anchors: dict[str, float] = {}

    def _estimate(self, batch: RolloutBatch, ctx, firsts: list[int]) -> None:
        from rlexp.rewards.scoring import score

        if ctx is None or ctx.rollout is None or ctx.reward_terms is None:
            raise RuntimeError(
                "ReferenceAnchor needs the rollout engine and reward terms (ctx.rollout, ctx.reward_terms)"
            )
        model = getattr(ctx.reference, "model", None) or ctx.policy  # the frozen initial policy
        prompts = [batch.prompts[i] for i in firsts]
        device = next(ctx.policy.parameters()).device
        dtype = ctx.autocast_dtype
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = ctx.rollout.generate(model, ctx.tokenizer, prompts, num_generations=self.samples, greedy=self.greedy)
        gid = torch.arange(len(firsts)).repeat_interleave(self.samples)
        records = [batch.records[i] for i in firsts for _ in range(self.samples)]
        ref = RolloutBatch.from_generation(out, gid, [p for p in prompts for _ in range(self.samples)], records)
        score(ref, ctx.reward_terms)
        means = ref.reward.float().view(len(firsts), self.samples).mean(1).tolist()
        for i, m in zip(firsts, means):
            self.anchors[record_key(batch.records[i])] = float(m)

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        keys = [record_key(r) for r in batch.records]
        new: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in self.anchors:
                new.setdefault(k, i)
        if new:
            self._estimate(batch, ctx, list(new.values()))
        anchor = torch.tensor([self.anchors[k] for k in keys], dtype=torch.float32, device=batch.reward.device)
        drop = anchor >= self.solved - 1e-9
        if self.drop_unsolved:
            drop |= anchor <= 1e-9
        kept_all = bool(drop.all()) and len(batch) > 0
        batch.stats["pvpo/anchor_mean"] = float(anchor.mean()) if len(batch) else 0.0
        batch.stats["pvpo/new_prompts"] = float(len(new))
        batch.stats["pvpo/dropped_share"] = 0.0 if kept_all else float(drop.float().mean()) if len(batch) else 0.0
        batch.stats["pvpo/kept_all"] = float(kept_all)
        batch.extras[self.key] = anchor
        if drop.any() and not kept_all:
            stats = dict(batch.stats)
            batch = batch.select((~drop).nonzero().squeeze(-1))
            batch.stats = stats
        return batch

    def state_dict(self) -> dict:
        return {"anchors": dict(self.anchors)}

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.anchors.update({k: float(v) for k, v in state.get("anchors", {}).items()})
