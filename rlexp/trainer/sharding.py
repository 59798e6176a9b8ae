"""Fully sharded data parallel (``distributed=fsdp``): PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) over
the processes ``accelerate launch`` / ``torchrun`` started; everything else of the step is the data-parallel one of
``rlexp.trainer.distributed`` (prompt shards of whole groups, global loss normalisers, reduced metrics, main-process
logging).

Where the parameters live in a step:

* **Rollout and scoring** (generation, reward terms, group stages, the recomputed old log-probs): the policy is
  gathered once at the step's start (``gathered``: every FSDP unit all-gathers its parameters and keeps them until
  the update), so each process generates on its own, with its own number of decode steps and forwards, and no
  collective runs inside generation. The peak memory of this phase is that of the full parameters (as in verl's
  FSDP workers with their Hugging Face rollout); optimiser state and gradients stay sharded throughout.
* **Update**: sharded (ZeRO-3 with ``reshard_after_forward: true``, ZeRO-2-like with false). Every forward and
  backward of a micro-batch is a collective, so the processes run the same number of micro-batches per optimiser step:
  a process with fewer runs ``idle_pass`` (one token, zero loss) for the missing ones. Gradients are reduce-scattered
  as sums (``set_gradient_divide_factor(1)``: each process's loss is already its share of the global loss), then
  clipped over the shards (``clip_grad_norm_`` on DTensors) and stepped on each shard.
* **LoRA** (``model.peft``): the ``PeftModel`` is sharded like any model (FSDP2 units may mix frozen and trainable
  parameters): the frozen base is sharded too, only the adapters get gradients and AdamW state, the reference is the
  policy with its adapters off (``rlexp.models.peft.AdaptersOff``, run inside the gathered phase), and a checkpoint
  holds the adapters gathered to the main process (``load_adapters`` puts them back into the shards).
* **Evaluation and checkpoints**: evaluation runs on the main process inside ``gathered``; a checkpoint holds the
  full weights and the full optimiser state gathered to the main process (``torch.distributed.checkpoint``'s
  ``get_model_state_dict`` / ``get_optimizer_state_dict``), in the single-process files, so it resumes with any process
  count and strategy (``load_model_state`` / ``load_optimizer_state``).

Copies of the policy (a frozen or EMA KL reference, a judge's initial policy, the rollout's bf16 generation copy) are
not sharded: each process keeps a full one (no gradient, no optimiser state; ``rlexp.models.copies.weights_copy``). An
EMA reference's update and ReMix's reincarnation read the policy's full parameters after the optimiser step, on every
process (``rlexp.models.copies.full_parameters``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

FSDP_KEYS = ("reshard_after_forward",)


@dataclass(frozen=True)
class FSDPSettings:
    """``distributed.fsdp`` (conf/distributed/fsdp.yaml)."""

    reshard_after_forward: bool = True

    @classmethod
    def from_dict(cls, data: dict | None) -> FSDPSettings:
        from rlexp.config.schema import ConfigError

        data = dict(data or {})
        unknown = sorted(set(data) - set(FSDP_KEYS))
        if unknown:
            raise ConfigError(
                f"distributed.fsdp.{unknown[0]} is not a setting of FSDP here (known: {', '.join(FSDP_KEYS)})"
            )
        return cls(**data)


def sharded_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, each one FSDP unit: the classes transformers names in ``_no_split_modules`` (the
    decoder layers; accelerate's TRANSFORMER_BASED_WRAP picks the same)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(
            f"distributed=fsdp: {type(model).__name__} names no blocks to shard (transformers' _no_split_modules)"
        )
    return blocks


def shard_model(model: torch.nn.Module, settings: FSDPSettings) -> list:
    """Shard ``model`` in place over the default process group: one FSDP unit per block and the root (embeddings,
    tied head, final norm). Its parameters become DTensors; build the optimiser after this. Returns the units."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for block in sharded_blocks(model):
        fully_shard(block, reshard_after_forward=settings.reshard_after_forward)
    fully_shard(model, reshard_after_forward=settings.reshard_after_forward)
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        # sums, not means: each process's loss is its share of the global loss (rlexp.algorithms.aggregation);
        # forced SUM reductions, since gloo has no pre-multiplied sum
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return units


def fsdp_units(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: torch.nn.Module, reshard_after_forward: bool = True):
    """The full parameters on every process until the block ends (a collective at entry: every process enters);
    forwards inside need no collective, so the processes may run different numbers of them. At the end the units are
    resharded and get ``reshard_after_forward`` (the run's setting) back."""
    units = fsdp_units(model)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            # the root keeps its parameters after forward (FSDP2's own choice for the root: backward needs them next)
            unit.set_reshard_after_forward(reshard_after_forward and unit is not model, recurse=False)


def idle_pass(model: torch.nn.Module, backward=None) -> None:
    """A micro-batch that changes nothing (one token, zero loss) but joins the collectives of a real one's forward and
    backward: for a process with fewer micro-batches than another in the same optimiser step. ``backward``: how the
    step runs a loss's backward (DeepSpeed's engine: ``ZeRO.backward``); default ``loss.backward()``."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False).logits
    loss = logits.float().sum() * 0.0
    if backward is None:
        loss.backward()
    else:
        backward(loss)


# ---- checkpoints: full states on the main process ------------------------------------------------------------------
def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(model: torch.nn.Module) -> dict:
    """The full weights on the main process (an empty dict elsewhere), on the CPU. A collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The full optimiser state keyed by parameter name, on the main process (empty elsewhere). A collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_model_state(model: torch.nn.Module, state: dict) -> tuple[list[str], list[str]]:
    """Load full weights (every process holds them) into the sharded model; (missing, unexpected) keys."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    result = set_model_state_dict(model, dict(state), options=_options(strict=False))
    return list(result.missing_keys), list(result.unexpected_keys)


def load_adapters(model: torch.nn.Module, state: dict, where) -> None:
    """LoRA adapters of a checkpoint (``PeftModel.save_pretrained``'s keys; every process holds them) into the sharded
    ``PeftModel`` (model.peft under FSDP), each into its parameter's shards by name."""
    from rlexp.models.peft import adapters_by_name

    load_model_state(model, adapters_by_name(model, state, where))


def keyed_by_name(state: dict) -> bool:
    """Whether an optimiser state dict names its parameters (``get_optimizer_state_dict``) rather than numbering them
    (``Optimizer.state_dict``)."""
    return any(isinstance(p, str) for g in state.get("param_groups", []) for p in g["params"])


def named_optimizer_state(model: torch.nn.Module, state: dict) -> dict:
    """A numbered optimiser state (a single-process checkpoint) keyed by parameter name: the optimiser was built over
    the model's trainable parameters in ``named_parameters`` order (rlexp.runs.training)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}


def load_optimizer_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    """Load a full optimiser state (named or numbered) into the optimiser of ``model`` (sharded or not)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if not keyed_by_name(state):
        state = named_optimizer_state(model, state)
    set_optimizer_state_dict(model, optimizer, state, options=_options())


def unsupported(cfg, algorithm) -> list[str]:
    """The settings of a run that ``distributed=fsdp`` (or ``deepspeed``) cannot carry yet, each with why (empty: it
    can). Checked before the model is sharded. Copies of the policy (a frozen or EMA reference, NLPO's masking model,
    a judge's initial policy, the bf16 generation copy) are made by ``rlexp.models.copies.weights_copy``; an EMA
    reference's updates, ReMix's reincarnation and NLPO's syncs read ``full_parameters``: both gather the sharded
    weights."""
    out = []
    if cfg.trainer.get("compile"):
        out.append("trainer.compile=true (a compiled forward over FSDP units is not tested here)")
    if getattr(algorithm, "critic", None) is not None:
        out.append("an algorithm with a critic (its value model is a copy of the policy's trunk: distributed=ddp)")
    if algorithm.extragradient:
        out.append("algorithm.extragradient (EGPO's checkpointed backup would hold one process's shards)")
    return out
