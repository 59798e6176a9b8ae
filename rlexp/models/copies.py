"""Copies of the policy's weights (a frozen reference, a generation copy, a judge's initial policy) that also work
when the policy is sharded (distributed=fsdp: PyTorch FSDP2, whose modules refuse ``copy.deepcopy``; deepspeed_zero*:
DeepSpeed's ZeRO, whose parameters carry links to the partitioned optimiser state and, under ZeRO-3, hold no data
outside a gathering)."""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext

import torch


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 unit (``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def zero_stage(model: torch.nn.Module) -> int:
    """The ZeRO stage whose engine manages ``model``'s parameters (3: partitioned, ``ds_id``; 2: linked to
    partitioned optimiser state, ``_hp_mapping``); 0 for a plain model."""
    for p in model.parameters():  # any: a frozen parameter has no link to optimiser state under ZeRO-2
        if hasattr(p, "ds_id"):
            return 3
        if hasattr(p, "_hp_mapping"):
            return 2
    return 0


def zero3_gathered(model: torch.nn.Module, modifier_rank: int | None = None):
    """ZeRO-3: the full weights of ``model`` until the block ends (``deepspeed.zero.GatheredParameters``, a
    collective), gathering only those not gathered already (DeepSpeed refuses nested gatherings of a parameter: a
    copy made inside the rollout phase finds them gathered)."""
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    missing = [p for p in model.parameters() if getattr(p, "ds_status", None) != ZeroParamStatus.AVAILABLE]
    if not missing:
        return nullcontext()
    return deepspeed.zero.GatheredParameters(missing, modifier_rank=modifier_rank)


@contextmanager
def full_parameters(model: torch.nn.Module):
    """``model``'s parameters as (name, full tensor) pairs in ``named_parameters`` order, readable until the block
    ends: a plain or ZeRO-2 model's own; an FSDP-sharded one's gathered one at a time as they are read
    (``DTensor.full_tensor``); ZeRO-3's gathered for the block. A collective under FSDP and ZeRO-3: every process
    reads them all, at the same point."""
    with zero3_gathered(model) if zero_stage(model) == 3 else nullcontext():
        yield ((n, (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()) for n, p in model.named_parameters())


def weights_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An independent, unsharded copy of ``model`` with its current weights: ``copy.deepcopy`` for a plain module; for
    a sharded transformers model, the same class built from its config and filled with its full parameters (each
    sharded one gathered with ``DTensor.full_tensor``, or ZeRO-3's ``GatheredParameters``: a collective, so every
    process copies at the same point)."""
    stage = zero_stage(model)
    if not is_sharded(model) and not stage:
        return copy.deepcopy(model)
    first = next(model.parameters())
    out = _same_architecture(model).to(device=first.device, dtype=first.dtype)
    # copied into ``out`` inside the block: a ZeRO-3 parameter's data is freed at the gathering's end
    with full_parameters(model) as params:
        missing, unexpected = out.load_state_dict(dict(params), strict=False)
    tied = set(getattr(out, "_tied_weights_keys", None) or ())
    if unexpected or [m for m in missing if m not in tied and "lm_head" not in m]:
        raise RuntimeError(f"weights_copy of {type(out).__name__}: missing={missing} unexpected={unexpected}")
    return out


def _same_architecture(model: torch.nn.Module) -> torch.nn.Module:
    """A freshly initialised module of ``model``'s architecture (its weights to be loaded): the transformers class
    from its config; a peft model (LoRA under FSDP or DeepSpeed) is its base rebuilt so and wrapped with the same
    adapters, so its parameters come in the same order."""
    from rlexp.models.peft import is_peft

    if is_peft(model):
        from peft import get_peft_model

        return get_peft_model(_same_architecture(model.get_base_model()), model.peft_config[model.active_adapter])
    from torch.distributed.fsdp import FSDPModule

    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))  # FSDP2 subclasses the model's class
    return cls._from_config(model.config)
