"""Data-parallel training under ``accelerate launch`` / ``torchrun`` (``distributed=ddp``; README "Multi-GPU and
multi-node training").

The launcher starts one process per device and sets the env:// variables (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); accelerate's ``PartialState`` initialises torch.distributed from
them (NCCL on GPUs, gloo on CPUs). This module never builds a process group of its own. With one process
(``distributed=none``, the default) none of it runs: the trainer gets ``dist=None`` and its step is the
single-process one, without a collective or a wrapper.

What a step does on each of the W processes:

* **Prompts.** Every process draws the same global batch of ``trainer.prompts_per_step`` prompts from its copy of
  the sampler (the samplers stay in step: every process draws the same list, which is checked each step, and
  every process's sampler observes the whole step's feedback), and keeps a contiguous shard of it; the union of the
  shards is the single-process batch. A group (one prompt's G completions) is whole on one process; group ids are
  numbered globally.
* **Rollouts** stay on each process: every process generates its own shard's completions with its own copy of the
  policy (no weight transfer; the copies stay equal because every process applies the same summed gradient).
  ``distributed.sampling_seed=process`` samples from a stream seeded by (seed, step, rank);
  ``group`` generates prompt by prompt, each group from a stream seeded by (seed, step, global group index), so
  the completions (and the whole run) do not depend on the process count — a single process with the same setting
  samples the same completions — at the price of one generate call per prompt.
* **Advantages** are computed within groups, so on the process that holds the group.
* **Loss normalisers** (``rlexp.algorithms.aggregation``) are global: the token and row counts of each mini-batch
  are summed over the processes (and the normalising length is the widest), so each process's loss is its share of
  the global batch's loss, and the sum of the processes' gradients is the single-process gradient. After the last
  micro-batch of an optimiser step the gradients are summed over the processes (one all-reduce per bucket, as DDP
  does, but once per optimiser step: the processes may run different numbers of micro-batches), then clipped and
  stepped identically everywhere. Mini-batches of whole groups (``trainer.steps_per_rollout`` > 1) are split over
  the global groups, as a single process splits them.
* **Metrics.** The update's metrics are token sums and extremes reduced over the processes before they are turned
  into means; the batch metrics (reward, accuracy, lengths, advantages, group fractions) are computed on the rows
  of all processes gathered; the rest (timings, per-process statistics) are averaged over the processes
  (maxima and minima: the extreme). Every process ends a step with the same metrics, so callbacks decide alike, and
  a stop on any process stops all of them.
* **Main process only:** the run directory's files (provenance, run identity, tracker ids, summary), the tracker
  runs (MLflow/W&B: one run) and metrics.jsonl, checkpoints, and evaluation; the others wait for it at the next
  collective. A checkpoint holds the (identical) state of the main process, so a run resumes with any process count.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, replace
from datetime import timedelta

import torch

from rlexp.tracking.base import JSONLTracker

log = logging.getLogger(__name__)

STRATEGIES = ("none", "ddp", "fsdp", "deepspeed")
SAMPLING_SEEDS = ("process", "group")
KNOWN_KEYS = ("strategy", "sampling_seed", "timeout_s", "fsdp", "deepspeed")
# update metrics (``policy_update``'s pass sums) folded by their extreme rather than summed
MAX_KEYS = frozenset({"ratio/max", "clip/high_seq_max", "mismatch/ratio_max"})
MIN_KEYS = frozenset({"ratio/min", "clip/low_seq_min", "mismatch/ratio_min"})
WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_BUCKET = 1 << 25  # gradient elements per all-reduce


def launched_world_size() -> int:
    """The number of processes the launcher started (1 without a launcher): torchrun's ``WORLD_SIZE``, or the MPI
    launcher's size under ``accelerate launch --cpu --num_processes N --mpirun_hostfile F`` (MPICH and Intel MPI:
    ``PMI_SIZE``; Open MPI; MVAPICH).

    Without ``--mpirun_hostfile`` accelerate's ``--cpu`` mode starts the script once, with ``MASTER_ADDR`` set
    (only when more than one process was asked for) and no size: refused rather than trained on one process."""
    for name in WORLD_SIZE_VARS:
        if os.environ.get(name):
            return int(os.environ[name])
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and os.environ.get("MASTER_ADDR"):
        from rlexp.config.schema import ConfigError

        raise ConfigError(
            "`accelerate launch --cpu --num_processes N` (N > 1) started one process: accelerate starts CPU processes "
            "through mpirun only with `--mpirun_hostfile <file>` (a line `localhost:N`; mpirun from "
            "`pip install -e '.[mpi]'` on PATH). Add it (README: Multi-GPU and multi-node training), or launch with "
            "torchrun; if MASTER_ADDR comes from your environment and one process is meant, unset it"
        )
    return 1


@dataclass(frozen=True)
class DistributedSettings:
    """``cfg.distributed`` (conf/distributed/)."""

    strategy: str = "none"
    sampling_seed: str = "process"
    timeout_s: float = 1800.0
    fsdp: dict | None = None  # FSDP2 settings (conf/distributed/fsdp.yaml; rlexp.trainer.sharding.FSDPSettings)
    deepspeed: dict | None = None  # DeepSpeed's config, less what rlexp sets (conf/distributed/deepspeed_zero*.yaml)

    @classmethod
    def from_config(cls, node) -> DistributedSettings:
        from omegaconf import OmegaConf

        from rlexp.config.schema import ConfigError

        if node is None:
            return cls()
        data = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        unknown = sorted(set(data) - set(KNOWN_KEYS))
        if unknown:
            raise ConfigError(
                f"distributed.{unknown[0]} is not a setting of distributed (known: {', '.join(KNOWN_KEYS)})"
            )
        s = cls(**data)
        if s.strategy not in STRATEGIES:
            raise ConfigError(f"distributed.strategy={s.strategy!r} is not one of {list(STRATEGIES)}")
        if s.sampling_seed not in SAMPLING_SEEDS:
            raise ConfigError(f"distributed.sampling_seed={s.sampling_seed!r} is not one of {list(SAMPLING_SEEDS)}")
        if not s.timeout_s or s.timeout_s <= 0:
            raise ConfigError(f"distributed.timeout_s={s.timeout_s}: must be > 0 (seconds)")
        if s.fsdp is not None and s.strategy != "fsdp":
            raise ConfigError(f"distributed.fsdp is set, but distributed.strategy={s.strategy} (not fsdp)")
        if s.deepspeed is not None and s.strategy != "deepspeed":
            raise ConfigError(f"distributed.deepspeed is set, but distributed.strategy={s.strategy} (not deepspeed)")
        if s.strategy == "fsdp":
            from rlexp.trainer.sharding import FSDPSettings

            FSDPSettings.from_dict(s.fsdp)  # unknown keys refused here, at config time
        if s.strategy == "deepspeed":
            from rlexp.trainer.zero import check_settings

            check_settings(s.deepspeed)  # rlexp-owned keys and the stage, at config time
        return s


def setup(cfg, device: torch.device) -> tuple[Distributed | None, torch.device]:
    """The run's ``Distributed`` (None for ``distributed=none``) and the device this process trains on (under a
    multi-GPU launch: ``cuda:<local rank>``). Initialises torch.distributed through accelerate's ``PartialState``
    when the launcher started several processes."""
    from rlexp.config.schema import ConfigError

    s = DistributedSettings.from_config(cfg.get("distributed"))
    world = launched_world_size()
    if s.strategy == "none":
        if world > 1:
            raise ConfigError(
                f"distributed=none (one process), but the launcher started {world} processes: "
                "add distributed=ddp to train data-parallel over them"
            )
        return None, device
    launched = [n for n in ("FSDP", "DEEPSPEED") if os.environ.get(f"ACCELERATE_USE_{n}", "").lower() == "true"]
    if launched and launched[0].lower() != s.strategy:
        raise ConfigError(
            f"accelerate launched this process for {launched[0]} (its config file's distributed_type), but "
            f"distributed={s.strategy}: launch with rlexp/conf/accelerate/ddp.yaml (or --multi_gpu) or torchrun, and "
            "pick the strategy with distributed=ddp|fsdp|deepspeed_zero2|deepspeed_zero3 (distributed.fsdp and "
            "distributed.deepspeed hold the settings; accelerate's fsdp_config and deepspeed_config are not read)"
        )
    t = cfg.trainer
    if world > 1 and t.prompts_per_step < world:
        raise ConfigError(
            f"trainer.prompts_per_step={t.prompts_per_step} is less than the {world} processes: every process needs "
            "at least one prompt (a group stays whole on one process)"
        )
    if world == 1:  # a plain run with distributed settings: no process group, nothing reduced
        return Distributed(s, t.seed, 1, 0, 0, device), device
    from accelerate import PartialState

    # under mpirun (accelerate launch --cpu --mpirun_hostfile) PartialState takes the rank, local rank and sizes from
    # the MPI launcher's variables (PMI_RANK, MPI_LOCALRANKID, ...), sets RANK/WORLD_SIZE from them and uses gloo
    state = PartialState(cpu=device.type == "cpu", timeout=timedelta(seconds=s.timeout_s))
    if state.num_processes != world:
        raise RuntimeError(
            f"accelerate's PartialState sees {state.num_processes} process(es) but the launcher started {world}: the "
            "process group did not initialise (on CPUs launch with torchrun, `accelerate launch --multi_gpu` or "
            "`accelerate launch --cpu --mpirun_hostfile <file>`; an MPI launch trains on CPUs only: trainer.device=cpu)"
        )
    if t.num_threads:  # PartialState sets its own CPU thread count when OMP_NUM_THREADS is unset
        torch.set_num_threads(t.num_threads)
    if device.type == "cuda":
        device = state.device
        torch.cuda.set_device(device)
    from rlexp.runs.setup import seed_everything

    # the processes' global RNGs differ (what uses them then differs per process, as in any data-parallel run);
    # sampling has streams of its own (Distributed.generate) and the weights come from the main process
    seed_everything(t.seed + 7_919 * state.process_index)
    dist = Distributed(s, t.seed, state.num_processes, state.process_index, state.local_process_index, device)
    log.info(
        "distributed: process %d of %d (local %d) on %s, backend %s",
        dist.rank,
        dist.world_size,
        dist.local_rank,
        device,
        state.backend,
    )
    return dist, device


class Distributed:
    """This process's place in the run and the collectives the trainer uses; with one process (``active`` false)
    every collective returns the local value."""

    def __init__(self, settings: DistributedSettings, seed: int, world_size: int, rank: int, local_rank: int, device):
        self.s, self.seed = settings, seed
        self.world_size, self.rank, self.local_rank = world_size, rank, local_rank
        self.active = world_size > 1
        self.is_main = rank == 0
        # distributed=fsdp or deepspeed_zero* over several processes: gradients and optimiser state sharded (and the
        # parameters, but under ZeRO-2); every forward or backward of the update is a collective
        # (rlexp.trainer.sharding, rlexp.trainer.zero); with one process the plain step
        self.sharded = self.active and settings.strategy in ("fsdp", "deepspeed")
        self.zero = None  # the DeepSpeed engine's wrapper (rlexp.trainer.zero.ZeRO), made by prepare_optimizer
        if settings.strategy == "fsdp":
            from rlexp.trainer.sharding import FSDPSettings

            self.fsdp = FSDPSettings.from_dict(settings.fsdp)
        self.device = torch.device(device)
        # NCCL moves CUDA tensors; gloo CPU ones
        self.comm_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        self.step = 0

    # ---- collectives ------------------------------------------------------------------------
    def all_gather_object(self, obj) -> list:
        if not self.active:
            return [obj]
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def gather_floats(self, values: list[float]) -> torch.Tensor:
        """(world, k) float64: every process's ``values``, in rank order."""
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device)
        if not self.active:
            return t[None].cpu()
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        torch.distributed.all_gather(out, t)
        return torch.stack(out).cpu()

    def sum_floats(self, values: list[float]) -> list[float]:
        return self.gather_floats(values).sum(0).tolist() if self.active else [float(v) for v in values]

    def sum_tensors(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Scalar tensors summed over the processes (one all-reduce), each back on its own device and dtype."""
        if not self.active or not values:
            return values
        flat = torch.stack([v.detach().to(self.comm_device, torch.float64) for v in values])
        torch.distributed.all_reduce(flat)
        return [f.to(v.device, v.dtype) for f, v in zip(flat.unbind(), values)]

    def batch_statistics(self):
        """The block computes statistics of this process's share of the step's batch (the advantages): batch-wide
        ones sum over every process's rows (``rlexp.core.stats.batch_spread_over``)."""
        from contextlib import nullcontext

        from rlexp.core.stats import batch_spread_over

        return batch_spread_over(self.sum_tensors) if self.active else nullcontext()

    def any_true(self, flag: bool) -> bool:
        """Whether ``flag`` is set on any process (a stop on one process stops all)."""
        if not self.active:
            return bool(flag)
        return bool(self.gather_floats([float(bool(flag))]).max() > 0)

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def broadcast_object(self, obj):
        """The main process's ``obj`` on every process."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_parameters(self, model) -> None:
        """The main process's weights and buffers into every process's model (as DDP does when it wraps one)."""
        if not self.active:
            return
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                data = t.data
                if data.device.type != self.comm_device.type:
                    moved = data.to(self.comm_device)
                    torch.distributed.broadcast(moved, src=0)
                    data.copy_(moved)
                else:
                    torch.distributed.broadcast(data, src=0)

    def all_reduce_grads(self, model) -> None:
        """Sum every trainable parameter's gradient over the processes (each process's loss is its share of the
        global loss, so the sum is the global gradient). A parameter that has a gradient on some process only gets
        a zero one on the others first; one that has none anywhere keeps none (the optimiser skips it, as a
        single process would)."""
        if not self.active:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=self.comm_device)
        torch.distributed.all_reduce(has)
        grads = []
        for p, anywhere in zip(params, has.tolist()):
            if not anywhere:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        bucket, size = [], 0
        for g in grads:
            bucket.append(g)
            size += g.numel()
            if size >= _BUCKET:
                self._reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce_bucket(bucket)

    def _reduce_bucket(self, grads: list[torch.Tensor]) -> None:
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        by_kind: dict = {}
        for g in grads:
            by_kind.setdefault((g.dtype, g.device), []).append(g)
        for (_, device), gs in by_kind.items():
            flat = _flatten_dense_tensors(gs)
            if device.type != self.comm_device.type:
                flat = flat.to(self.comm_device)
            torch.distributed.all_reduce(flat)
            for g, r in zip(gs, _unflatten_dense_tensors(flat.to(device), gs)):
                g.copy_(r)

    def close(self) -> None:
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    # ---- the run ----------------------------------------------------------------------------
    def agree_run_dir(self, run_dir):
        """The main process's run directory. Each process composes its own Hydra config, and a run directory with
        ``${now:...}`` may differ by a second between them: pass ``hydra.run.dir=<dir>`` under a launcher."""
        from pathlib import Path

        main = Path(self.broadcast_object(str(run_dir)))
        if main != Path(run_dir):
            log.warning(
                "process %d composed run directory %s, the main process %s: using the main process's (pass "
                "hydra.run.dir=<dir> under a launcher; Hydra may have created the other one)",
                self.rank,
                run_dir,
                main,
            )
        return main

    def check_supported(self, trainer) -> None:
        """Refuse, naming the setting, what this data-parallel step cannot keep equal across processes."""
        from rlexp.config.schema import ConfigError

        rollout, algo = trainer.rollout, trainer.algo
        if self.s.sampling_seed == "group":
            if getattr(rollout, "_loop", None) is None:
                raise ConfigError(
                    "distributed.sampling_seed=group samples each group from a seeded stream of rlexp's decode loop: "
                    "it needs rollout=hf with rollout.engine=loop"
                )
            if algo.prompt_condition is not None or getattr(rollout, "needs_records", False):
                raise ConfigError(
                    "distributed.sampling_seed=group generates one plain prompt at a time: not with a prompt "
                    "condition or a multi-turn rollout (use distributed.sampling_seed=process)"
                )
            if getattr(rollout, "segment_rows", False):
                raise ConfigError("distributed.sampling_seed=group: not with rollout=supo (use sampling_seed=process)")
        if not self.active:
            return
        refused = []
        if trainer.ahead is not None:
            refused.append("trainer.async_rollout=true")
        if getattr(rollout, "speculative", None) is not None:
            refused.append("rollout.speculative_reuse (the rollout cache is per process)")
        if "vllm" in type(rollout).__name__.lower():
            refused.append("rollout=vllm (its engine runs a world of one process)")
        if algo.selects_over_mini_batch:
            refused.append(f"algorithm {algo.name}: its loss selects tokens over the whole mini-batch")
        stateful = [type(st).__name__ for st in algo.group_stages if hasattr(st, "state_dict")]
        if stateful:
            refused.append(f"group stages that keep state across steps ({', '.join(stateful)}; per process)")
        if refused:
            raise ConfigError(
                f"distributed={self.s.strategy} with {self.world_size} processes is not available with: "
                f"{'; '.join(refused)}"
            )

    def prepare_sharded(self, cfg, algorithm, model) -> None:
        """distributed=fsdp | deepspeed_zero* over several processes: refuse what it cannot carry (naming the
        settings); under fsdp shard ``model`` in place (build the optimiser after this, then ``prepare_optimizer``)."""
        if not self.sharded:
            return
        from rlexp.config.schema import ConfigError
        from rlexp.trainer.sharding import shard_model, unsupported

        refused = unsupported(cfg, algorithm)
        if self.s.strategy == "deepspeed":
            if algorithm.curvature_mask is not None:
                refused.append("algorithm.curvature_mask (CAPO reads AdamW's per-parameter state)")
            if algorithm.top_entropy_quantile < 1.0 and algorithm.top_entropy_normaliser == "selected":
                refused.append("algorithm.top_entropy_normaliser=selected (it rescales the gradients after backward)")
            if algorithm.slow_fast.fast_steps > 0:
                refused.append("algorithm.slow_fast (SFPO moves the weights outside the engine's fp32 partitions)")
        if refused:
            raise ConfigError(
                f"{self.strategy_name} with {self.world_size} processes is not available with: {'; '.join(refused)}"
            )
        if self.s.strategy == "fsdp":
            shard_model(model, self.fsdp)

    def prepare_optimizer(self, model, optimizer, max_grad_norm: float) -> None:
        """distributed=deepspeed_zero* over several processes: DeepSpeed's engine around ``model`` and ``optimizer``
        (the optimiser steps on the partitions; the trainer keeps both objects)."""
        if self.sharded and self.s.strategy == "deepspeed":
            from rlexp.trainer.zero import ZeRO

            self.zero = ZeRO(model, optimizer, self.s.deepspeed, max_grad_norm, self.world_size)

    @property
    def strategy_name(self) -> str:
        if self.s.strategy == "deepspeed":
            from rlexp.trainer.zero import check_settings

            return f"distributed=deepspeed_zero{check_settings(self.s.deepspeed)}"
        return f"distributed={self.s.strategy}"

    @property
    def states(self):
        """The full-state functions of the sharding (``full_model_state``, ``full_optimizer_state``,
        ``load_model_state``, ``load_optimizer_state``): FSDP's (``rlexp.trainer.sharding``) or the ZeRO engine's;
        None when the model is whole on every process."""
        if not self.sharded:
            return None
        if self.zero is not None:
            return self.zero
        from rlexp.trainer import sharding

        return sharding

    def gathered(self, model):
        """The full parameters on every process until the block ends (fsdp: ``sharding.gathered``; ZeRO-3:
        ``GatheredParameters``); else nothing."""
        from contextlib import nullcontext

        if not self.sharded:
            return nullcontext(model)
        if self.zero is not None:
            return self.zero.gathered(model)
        from rlexp.trainer.sharding import gathered

        return gathered(model, self.fsdp.reshard_after_forward)

    def micro_batch_pads(self, counts: list[int]) -> list[int]:
        """Under distributed=fsdp | deepspeed_zero*: for each optimiser step, how many idle micro-batches this process
        adds to its ``counts[i]`` so that every process runs the most any runs (each forward or backward is a
        collective)."""
        if not self.sharded or not counts:
            return [0] * len(counts)
        most = self.gather_floats(counts).max(0).values.tolist()
        return [int(m) - c for m, c in zip(most, counts)]

    # ---- prompts and rollouts ---------------------------------------------------------------
    def shard(self, records: list[dict], prompts: list[str]) -> tuple[list[dict], list[str], int, int]:
        """This process's contiguous share of the step's global prompt list: its records and prompts, the global
        index of its first group and the global number of groups. Every process must have drawn the same list."""
        n = len(records)
        if not self.active:
            return records, prompts, 0, n
        from rlexp.samplers.feedback import record_key

        digest = hashlib.sha1("\x1f".join(record_key(r) for r in records).encode()).hexdigest()
        if len(set(self.all_gather_object(digest))) > 1:
            raise RuntimeError(
                f"step {self.step}: the processes drew different prompts (their samplers diverged); a sampler under "
                "distributed=ddp must draw from its seed and the step's feedback only"
            )
        if n < self.world_size:
            raise RuntimeError(
                f"step {self.step}: {n} prompts for {self.world_size} processes (trainer.prompts_per_step, after "
                "trainer.overlong_prompts=drop): every process needs one"
            )
        start, stop = n * self.rank // self.world_size, n * (self.rank + 1) // self.world_size
        return records[start:stop], prompts[start:stop], start, n

    def sampling_generator(self, device, key: int) -> torch.Generator:
        seed = ((self.seed * 1_000_003 + self.step) * 1_000_033 + key) % (1 << 63)
        return torch.Generator(device=device).manual_seed(seed)

    def generate(self, trainer, prompts: list[str], num_generations: int, first_group: int, reuse: dict):
        """The rollout of this process's prompts: prompt by prompt from per-group streams
        (``sampling_seed=group``), else in one call from this process's stream of the step."""
        from rlexp.rollout.decode import sampling_generator

        rollout, model, tok = trainer.rollout, trainer.model, trainer.tok
        device = next(model.parameters()).device
        if self.s.sampling_seed == "group":
            from rlexp.rollout.hf import _concat

            parts = []
            for i, prompt in enumerate(prompts):
                with sampling_generator(self.sampling_generator(device, first_group + i)):
                    parts.append(rollout.generate(model, tok, [prompt], num_generations=num_generations, **reuse))
            return parts[0] if len(parts) == 1 else _concat(parts, tok.pad_token_id)
        if not self.active:  # one process: the single-process rollout as it is
            return rollout.generate(model, tok, prompts, num_generations=num_generations, **reuse)
        with sampling_generator(self.sampling_generator(device, -1 - self.rank)):
            return rollout.generate(model, tok, prompts, num_generations=num_generations, **reuse)

    # ---- feedback and metrics ---------------------------------------------------------------
    def gather_feedback(self, feedback):
        """The step's ``GroupFeedback`` of every process, in global group order (every sampler sees all of it)."""
        if not self.active:
            return feedback
        from rlexp.samplers.feedback import GroupFeedback

        parts = self.all_gather_object(feedback)
        return GroupFeedback(
            [r for p in parts for r in p.records],
            [x for p in parts for x in p.pass_rate],
            [x for p in parts for x in p.all_correct],
        )

    def gather_lists(self, *lists: list) -> tuple[list, ...]:
        """Each list concatenated over the processes in rank order."""
        if not self.active:
            return lists
        parts = self.all_gather_object(lists)
        return tuple([x for p in parts for x in p[i]] for i in range(len(lists)))

    def global_normalisers(self, norms: list) -> list[tuple]:
        """Each mini-batch's ``Normaliser`` with global counts (tokens and rows summed over the processes, the
        normalising length their widest) and its global token count (for the token means of the metrics)."""
        if not self.active or not norms:
            return [(n, max(n.total_tokens, 1.0)) for n in norms]
        table = self.gather_floats([v for n in norms for v in (n.total_tokens, n.total_rows, n.norm_length)])
        table = table.view(self.world_size, len(norms), 3)
        tokens, rows, width = table[..., 0].sum(0), table[..., 1].sum(0), table[..., 2].max(0).values
        return [
            (
                replace(n, total_tokens=float(tokens[i]), total_rows=float(rows[i]), norm_length=float(width[i])),
                max(float(tokens[i]), 1.0),
            )
            for i, n in enumerate(norms)
        ]

    def mini_batches(self, group_ids: torch.Tensor, k: int, seed: int) -> list[torch.Tensor]:
        """``group_mini_batches`` over the global groups: this process's rows of each of the ``k`` mini-batches a
        single process would split the whole batch into (a mini-batch may hold none of this process's rows)."""
        ids = group_ids.cpu()
        local = torch.unique(ids)
        everyone = torch.unique(torch.tensor([g for part in self.all_gather_object(local.tolist()) for g in part]))
        k = max(1, min(k, len(everyone)))
        order = torch.randperm(len(everyone), generator=torch.Generator().manual_seed(seed))
        return [torch.isin(ids, everyone[chunk]).nonzero().squeeze(-1) for chunk in torch.tensor_split(order, k)]

    def reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """An optimiser step's metric sums of every process: summed, extremes folded (``MAX_KEYS``, ``MIN_KEYS``)."""
        if not self.active:
            return sums
        out: dict[str, float] = {}
        for part in self.all_gather_object(sums):
            for k, v in part.items():
                if k not in out:
                    out[k] = v
                elif k in MAX_KEYS:
                    out[k] = max(out[k], v)
                elif k in MIN_KEYS:
                    out[k] = min(out[k], v)
                else:
                    out[k] += v
        return out

    def step_metrics(self, batch, metrics: dict, exact: set, accuracy_term, judged_terms) -> dict[str, float]:
        """The step's metrics over all processes (identical on every process): the batch metrics of the gathered
        rows, the update's (``exact``: already global) as they are, the others averaged (extremes: max / min)."""
        if not self.active:
            return metrics
        from rlexp.core.batch import RolloutBatch
        from rlexp.trainer.metrics import batch_metrics

        gathered = self.all_gather_object((metrics_view(batch), metrics))
        out = fold_means([m for _, m in gathered])
        out.update({k: metrics[k] for k in exact if k in metrics})
        merged = RolloutBatch.concat([v for v, _ in gathered])
        out.update(batch_metrics(merged, accuracy_term, judged_terms))
        tokens = float(merged.completion_mask.sum())
        if "time/step_s" in out:
            out["throughput/completion_tokens_per_s"] = tokens / max(out["time/step_s"], 1e-9)
        if "time/generate_s" in out:
            out["throughput/generate_tokens_per_s"] = tokens / max(out["time/generate_s"], 1e-9)
        return out


def fold_means(parts: list[dict]) -> dict[str, float]:
    """Per key over the processes that have it: the mean, or for a maximum / minimum (a key ending in max / min)
    the extreme."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    out = {}
    for k in keys:
        vals = [float(p[k]) for p in parts if k in p]
        if k.endswith("max"):
            out[k] = max(vals)
        elif k.endswith("min"):
            out[k] = min(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out


def metrics_view(batch):
    """The rows' fields ``batch_metrics`` reads, on the CPU (token ids and texts left out): what a process sends
    for the step's metrics."""
    from rlexp.core.batch import RolloutBatch
    from rlexp.core.masks import UNSCORED

    def cpu(t):
        return None if t is None else t.detach().cpu()

    n = len(batch)
    empty = torch.zeros(n, 0, dtype=torch.long)
    extras = {UNSCORED: cpu(batch.extras[UNSCORED])} if UNSCORED in batch.extras else {}
    return RolloutBatch(
        prompt_ids=empty,
        prompt_mask=empty,
        completion_ids=empty,
        completion_mask=cpu(batch.completion_mask),
        sampling_logprobs=empty.float(),
        truncated=cpu(batch.truncated),
        group_ids=cpu(batch.group_ids),
        prompts=[""] * n,
        completions=[""] * n,
        records=[{}] * n,
        rewards=cpu(batch.rewards),
        reward_names=list(batch.reward_names),
        reward_weights=cpu(batch.reward_weights),
        reward=cpu(batch.reward),
        reward_failures=cpu(batch.reward_failures),
        advantages=cpu(batch.advantages),
        extras=extras,
        stats={},
    )


class FollowerJSONL(JSONLTracker):
    """metrics.jsonl as a process other than the main one sees it: read (the resume checks), never written."""

    def start(self, run_name, config, params, tags, resume_id=None):
        return str(self.path)

    def repair(self) -> None:
        pass

    def log_metrics(self, metrics, step):
        pass
