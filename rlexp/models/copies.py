"""Copies of the policy's weights (a frozen reference, a generation copy, a judge's initial policy) that also work
when the policy is sharded (distributed=fsdp: PyTorch FSDP2, whose modules refuse ``copy.deepcopy``)."""

from __future__ import annotations

import copy

import torch


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 unit (``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def weights_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An independent, unsharded copy of ``model`` with its current weights: ``copy.deepcopy`` for a plain module; for
    a sharded transformers model, the same class built from its config and filled with its full parameters (each
    sharded one gathered with ``DTensor.full_tensor``: a collective, so every process copies at the same point)."""
    if not is_sharded(model):
        return copy.deepcopy(model)
    from torch.distributed.fsdp import FSDPModule

    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))  # FSDP2 subclasses the model's class
    first = next(model.parameters())
    out = cls._from_config(model.config).to(device=first.device, dtype=first.dtype)
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in model.named_parameters()}
    missing, unexpected = out.load_state_dict(full, strict=False)
    tied = set(getattr(out, "_tied_weights_keys", None) or ())
    if unexpected or [m for m in missing if m not in tied and "lm_head" not in m]:
        raise RuntimeError(f"weights_copy of {cls.__name__}: missing={missing} unexpected={unexpected}")
    return out
