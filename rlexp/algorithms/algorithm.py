"""A method = one advantage estimator + one policy loss + an aggregation mode + regularisers +
group stages, each a small part named by ``_target_`` in ``conf/algorithm/<method>.yaml``.

``Algorithm.token_loss`` assembles the per-token loss the trainer aggregates: the policy loss, the
high-entropy token selection (``top_entropy_quantile``), the KL term (``kl.mode=loss``) and the
entropy bonus. A ``critic`` (PPO) adds its value stage after the configured group stages and is
updated by the trainer after the policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlexp.algorithms.aggregation import MODES, TOKEN_COUNT_GUARDS
from rlexp.algorithms.families import FAMILIES
from rlexp.algorithms.losses.base import LossOutput, loss_batch_extras, loss_takes_entropy
from rlexp.algorithms.regularisers.entropy import high_entropy_mask
from rlexp.algorithms.regularisers.kl import ESTIMATORS, kl_estimate
from rlexp.algorithms.regularisers.reference import KINDS
from rlexp.core.masks import KL_ROW_WEIGHTS, TOKEN_REWARDS, UNSCORED
from rlexp.core.stats import batch_is_spread

UNSCORED_ROWS = ("count", "exclude")


@dataclass
class KLSettings:
    coef: float = 0.0
    estimator: str = "k3"
    mode: str = "loss"  # "loss": β·KL added per token; "reward": β·Σ_t KL subtracted from the reward
    # verl's k3 (low_var_kl) clamps: log-ratio to ±20, the estimate to ±10 (TRL and the default: none)
    clamp: bool = False
    # TRL's use_bias_correction_kl: the per-token KL term times the (differentiable) token ratio π_θ/π_old
    # (loss mode only; TRL's default is true, verl's and ours false)
    bias_correction: bool = False


@dataclass
class ReferenceSettings:
    kind: str = "frozen"
    ema_decay: float = 0.995
    ema_interval: int = 10
    # a model config (as conf/model/<name>.yaml) the frozen reference is loaded from instead of a copy of the initial
    # policy: the KL then pulls toward that model (a demonstration / SFT policy: demonstration-regularised RL)
    model: Any = None


@dataclass
class SlowFastSettings:
    """SFPO's update (``rlexp.trainer.slow_fast``): ``fast_steps`` K passes of the update over the rollout
    batch (the fast trajectory), then the weights are put back to θ_0 + α·(θ_K − θ_0) (α = ``step_size``),
    then one more pass (the slow correction). K = 0: off. ``stop_window`` w > 0: from the step at which the
    z-score of the step's token entropy against the last w steps' reaches ``stop_threshold``, the plain update
    for the rest of the run (the released code's switch-off)."""

    fast_steps: int = 0
    step_size: float = 0.8
    stop_window: int = 0
    stop_threshold: float = 1.0


@dataclass
class ActionMaskSettings:
    """NLPO's learned action mask (``rlexp.algorithms.regularisers.action_mask``): a copy of the policy, synced every
    ``sync_every`` optimiser steps, allows its top-``top_p`` tokens at each position, in sampling and in the loss."""

    top_p: float = 0.9
    sync_every: int = 5


@dataclass
class Algorithm:
    name: str
    advantage: Callable
    loss: Callable
    paper: str = ""
    family: str = ""  # rlexp.algorithms.families.FAMILIES (`rlexp list algorithms`)
    aggregation: str = "token-mean"
    count_empty_rows: bool = False
    norm_length: float | None = None
    # a row's token count in seq-mean-token-mean: clamp(min=1) (TRL) | eps: + 1e-8 (verl); they differ only for
    # a row whose fractional loss-mask weights sum below 1
    token_count_guard: str = "clamp"
    # rows whose every reward term failed or returned None: count (scored 0, in the group statistics; verl) |
    # exclude (left out of the advantage's statistics, advantage 0; TRL)
    unscored_rows: str = "count"
    kl: KLSettings = field(default_factory=KLSettings)
    reference: ReferenceSettings = field(default_factory=ReferenceSettings)
    entropy_coef: float = 0.0
    group_stages: list = field(default_factory=list)
    mechanism: str = ""  # one line for `rlexp list algorithms`
    top_entropy_quantile: float = 1.0  # ρ < 1: policy gradient only on the top-ρ entropy tokens (80/20)
    # what the token-mean loss divides by when ρ < 1: all valid tokens (TRL) or the selected ones only (the
    # 80/20 authors' code); `selected` rescales each optimiser step's gradient by all / selected tokens
    top_entropy_normaliser: str = "all"
    critic: Any = None  # rlexp.algorithms.critics.ppo.Critic (PPO) or None
    # the method's update schedule: optimiser steps per rollout batch, one per mini-batch of whole groups
    # (trainer.steps_per_rollout, when set, overrides it for every method)
    steps_per_rollout: int = 1
    # the method's epochs μ over each rollout batch (trainer.num_iterations, when set, overrides it)
    num_iterations: int = 1
    # SFPO's fast steps, reposition and slow correction around the update (fast_steps 0: off)
    slow_fast: SlowFastSettings = field(default_factory=SlowFastSettings)
    # completions sampled per prompt where the method fixes it (ReMax: 1, beside its greedy baseline); it then
    # replaces trainer.num_generations; null: trainer.num_generations
    num_generations: int | None = None
    # policy reincarnation (ReMix): after the update of this step the reference (the base model) becomes the policy,
    # and later steps train on-policy: one epoch of one optimiser step per rollout, group stages marked
    # ``off_policy`` (replay) skipped. null: never
    reincarnate_at: int | None = None
    # NLPO: sampling and log-probs restricted to a masking policy's top-p tokens (ActionMaskSettings); null: none
    action_mask: Any = None
    # an entropy term beside the policy loss (rlexp.algorithms.regularisers.entropy): EntropyBonus (AEnt's clamped
    # entropy and band control, TRL's adaptive target) or EntropyBand (SPINE); null: none (``entropy_coef`` is the
    # plain bonus)
    entropy_control: Any = None
    # K prompt variants per group, G/K completions each (rlexp.algorithms.prompt_conditions: HBPO's budgets, e1's
    # efforts); the value each row was prompted with is batch.extras["condition"]; null: one prompt per group
    prompt_condition: Any = None
    # a per-token sampling temperature (rlexp.rollout.temperature: EAD's annealing, HAPO's entropy-adaptive
    # temperature), settings with ``schedule``; the trainer builds it and hands it to the rollout. null: none
    sampling_temperature: Any = None
    # the sampling/policy mismatch correction the method applies (rlexp.algorithms.regularisers.rollout_correction:
    # ``mode``, ``threshold``; EAD's truncated IS) when trainer.rollout_correction is null; null: none
    rollout_correction: Any = None
    # CAPO's token mask (rlexp.algorithms.regularisers.curvature.CurvatureMask): tokens whose update a last-layer
    # curvature model finds unstable leave each mini-batch's loss; its features come from the old log-probs' forward.
    # null: none
    curvature_mask: Any = None
    # EGPO's extragradient update (rlexp.trainer.extragradient): odd steps take a look-ahead step from a backup of the
    # weights and optimiser state, even steps restore the backup and update it with the look-ahead's samples
    extragradient: bool = False

    def __post_init__(self):
        if isinstance(self.kl, dict) or not isinstance(self.kl, KLSettings):
            self.kl = KLSettings(**dict(self.kl))
        if not isinstance(self.reference, ReferenceSettings):
            self.reference = ReferenceSettings(**dict(self.reference))
        if not isinstance(self.slow_fast, SlowFastSettings):
            self.slow_fast = SlowFastSettings(**dict(self.slow_fast))
        self.group_stages = list(self.group_stages or [])
        feedback = getattr(self.prompt_condition, "feedback_stage", None)
        if feedback is not None and feedback not in self.group_stages:
            # a prompt condition that learns from the scored rows (TAPO's pattern statistics): its stage runs last
            self.group_stages.append(feedback)
        if self.sampling_temperature is not None and not callable(self.sampling_temperature):
            # settings; the trainer builds the schedule (rlexp.rollout.temperature) and hands it to the rollout
            self.sampling_temperature = dict(self.sampling_temperature)
            if self.sampling_temperature.get("schedule") not in ("annealed", "entropy"):
                raise ValueError(
                    f"algorithm.sampling_temperature.schedule={self.sampling_temperature.get('schedule')!r} is not "
                    "one of ['annealed', 'entropy'] (rlexp/rollout/temperature.py)"
                )
        if self.rollout_correction is not None and not callable(self.rollout_correction):
            from rlexp.algorithms.regularisers.rollout_correction import RolloutCorrection

            cfg = dict(self.rollout_correction)
            unknown = sorted(set(cfg) - {"mode", "threshold"})
            if unknown:
                raise ValueError(f"algorithm.rollout_correction: unknown setting(s) {unknown}; known: mode, threshold")
            self.rollout_correction = RolloutCorrection(**cfg)
        if self.curvature_mask is not None:
            if not callable(self.curvature_mask) or not hasattr(self.curvature_mask, "top_k"):
                raise ValueError(
                    "algorithm.curvature_mask must be rlexp.algorithms.regularisers.curvature.CurvatureMask, got "
                    f"{type(self.curvature_mask).__name__}"
                )
            if self.loss_support_k:
                raise ValueError("algorithm.curvature_mask and a sparse-support loss (TROLL) both read the old top-K")
        if self.action_mask is not None and not isinstance(self.action_mask, ActionMaskSettings):
            self.action_mask = ActionMaskSettings(**dict(self.action_mask))
        if self.action_mask is not None and self.loss_vocab_mean:
            raise ValueError(
                "algorithm.action_mask renormalises the policy on a subset of the vocabulary; algorithm.loss reads the "
                "mean of log π over the whole vocabulary (ROVER): set one"
            )
        if self.entropy_control is not None:
            if not callable(getattr(self.entropy_control, "token_term", None)):
                raise ValueError(
                    "algorithm.entropy_control must be a part of rlexp.algorithms.regularisers.entropy (EntropyBonus, "
                    f"EntropyBand), got {type(self.entropy_control).__name__}"
                )
            if self.entropy_coef:
                raise ValueError("algorithm.entropy_coef and algorithm.entropy_control are two entropy terms: set one")
        if self.family and self.family not in FAMILIES:
            raise ValueError(f"algorithm.family={self.family!r} is not one of {sorted(FAMILIES)}")
        if self.aggregation not in MODES:
            raise ValueError(f"algorithm.aggregation={self.aggregation!r} is not one of {MODES}")
        wanted = getattr(self.loss, "required_aggregation", None)  # CHORD: per-part token means
        if wanted is not None and self.aggregation != wanted:
            raise ValueError(
                f"algorithm.loss ({_name(self.loss)}) needs algorithm.aggregation={wanted}, got {self.aggregation!r}"
            )
        for stage in self.group_stages:  # a stage whose per-row loss weights need token means (group-robust weights)
            need = getattr(stage, "required_aggregation", None)
            if need is not None and self.aggregation != need:
                raise ValueError(
                    f"algorithm.group_stages: {_name(stage)} weighs rows through the loss mask and needs "
                    f"algorithm.aggregation={need}, got {self.aggregation!r}"
                )
        stage_keys = {k for s in self.group_stages for k in getattr(s, "provides_extras", ())}
        unset = [k for k in getattr(self.loss, "stage_extras", ()) if k not in stage_keys]
        if unset:  # LUFFY, CHORD: the demonstration rows' marks
            raise ValueError(
                f"algorithm.loss ({_name(self.loss)}) reads batch.extras {unset}, which no stage in "
                "algorithm.group_stages sets (rlexp.algorithms.group_stages.demonstrations.Demonstrations does)"
            )
        if self.token_count_guard not in TOKEN_COUNT_GUARDS:
            raise ValueError(
                f"algorithm.token_count_guard={self.token_count_guard!r} is not one of {list(TOKEN_COUNT_GUARDS)}"
            )
        if self.unscored_rows not in UNSCORED_ROWS:
            raise ValueError(f"algorithm.unscored_rows={self.unscored_rows!r} is not one of {list(UNSCORED_ROWS)}")
        if self.kl.estimator not in ESTIMATORS:
            raise ValueError(f"algorithm.kl.estimator={self.kl.estimator!r} is not one of {ESTIMATORS}")
        if self.kl.mode not in ("loss", "reward"):
            raise ValueError(f"algorithm.kl.mode={self.kl.mode!r} is not one of ['loss', 'reward']")
        if self.kl.coef < 0:
            raise ValueError(f"algorithm.kl.coef must be >= 0, got {self.kl.coef}")
        if self.kl.clamp and self.kl.estimator.rstrip("+") != "k3":
            raise ValueError(
                f"algorithm.kl.clamp=true is verl's k3 (low_var_kl) clamp; algorithm.kl.estimator={self.kl.estimator!r}"
            )
        if self.kl.bias_correction and self.kl.mode != "loss":
            raise ValueError(
                "algorithm.kl.bias_correction=true weights the KL loss term: it needs algorithm.kl.mode=loss"
            )
        if self.reference.kind not in KINDS:
            raise ValueError(f"algorithm.reference.kind={self.reference.kind!r} is not one of {KINDS}")
        if self.reference.model is not None and self.reference.kind != "frozen":
            raise ValueError(
                f"algorithm.reference.model loads a fixed reference: it needs algorithm.reference.kind=frozen, "
                f"got {self.reference.kind!r}"
            )
        if self.needs_reference and self.reference.kind == "none":
            raise ValueError("algorithm.reference.kind=none but the KL term or a group stage needs a reference model")
        if self.num_generations is not None and self.num_generations < 1:
            raise ValueError(f"algorithm.num_generations={self.num_generations} must be >= 1 or null")
        if self.steps_per_rollout < 1:
            raise ValueError(f"algorithm.steps_per_rollout={self.steps_per_rollout} must be >= 1")
        if self.reincarnate_at is not None and self.reincarnate_at < 1:
            raise ValueError(f"algorithm.reincarnate_at={self.reincarnate_at} must be >= 1 or null")
        if self.num_iterations < 1:
            raise ValueError(f"algorithm.num_iterations={self.num_iterations} must be >= 1")
        sf = self.slow_fast
        if sf.fast_steps < 0 or not 0.0 <= sf.step_size <= 1.0 or sf.stop_window < 0:
            raise ValueError(
                f"algorithm.slow_fast: fast_steps={sf.fast_steps} must be >= 0, step_size={sf.step_size} in [0, 1], "
                f"stop_window={sf.stop_window} >= 0"
            )
        if self.top_entropy_normaliser not in ("all", "selected"):
            raise ValueError(
                f"algorithm.top_entropy_normaliser={self.top_entropy_normaliser!r} is not one of ['all', 'selected']"
            )
        if self.top_entropy_normaliser == "selected" and self.aggregation != "token-mean":
            raise ValueError("algorithm.top_entropy_normaliser=selected needs algorithm.aggregation=token-mean")
        if not 0.0 < self.top_entropy_quantile <= 1.0:
            raise ValueError(f"algorithm.top_entropy_quantile={self.top_entropy_quantile} must be in (0, 1]")
        if self.critic is not None:
            if not hasattr(self.critic, "stage") or not hasattr(self.critic, "update"):
                raise ValueError(
                    f"algorithm.critic must be a rlexp.algorithms.critics.ppo.Critic, got {type(self.critic).__name__}"
                )
            self.group_stages.append(self.critic.stage)  # values of the final batch, before advantages
            if self.unscored_rows == "exclude":
                raise ValueError(
                    "algorithm.unscored_rows=exclude is not available with algorithm.critic (GAE's returns of the "
                    "left-out rows would train the value head toward 0)"
                )
        for stage in self.group_stages:  # a stage that works with the method's own parts (BRIDGE's teacher: λ, RL loss)
            bind = getattr(stage, "bind", None)
            if callable(bind):
                bind(self)

    @property
    def loss_batch_extras(self) -> tuple[str, ...]:
        """The ``batch.extras`` keys the loss reads per row (GBPO's target signal); the trainer slices them per
        micro-batch and passes them to ``token_loss`` as ``extras``."""
        return loss_batch_extras(self.loss)

    @property
    def token_loss_extras(self) -> tuple[str, ...]:
        """Every ``batch.extras`` key ``token_loss`` reads per row: the loss's, and the KL's per-row weights when the
        estimator or a group stage sets them (APO's difficulty-adaptive KL, group invariant learning's per-group KL)."""
        by_stage = any(KL_ROW_WEIGHTS in getattr(s, "provides_extras", ()) for s in self.group_stages)
        weights = (KL_ROW_WEIGHTS,) if by_stage or getattr(_function(self.advantage), "kl_row_weights", False) else ()
        return (*self.loss_batch_extras, *weights)

    @property
    def selects_over_mini_batch(self) -> bool:
        """The loss picks its tokens over the whole mini-batch (Clip-Cov, KL-Cov with ``scope=mini_batch``): the
        trainer calls ``loss.select`` once per optimiser step and passes each micro-batch its slice."""
        return getattr(self.loss, "scope", None) == "mini_batch" and callable(getattr(self.loss, "select", None))

    @property
    def loss_support_k(self) -> int:
        """K > 0: the loss works on the old policy's sparse support (TROLL): the trainer keeps the old top-K of each
        position beside the old log-probs, and the forward gathers the current log-probs on it."""
        return int(getattr(self.loss, "support_k", 0) or 0)

    @property
    def advantage_needs_entropy(self) -> bool:
        """The estimator weights rewards by the old policy's token entropies (GTPO, GRPO-S): marked
        ``token_entropy = True``; the trainer puts them in ``batch.extras["token_entropy"]``."""
        return bool(getattr(_function(self.advantage), "token_entropy", False))

    @property
    def advantage_hidden_rank(self) -> dict | None:
        """{stride, center}: the estimator reads each completion's hidden-state effective rank and its dynamics
        (VERL; marked ``hidden_rank = True``); the trainer puts them in ``batch.extras["hidden_rank"]``. None: not
        needed (no hidden states are kept)."""
        if not getattr(_function(self.advantage), "hidden_rank", False):
            return None
        from rlexp.algorithms.advantages.hidden_rank import hidden_rank_settings

        return hidden_rank_settings(self.advantage)

    @property
    def curvature_topk(self) -> int:
        """K > 0: CAPO's curvature mask reads the old policy's final hidden states and top-K tokens, kept by the old
        log-probs' forward in ``batch.extras`` (``rlexp.core.masks.CURVATURE_*``); 0: none."""
        return int(self.curvature_mask.top_k) if self.curvature_mask is not None else 0

    @property
    def loss_minp(self) -> float:
        """κ > 0: the loss reads the old policy's min-p proxy log-probs (Lp-Reg), computed in the old forward."""
        return float(getattr(self.loss, "minp", 0.0) or 0.0)

    @property
    def loss_vocab_mean(self) -> bool:
        """The loss reads the vocabulary mean of log π at each position (ROVER's uniform valuation of the next state):
        marked ``vocab_mean = True``; the forward computes it beside the log-probs (the old forward's into
        ``batch.extras["old_mean_logprobs"]``, the current one's passed to ``token_loss`` as ``vocab_mean_logp``)."""
        return bool(getattr(self.loss, "vocab_mean", False))

    @property
    def entropy_clamp(self) -> float:
        """p > 0: the entropy bonus is AEnt's clamped entropy, computed by the forward beside the log-probs."""
        return float(self.entropy_control.clamp) if self.entropy_control is not None else 0.0

    @property
    def entropy_grad(self) -> bool:
        """The loss differentiates the token entropies (a full-vocabulary entropy bonus)."""
        return bool(self.entropy_coef) or (self.entropy_control is not None and not self.entropy_clamp)

    def after_update(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Parts that adapt to the step's update (the entropy bonus's coefficient; a group stage's own step after the
        policy's, BRIDGE's teacher and shadow); their metrics."""
        out = {} if self.entropy_control is None else dict(self.entropy_control.update(step, metrics))
        for stage in self.group_stages:
            hook = getattr(stage, "after_update", None)
            if callable(hook):
                out.update(hook(step, metrics))
        return out

    @property
    def loss_needs_old_forward(self) -> bool:
        """The loss reads the old policy's log-probs on every row, demonstration rows included (RL-PLUS's multiple
        importance sampling, through ``precedent_logprobs``): marked ``needs_old_forward = True``; the trainer then
        computes them with a forward even when the update is a single on-policy optimiser step."""
        return bool(getattr(self.loss, "needs_old_forward", False))

    @property
    def loss_needs_reference(self) -> bool:
        """The policy loss itself reads the reference log-probs (CoPG's β·log π/π_ref inside its loss)."""
        return bool(getattr(self.loss, "needs_reference", False))

    @property
    def needs_reference(self) -> bool:
        return (
            self.kl.coef > 0
            or self.loss_needs_reference
            or any(getattr(s, "needs_reference", False) for s in self.group_stages)
        )

    def compute_advantages(self, batch):
        """The estimator's advantages for ``batch``. With ``unscored_rows=exclude`` the rows no reward term
        scored (``batch.extras["unscored"]``) are left out of the estimator's batch — its group and batch
        statistics — and get advantage 0 (TRL's convention for a sample whose reward functions all returned
        None); per-row extras the estimator adds are 0 for them. Token rewards (``batch.extras["token_rewards"]``)
        need an estimator that pays rewards per token (REINFORCE++, GAE): any other would drop them silently."""
        if TOKEN_REWARDS in batch.extras and not consumes_token_rewards(self.advantage):
            raise ValueError(
                "batch.extras['token_rewards'] holds per-token rewards but algorithm.advantage "
                f"({_name(self.advantage)}) uses the outcome reward only: use reinforce_pp or gae"
            )
        skip = batch.extras.get(UNSCORED) if self.unscored_rows == "exclude" else None
        if skip is None or not bool(skip.any()):
            return self.advantage(batch)
        skip = skip.bool().to(batch.reward.device)
        keep = (~skip).nonzero().squeeze(-1)
        if keep.numel() == 0 and not batch_is_spread():  # nothing scored: no statistics, no signal
            return torch.zeros(len(batch), device=batch.reward.device)
        # (in a distributed step the estimator runs on the empty share too: its batch statistics are collectives)
        sub = batch.select(keep)
        before = set(sub.extras)
        adv = self.advantage(sub)
        for key in set(sub.extras) - before:  # per-row fields the estimator wrote (GBPO's target)
            v = sub.extras[key]
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == keep.numel():
                full = torch.zeros((len(batch), *v.shape[1:]), dtype=v.dtype, device=v.device)
                full[keep.to(v.device)] = v
                batch.extras[key] = full
        out = torch.zeros((len(batch), *adv.shape[1:]), dtype=adv.dtype, device=adv.device)
        out[keep.to(adv.device)] = adv
        return out

    def reincarnated(self, step: int) -> bool:
        """Step ``step`` comes after the policy reincarnation (``reincarnate_at``): it trains on-policy."""
        return self.reincarnate_at is not None and step > self.reincarnate_at

    def on_step(self, step: int, max_steps: int) -> None:
        """Tell a part with a schedule over training (MDPO's annealed step size) which train step begins."""
        hook = getattr(self.loss, "on_step", None)
        if callable(hook):
            hook(step, max_steps)

    def token_loss(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        entropy: torch.Tensor | None = None,
        ref_logp: torch.Tensor | None = None,
        selected: torch.Tensor | None = None,
        extras: dict[str, torch.Tensor] | None = None,
        support_logp: torch.Tensor | None = None,
        clamped_entropy: torch.Tensor | None = None,
        vocab_mean_logp: torch.Tensor | None = None,
    ) -> LossOutput:
        """Per-token loss of one micro-batch (before aggregation) and its per-token statistics. ``selected``: this
        micro-batch's slice of the loss's mini-batch token selection (``selects_over_mini_batch``). ``extras``:
        this micro-batch's rows of the ``batch.extras`` fields the loss reads (``loss_batch_extras``). A loss with
        an ``entropy`` parameter gets the token entropies. ``clamped_entropy``: AEnt's entropy (with gradient) for the
        entropy bonus when its clamp is > 0."""
        kwargs: dict = {} if selected is None else {"selected": selected}
        kl_rows = (extras or {}).get(KL_ROW_WEIGHTS)  # APO: the KL's weight per row
        for key in self.loss_batch_extras:
            if extras is None or key not in extras:
                raise ValueError(
                    f"algorithm.loss reads batch.extras[{key!r}], which no stage or advantage estimator provided "
                    f"(see the loss's docstring for the part that sets it)"
                )
            kwargs[key] = extras[key]
        if self.loss_support_k:  # TROLL: the current log-probs on the old policy's support
            kwargs["support_logprobs"] = support_logp
        if self.loss_vocab_mean:  # ROVER: the current policy's vocabulary mean of log π (no gradient)
            if vocab_mean_logp is None:
                raise ValueError("algorithm.loss needs the vocabulary mean of the log-probs (vocab_mean_logp)")
            kwargs["mean_logprobs"] = vocab_mean_logp.detach()
        if getattr(self.loss, "takes_ref_logp", False):  # A*-PO: the sequence log-ratio to the reference in the loss
            if ref_logp is None:
                raise ValueError("algorithm.loss needs the reference log-probs (batch.ref_logprobs)")
            kwargs["ref_logp"] = ref_logp
        if loss_takes_entropy(self.loss):
            if entropy is None:
                raise ValueError("algorithm.loss needs token entropies")
            kwargs["entropy"] = entropy.detach()
        out = self.loss(logp, old_logp, advantages, mask, **kwargs)
        per_token, stats = out.per_token, dict(out.token_stats)
        keep = None
        if self.top_entropy_quantile < 1.0:
            if entropy is None:
                raise ValueError("algorithm.top_entropy_quantile < 1 needs token entropies")
            keep = high_entropy_mask(entropy, mask, self.top_entropy_quantile)
            per_token = per_token * keep
            stats["entropy/selected_frac"] = keep.float()
        if self.kl.coef > 0 and self.kl.mode == "loss":
            if ref_logp is None:
                raise ValueError("algorithm.kl.mode=loss needs reference log-probs")
            kl = kl_estimate(logp, ref_logp, self.kl.estimator, self.kl.clamp)
            stats["kl/mean"] = kl.detach()
            if self.kl.bias_correction:  # TRL's use_bias_correction_kl: E_old[r·KL_t] is KL under π_θ
                kl = kl * torch.exp(logp - old_logp)
            if kl_rows is not None:
                kl = kl * kl_rows.to(kl.dtype)[:, None]
            per_token = per_token + self.kl.coef * kl
        if self.entropy_coef:
            if entropy is None:
                raise ValueError("algorithm.entropy_coef needs token entropies")
            per_token = per_token - self.entropy_coef * entropy
        if self.entropy_control is not None:
            h = clamped_entropy if self.entropy_clamp else entropy
            if h is None:
                raise ValueError("algorithm.entropy_control needs the token entropies of the forward")
            term, term_stats = self.entropy_control.token_term(h, mask, keep)
            per_token = per_token + term
            stats.update(term_stats)
        return LossOutput(per_token, stats)


def _function(part: Callable) -> Callable:
    while hasattr(part, "func"):  # functools.partial
        part = part.func
    return part


def _name(part: Callable) -> str:
    return getattr(_function(part), "__name__", type(part).__name__)


def consumes_token_rewards(advantage: Callable) -> bool:
    """The estimator pays rewards per token (``batch.extras["token_rewards"]``): marked ``token_rewards = True``."""
    return bool(getattr(_function(advantage), "token_rewards", False))
