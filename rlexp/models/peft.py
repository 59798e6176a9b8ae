"""LoRA adapters through the ``peft`` library (``model.peft``; ``+model/peft=lora`` composes the defaults).

Only the adapters train; the base weights stay frozen and are never copied: the reference policy of a KL term is the
same model with its adapters disabled (``AdaptersOff``), checkpoints hold the adapters (``save_pretrained`` of a
``PeftModel``), and an inference engine that takes full weights (vLLM) receives the merged ones
(``merged_state_dict``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

METHODS = ("lora",)
LORA_KEYS = ("method", "r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora")


def check_peft_config(cfg) -> None:
    """Raise ``ValueError`` naming the ``model.peft.*`` key of a bad LoRA setting (at config time)."""
    if cfg is None:
        return
    if not isinstance(cfg, Mapping):
        raise ValueError(f"model.peft={cfg!r}: expected a mapping (compose one with +model/peft=lora) or null")
    unknown = sorted(set(cfg) - set(LORA_KEYS))
    if unknown:
        raise ValueError(f"model.peft.{unknown[0]}: unknown key (known: {', '.join(LORA_KEYS)})")
    if cfg.get("method", "lora") not in METHODS:
        raise ValueError(f"model.peft.method={cfg.get('method')!r} is not one of {list(METHODS)}")
    r = cfg.get("r", 16)
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"model.peft.r={r!r} must be an integer >= 1")
    alpha = cfg.get("lora_alpha", 32)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise ValueError(f"model.peft.lora_alpha={alpha!r} must be > 0")
    dropout = cfg.get("lora_dropout", 0.0)
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"model.peft.lora_dropout={dropout!r} must be in [0, 1)")
    targets = cfg.get("target_modules")
    if not targets or isinstance(targets, str) and targets != "all-linear":
        raise ValueError(f"model.peft.target_modules={targets!r}: a non-empty list of module names, or 'all-linear'")
    if cfg.get("bias", "none") not in ("none", "all", "lora_only"):
        raise ValueError(f"model.peft.bias={cfg.get('bias')!r} is not one of ['none', 'all', 'lora_only']")


def apply_lora(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """Wrap ``model`` in a ``PeftModel`` with LoRA adapters (B initialised to 0, so the wrapped model computes
    exactly what the base did); only the adapter parameters require gradients."""
    from peft import LoraConfig, get_peft_model

    check_peft_config(cfg)
    targets = cfg.get("target_modules")
    lora = LoraConfig(
        r=int(cfg.get("r", 16)),
        lora_alpha=float(cfg.get("lora_alpha", 32)),
        lora_dropout=float(cfg.get("lora_dropout", 0.0)),
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias=cfg.get("bias", "none"),
        use_rslora=bool(cfg.get("use_rslora", False)),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class AdaptersOff(torch.nn.Module):
    """The base model of a ``PeftModel`` as a module of its own: every call runs the policy with its adapters
    disabled, so a LoRA run's frozen reference costs no second copy of the weights. Holds no parameters."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "policy", policy)  # not a submodule: no parameters, no state_dict

    def forward(self, *args, **kwargs):
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)

    @property
    def config(self):
        return self.policy.config

    def parameters(self, recurse: bool = True):  # for device / dtype look-ups (frozen base weights first)
        return (p for p in self.policy.parameters(recurse) if not p.requires_grad)


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The base model's state dict with every LoRA delta folded in (W + scale·B·A), under the base model's own
    parameter names: what a full-weight engine (vLLM) loads. The policy itself is left as it is."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.base_layer.weight"] = (name + ".weight", delta)
    out = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        if key in deltas:
            new_key, delta = deltas[key]
            out[new_key] = value + delta.to(value.dtype)
        else:
            out[key.replace(".base_layer.", ".")] = value
    return out


def saved_adapter_names(model) -> dict[str, str]:
    """For each trainable parameter of a ``PeftModel``, the key ``save_pretrained`` writes it under (the adapter's name
    taken out after its ``lora_*`` module: ``...q_proj.lora_A.default.weight`` is saved as ``...q_proj.lora_A.weight``)
    mapped to the parameter's own name."""
    adapter = re.escape(model.active_adapter)
    return {
        re.sub(rf"(\.lora_[A-Za-z_]+)\.{adapter}(?=\.|$)", r"\1", name): name
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def adapters_by_name(model, state: dict[str, torch.Tensor], where) -> dict[str, torch.Tensor]:
    """A checkpoint's adapters (``save_pretrained``'s keys) keyed by the model's parameter names: how a sharded model
    (FSDP) loads them. A key the model has no adapter for, or an adapter the checkpoint lacks, raises naming it."""
    _require_adapters(model, where)
    names = saved_adapter_names(model)
    unexpected = sorted(set(state) - set(names))
    missing = sorted(n for k, n in names.items() if k not in state)
    if unexpected or missing:
        _mismatch(where, missing, unexpected)
    return {names[k]: v for k, v in state.items()}


def _require_adapters(model, where) -> None:
    if not is_peft(model):
        raise RuntimeError(f"checkpoint {where} holds LoRA adapters but the model has none: add model/peft=lora")


def _mismatch(where, missing, unexpected):
    raise RuntimeError(
        f"checkpoint {where} does not match the model's adapters: missing={missing[:5]} unexpected={unexpected[:5]} "
        "(model.peft settings differ from the run's?)"
    )


def load_adapters(model, state: dict[str, torch.Tensor], where) -> None:
    """Load adapter weights saved by ``PeftModel.save_pretrained`` into ``model`` (a ``PeftModel``)."""
    from peft import set_peft_model_state_dict

    _require_adapters(model, where)
    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", None) or []
    lora_missing = [k for k in getattr(result, "missing_keys", None) or [] if ".lora_" in k]
    if unexpected or lora_missing:
        _mismatch(where, lora_missing, unexpected)
