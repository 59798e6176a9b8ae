"""Reference models for KL penalties and reference-scored rewards.

* ``none``   – no reference model is kept.
* ``frozen`` – a frozen copy of the initial policy (GRPO, DeepSeekMath 2024); under LoRA the policy itself with
  its adapters disabled (no copy).
* ``frozen`` with ``source`` – a given fixed model (``algorithm.reference.model``: a demonstration or SFT policy, the
  KL anchor of demonstration-regularised RL, "Demonstration-Regularized RL", Tiapkin et al., 2024).
* ``ema``    – a slowly evolving copy, θ_ref ← d·θ_ref + (1−d)·θ every ``interval`` optimiser
  steps (GRPO-CARE, "Consistency-Aware RL for Multimodal Reasoning", 2025: d = 0.995 every 10
  steps in its released script).
"""

from __future__ import annotations

import torch

from rlexp.core.registry import REGULARISERS
from rlexp.models.copies import full_parameters, weights_copy
from rlexp.models.peft import AdaptersOff, is_peft

KINDS = ("none", "frozen", "ema")


@REGULARISERS.register
class ReferenceModel:
    def __init__(
        self,
        policy: torch.nn.Module,
        kind: str = "frozen",
        ema_decay: float = 0.995,
        ema_interval: int = 1,
        source: torch.nn.Module | None = None,
    ):
        if kind not in KINDS:
            raise ValueError(f"algorithm.reference.kind={kind!r} is not one of {KINDS}")
        if not 0.0 <= ema_decay <= 1.0:
            raise ValueError(f"algorithm.reference.ema_decay={ema_decay} must be in [0, 1]")
        if ema_interval < 1:
            raise ValueError(f"algorithm.reference.ema_interval={ema_interval} must be >= 1")
        self.kind, self.ema_decay, self.ema_interval = kind, ema_decay, ema_interval
        self.model = None
        self.reincarnated = False  # reset_to has replaced the weights (ReMix's policy reincarnation)
        if source is not None:  # a given model (a demonstration policy), not the policy's initial weights
            if kind != "frozen":
                raise ValueError(f"a reference model given by algorithm.reference.model must be frozen, got {kind!r}")
            p_vocab = policy.get_input_embeddings().weight.shape[0]
            s_vocab = source.get_input_embeddings().weight.shape[0]
            if p_vocab != s_vocab:
                raise ValueError(
                    f"algorithm.reference.model has a vocabulary of {s_vocab} tokens, the policy {p_vocab}: the KL "
                    "compares token log-probs, so both need the same tokenizer"
                )
            self.model = source.eval()
            self.model.requires_grad_(False)
        elif kind == "frozen" and is_peft(policy):  # LoRA: the base with the adapters off, not a copy
            self.model = AdaptersOff(policy)
        elif kind != "none":
            self.model = weights_copy(policy).eval()  # distributed=fsdp: an unsharded copy of the sharded policy
            self.model.requires_grad_(False)

    @torch.no_grad()
    def after_optimizer_step(self, policy: torch.nn.Module, step: int) -> bool:
        """EMA update after optimiser step ``step`` (1-based). Returns whether it updated."""
        if self.kind != "ema" or step % self.ema_interval:
            return False
        ema_update(self.model, policy, self.ema_decay)
        return True

    @torch.no_grad()
    def reset_to(self, policy: torch.nn.Module) -> None:
        """The reference becomes a copy of ``policy`` as it is now (ReMix's policy reincarnation: the base model
        is replaced by the trained one). Under LoRA the frozen reference is the adapters-off view of the policy,
        which cannot hold other weights."""
        if self.model is None:
            return
        if isinstance(self.model, AdaptersOff):
            raise ValueError(
                "algorithm.reincarnate_at resets the reference to the policy, but under model/peft=lora the frozen "
                "reference is the policy with its adapters off: use algorithm.reference.kind=ema (a full copy)"
            )
        ema_update(self.model, policy, 0.0)
        self.reincarnated = True

    def state_dict(self):
        kept = self.kind == "ema" or self.reincarnated
        return self.model.state_dict() if self.model is not None and kept else None

    def load_state_dict(self, state):
        if state is not None and self.model is not None:
            self.model.load_state_dict(state)
            self.reincarnated = self.kind != "ema"


@torch.no_grad()
def ema_update(target: torch.nn.Module, source: torch.nn.Module, decay: float) -> None:
    """target ← decay·target + (1−decay)·source, parameter by parameter (buffers copied). ``source`` may be sharded
    (distributed=fsdp | deepspeed_zero*: its full parameters are read, a collective every process runs)."""
    with full_parameters(source) as params:
        for t, (_, s) in zip(target.parameters(), params, strict=True):
            t.lerp_(s.to(t.dtype), 1.0 - decay)
    for t, s in zip(target.buffers(), source.buffers()):
        t.copy_(s)
