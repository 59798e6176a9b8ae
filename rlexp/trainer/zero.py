"""DeepSpeed ZeRO-2 / ZeRO-3 (``distributed=deepspeed_zero2|3``): DeepSpeed's engine (``deepspeed.initialize``) over
the processes ``torchrun`` / ``accelerate launch`` / ``deepspeed`` started, around rlexp's own AdamW; everything else
of the step is the data-parallel one of ``rlexp.trainer.distributed`` (prompt shards of whole groups, global loss
normalisers, reduced metrics, main-process logging).

ZeRO-2 partitions the gradients and AdamW's state over the processes (every process keeps the full weights); ZeRO-3
also partitions the weights. Who owns what in a step:

* **rlexp** runs its micro-batches and decides when an optimiser step ends. The engine runs with
  ``managed_gradient_accumulation: false``: each ``engine.backward`` accumulates (ZeRO reduce-scatters each
  backward's gradients into the partitions, a collective), and every ``engine.step`` is an optimiser step. Each
  process's loss is its share of the global loss (``rlexp.algorithms.aggregation``) and ZeRO averages the gradients
  over the processes, so the loss is multiplied by the process count before the backward: the reduced gradient is
  then the single-process one. Because every backward (and under ZeRO-3 every forward) is a collective, a process
  with fewer micro-batches in an optimiser step runs idle passes (``rlexp.trainer.sharding.idle_pass``), as under
  FSDP.
* **The engine** clips (``gradient_clipping`` = ``trainer.max_grad_norm``), steps AdamW on each partition, zeroes
  the gradients and, under ZeRO-3, re-partitions the weights. rlexp's learning-rate schedule acts on the same AdamW's
  parameter groups.
* **Rollout and scoring** (generation, rewards, old log-probs): ZeRO-3 gathers the full weights once for the phase
  (``deepspeed.zero.GatheredParameters``), so each process generates on its own, with its own number of forwards;
  under ZeRO-2 the weights are whole already.
* **Checkpoints** hold the full weights and the full AdamW state keyed by parameter name
  (``deepspeed.utils.safe_get_full_optimizer_state``), in the single-process files: a ZeRO checkpoint resumes on one
  process or under another strategy, and the other way round.

On CPUs (gloo) DeepSpeed's CPU accelerator is used and its shared-memory collective op is marked unavailable before
the engine starts: otherwise it JIT-compiles that C++ op at start (about 70 s on the 2-core machine, and a compiler is
needed). DeepSpeed is an optional dependency (README: Multi-GPU and multi-node training).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch

# settings of DeepSpeed's config that rlexp sets itself (the step's micro-batches and optimiser steps are rlexp's)
OWNED_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "managed_gradient_accumulation",
    "gradient_clipping",
    "optimizer",
    "scheduler",
    "fp16",
    "bf16",
    "zero_allow_untested_optimizer",
)
INSTALL = "DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8"


def check_settings(data: dict | None) -> int:
    """``distributed.deepspeed`` (DeepSpeed's own config, less what rlexp sets): refuse what rlexp owns, naming the
    key; the ZeRO stage (2 or 3)."""
    from rlexp.config.schema import ConfigError

    data = dict(data or {})
    owned = sorted(set(data) & set(OWNED_KEYS))
    if owned:
        raise ConfigError(
            f"distributed.deepspeed.{owned[0]} is set by rlexp (micro-batches, optimiser steps, clipping from "
            f"trainer.*, the optimiser from optimizer=, precision from the model): remove it"
        )
    zero = dict(data.get("zero_optimization") or {})
    stage = zero.get("stage")
    if stage not in (2, 3):
        raise ConfigError(
            f"distributed.deepspeed.zero_optimization.stage={stage!r}: rlexp runs ZeRO stage 2 or 3 "
            "(distributed=deepspeed_zero2 | deepspeed_zero3)"
        )
    return int(stage)


def import_deepspeed(device: torch.device):
    """``deepspeed``, with its CPU accelerator and without its JIT-built shared-memory op on CPUs (gloo does the
    collectives); a clear error when it is not installed."""
    from rlexp.config.schema import ConfigError

    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read once, at DeepSpeed's first get_accelerator()
    try:
        import deepspeed
        import deepspeed.ops
    except ImportError as e:
        raise ConfigError(f"distributed=deepspeed_zero*: DeepSpeed is not installed ({e}); `{INSTALL}`") from None
    if device.type == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


def engine_config(settings: dict, max_grad_norm: float, param_dtype: torch.dtype) -> dict:
    """DeepSpeed's config: the user's ``distributed.deepspeed`` plus what rlexp's step fixes (one micro-batch per
    ``engine.backward``, rlexp-owned accumulation, clipping, precision from the weights)."""
    config = {
        **settings,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": float(max_grad_norm or 0.0),
        "zero_allow_untested_optimizer": True,  # torch's AdamW, stepped by ZeRO on each partition
        "steps_per_print": 1 << 30,  # DeepSpeed's own progress lines off: rlexp logs the steps
    }
    if param_dtype == torch.bfloat16:
        config["bf16"] = {"enabled": True}
    return config


class ZeRO:
    """The DeepSpeed engine of a run and the parts of the step that go through it."""

    def __init__(self, model: torch.nn.Module, optimizer, settings: dict, max_grad_norm: float, world_size: int):
        from rlexp.config.schema import ConfigError

        if type(optimizer) is not torch.optim.AdamW or len(optimizer.param_groups) != 1:
            raise ConfigError(
                f"distributed=deepspeed_zero*: optimizer={type(optimizer).__name__} — ZeRO steps torch's AdamW with "
                "one parameter group here (optimizer=adamw); SPAM and online merging read per-parameter state"
            )
        self.stage = check_settings(settings)
        self.world_size = world_size
        first = next(model.parameters())
        if first.dtype == torch.float16:
            raise ConfigError("distributed=deepspeed_zero*: fp16 weights (loss scaling) are not supported; fp32, bf16")
        self.ds = import_deepspeed(first.device)
        config = engine_config(settings, max_grad_norm, first.dtype)
        self.engine, *_ = self.ds.initialize(model=model, optimizer=optimizer, config=config)
        self.model, self.optimizer = model, optimizer  # the engine's module and its inner AdamW

    # ---- the update ---------------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate this micro-batch's gradient (ZeRO averages over the processes: the loss is scaled back up)."""
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def step(self) -> float:
        """The optimiser step (clip, AdamW on the partitions, zero the gradients); the global gradient norm before
        clipping."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float("nan") if norm is None else float(norm)

    def gathered(self, model: torch.nn.Module):
        """ZeRO-3: the full weights on every process until the block ends (a collective at entry); ZeRO-2: nothing."""
        if self.stage < 3:
            return nullcontext(model)
        from rlexp.models.copies import zero3_gathered

        return zero3_gathered(model)

    # ---- full states (checkpoints) ------------------------------------------------------------------------------
    def full_model_state(self, model: torch.nn.Module) -> dict:
        """The full weights on the CPU (every process; the main one writes them). A collective under ZeRO-3."""
        with self.gathered(model):
            return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def _named_params(self, model) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def _inner_state(self) -> dict:
        """AdamW's state of one flat partition (every partition has the same keys and step)."""
        return next(iter(self.optimizer.state.values()), {})

    def full_optimizer_state(self, model: torch.nn.Module, optimizer=None) -> dict:
        """AdamW's full state keyed by parameter name (``torch.distributed.checkpoint``'s full-state form), on the
        CPU. A collective: every process assembles every parameter's state."""
        from deepspeed.utils import safe_get_full_optimizer_state

        inner = self._inner_state()
        step = inner.get("step")
        keys = [k for k, v in inner.items() if torch.is_tensor(v) and v.dim() > 0]
        state = {}
        for name, p in self._named_params(model):
            entry = {k: safe_get_full_optimizer_state(p, k).detach().to("cpu", copy=True) for k in keys}
            if step is not None:
                entry["step"] = step.detach().to("cpu", copy=True) if torch.is_tensor(step) else step
            state[name] = entry
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        return {"state": state, "param_groups": [{**group, "params": [n for n, _ in self._named_params(model)]}]}

    def load_model_state(self, model: torch.nn.Module, state: dict) -> tuple[list[str], list[str]]:
        """Full weights (every process holds them) into the engine's weights and its fp32 partitions; (missing,
        unexpected) keys."""
        own = model.state_dict().keys()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        modifier = 0 if self.stage == 3 else None
        with torch.no_grad(), self.ds.zero.GatheredParameters(list(model.parameters()), modifier_rank=modifier):
            for k, v in state.items():
                target = params.get(k, buffers.get(k))
                if target is not None:
                    target.data.copy_(v.to(target.device, target.dtype))
        self.engine.optimizer.refresh_fp32_params()  # the partitions AdamW steps, from the weights just written
        return missing, unexpected

    def load_adapters(self, model: torch.nn.Module, state: dict, where) -> None:
        """LoRA adapters of a checkpoint (``PeftModel.save_pretrained``'s keys) into the engine's weights and its
        fp32 partitions (model.peft under DeepSpeed)."""
        from rlexp.models.peft import load_adapters

        if self.stage == 3:
            with torch.no_grad(), self.ds.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
                load_adapters(model, state, where)
        else:
            load_adapters(model, state, where)
        self.engine.optimizer.refresh_fp32_params()

    def _ensure_state(self) -> None:
        """Create AdamW's (lazy) state on the fp32 partitions with a step that changes nothing (zero gradients, lr 0),
        so a checkpoint's state can be written into it. ZeRO-3 hands AdamW one partition at a time (its groups are
        empty between steps); ZeRO-2 links the parameters' views of the state after the first step."""
        if self.optimizer.state:
            return
        zo, groups = self.engine.optimizer, self.optimizer.param_groups
        saved = [(g["lr"], g["params"]) for g in groups]
        if self.stage == 3:
            flats = list(zo.fp32_partitioned_groups_flat)
            for i, g in enumerate(groups):
                g["params"] = [f for j, f in enumerate(flats) if zo.sub_group_to_group_id[j] == i]
        else:
            flats = [p for g in groups for p in g["params"]]
        try:
            for g in groups:
                g["lr"] = 0.0
            for f in flats:
                f.grad = torch.zeros_like(f)
            self.optimizer.step()
        finally:
            for f in flats:
                f.grad = None
            for g, (lr, params) in zip(groups, saved):
                g["lr"], g["params"] = lr, params
        link = getattr(zo, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:
            link()

    def load_optimizer_state(self, model: torch.nn.Module, optimizer, state: dict) -> None:
        """A full AdamW state (keyed by name, or numbered as a single-process checkpoint writes it) into the
        partitions. A collective."""
        from deepspeed.utils import safe_set_full_optimizer_state

        from rlexp.trainer.sharding import keyed_by_name, named_optimizer_state

        if not keyed_by_name(state):
            state = named_optimizer_state(model, state)
        self._ensure_state()
        step = None
        for name, p in self._named_params(model):
            entry = state["state"].get(name)
            if entry is None:
                raise RuntimeError(f"the checkpoint's optimiser state has no entry for parameter {name}")
            for k, v in entry.items():
                if k == "step":
                    step = v
                elif torch.is_tensor(v) and v.dim() > 0:
                    safe_set_full_optimizer_state(p, v.to(p.device, torch.float32), k)
        if step is not None:
            for s in self.optimizer.state.values():
                s["step"] = step.clone() if torch.is_tensor(step) else torch.tensor(float(step))
        saved = state["param_groups"][0]
        for k, v in saved.items():
            if k != "params":
                self.optimizer.param_groups[0][k] = v
