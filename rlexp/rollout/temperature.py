"""Per-token sampling temperatures: the rollout samples token t of each row at its own temperature τ_t, and the
recorded sampling log-prob is that of softmax(logits / τ_t) — the distribution the token was drawn from.

A schedule is called once per decoding step with the (N, V) logits and the step t (tokens generated so far) and
returns the (N,) effective temperatures; ``rollout.temperature`` (T) is the base it scales. The trainer's
log-probs stay those of softmax(logits / T), the policy; the difference between the two is the sampling/policy
mismatch (``mismatch/*``), which a method corrects with importance weights where it asks for them
(``algorithm.rollout_correction``).

* ``annealed`` — EAD ("Let it Calm: Exploratory Annealed Decoding for Verifiable Reinforcement Learning", Yang et
  al., 2025; arXiv 2510.05251; released code yangalan123/EAD-RLVR, ``annealed_sampling.py`` mode ``negexp``):
  τ_t = T for t < c (``warmup``), else T · max(1 + τ_max − exp(t / d_s), τ_min), with the decay growing over
  training, d_s = min(d_0 + g·s, d_max) at train step s: explore early in a completion, exploit late.
* ``entropy`` — HAPO's Adaptive Temperature Sampling ("From Uniform to Heterogeneous: Tailoring Policy Optimization
  to Every Token's Nature", Liu et al., 2025; released code starriver030515/HAPO, its patched vLLM sampler):
  τ_t = T · (1 + τ · clamp(ĥ_t, −1, 1)), ĥ_t the current logits' entropy normalised by the previous step's batch
  statistics (``rlexp.core.entropy``): hotter where the policy is uncertain, cooler where it is sure. Before the
  first statistics arrive (the first step) it samples at T, as the release.

Built from a settings dict (``schedule`` picks the kind, the rest are its settings): ``algorithm.sampling_temperature``
(the method's; the trainer hands it to the rollout) or ``rollout.token_temperature`` (any method). Greedy calls
ignore it. Only ``rollout=hf`` (both engines, no captured decode graph, no speculative reuse) samples with it.
"""

from __future__ import annotations

import math

import torch

from rlexp.core.entropy import EntropyScale, entropy_scale, normalised_entropy


def temperature_stats(prefix: str, temps: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Rollout metrics of the (N, T) temperatures used, over the valid tokens: token mean, min, max, the mean at
    each row's first token and at its last token."""
    m = mask.bool()
    if not bool(m.any()):
        return {}
    t = temps.float()
    n = m.sum(-1)
    rows = n > 0
    last = t.gather(1, (n - 1).clamp(min=0)[:, None]).squeeze(1)
    return {
        f"{prefix}/temperature_mean": float(t[m].mean()),
        f"{prefix}/temperature_min": float(t[m].min()),
        f"{prefix}/temperature_max": float(t[m].max()),
        f"{prefix}/temperature_first": float(t[rows, 0].mean()),
        f"{prefix}/temperature_last": float(last[rows].mean()),
    }


class AnnealedTemperature:
    """EAD's within-completion annealing (see the module docstring). ``decay`` d_0, ``decay_growth`` g and
    ``decay_max`` are in tokens (the release divides t by 20·d with d = 25 + 5·s capped at 40000: d_0 = 500,
    g = 100, d_max = 800000 here)."""

    metric_prefix = "ead"
    needs_entropy = False

    def __init__(
        self,
        tau_max: float = 1.2,
        tau_min: float = 0.1,
        decay: float = 500.0,
        decay_growth: float = 100.0,
        decay_max: float = 800000.0,
        warmup: int = 10,
    ):
        if not 0 < tau_min <= tau_max:
            raise ValueError(
                f"sampling_temperature (annealed): need 0 < tau_min <= tau_max, got {tau_min} and {tau_max}"
            )
        if decay <= 0 or decay_growth < 0 or decay_max < decay:
            raise ValueError(
                f"sampling_temperature (annealed): need decay > 0, decay_growth >= 0, decay_max >= decay, got "
                f"{decay}, {decay_growth}, {decay_max}"
            )
        if warmup < 0:
            raise ValueError(f"sampling_temperature.warmup must be >= 0, got {warmup}")
        self.tau_max, self.tau_min, self.warmup = float(tau_max), float(tau_min), int(warmup)
        self.decay0, self.growth, self.decay_max = float(decay), float(decay_growth), float(decay_max)
        self.step = 0

    def on_step(self, step: int, max_steps: int | None = None) -> None:
        self.step = step

    @property
    def decay(self) -> float:
        """d_s at the current train step."""
        return min(self.decay0 + self.growth * self.step, self.decay_max)

    def factor(self, t: int) -> float:
        """τ_t / T at step t of a completion."""
        if t < self.warmup:
            return 1.0
        return max(1.0 + self.tau_max - math.exp(t / self.decay), self.tau_min)

    def __call__(self, logits: torch.Tensor, t: int, base: float) -> torch.Tensor:
        return torch.full((logits.shape[0],), base * self.factor(t), dtype=torch.float, device=logits.device)

    def stats(self, temps: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        out = temperature_stats(self.metric_prefix, temps, mask)
        if out:
            out[f"{self.metric_prefix}/decay"] = self.decay
        return out


class EntropyAdaptiveTemperature:
    """HAPO's Adaptive Temperature Sampling (see the module docstring). ``tau``: the strength (the release's
    ``temperature_tau`` 0.05: ±5 %); ``pivot``: the quantile of the log-entropies that splits hot from cool (0.8);
    the statistics come from ``observe`` (the trainer passes each step's old-policy token entropies)."""

    metric_prefix = "hapo"
    needs_entropy = True

    def __init__(self, tau: float = 0.05, pivot: float = 0.8, released_sign: bool = False):
        if not 0.0 <= tau < 1.0:
            raise ValueError(f"sampling_temperature.tau must be in [0, 1) (temperatures stay > 0), got {tau}")
        if not 0.0 <= pivot <= 1.0:
            raise ValueError(f"sampling_temperature.pivot must be in [0, 1], got {pivot}")
        self.tau, self.pivot, self.released_sign = float(tau), float(pivot), bool(released_sign)
        self.scale: EntropyScale | None = None

    def on_step(self, step: int, max_steps: int | None = None) -> None:
        """Nothing per step: this schedule follows the entropies it observes, not the step."""

    def observe(self, entropy: torch.Tensor, mask: torch.Tensor) -> None:
        """Take the statistics of a batch's (N, T) token entropies (at the base temperature) for the next rollouts."""
        self.scale = entropy_scale(entropy, mask, self.pivot, released_sign=self.released_sign)

    def __call__(self, logits: torch.Tensor, t: int, base: float) -> torch.Tensor:
        n = logits.shape[0]
        if self.scale is None:
            return torch.full((n,), base, dtype=torch.float, device=logits.device)
        logp = torch.log_softmax(logits.float() / base, -1)  # the policy's entropy, as the trainer measures it
        entropy = -(logp.exp() * logp).sum(-1)
        h = normalised_entropy(entropy, self.scale).clamp(-1.0, 1.0)
        return base * (1.0 + self.tau * h)

    def stats(self, temps: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        return temperature_stats(self.metric_prefix, temps, mask)

    def state_dict(self) -> dict:
        return {"scale": None if self.scale is None else vars(self.scale).copy()}

    def load_state_dict(self, state: dict) -> None:
        s = (state or {}).get("scale")
        self.scale = EntropyScale(**s) if s else None


SCHEDULES = {"annealed": AnnealedTemperature, "entropy": EntropyAdaptiveTemperature}


def build_token_temperature(settings, key: str = "sampling_temperature"):
    """A schedule from its settings (``schedule`` plus that kind's keyword settings); an already built schedule or
    None passes through. ``key`` names the config key in errors."""
    if settings is None or callable(settings):
        return settings
    cfg = dict(settings)
    kind = cfg.pop("schedule", None)
    if kind not in SCHEDULES:
        raise ValueError(f"{key}.schedule={kind!r} is not one of {sorted(SCHEDULES)}")
    cls = SCHEDULES[kind]
    import inspect

    known = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"{key}: unknown setting(s) {unknown} for schedule {kind!r}; known: {sorted(known)}")
    return cls(**cfg)
