"""The training loop: one step = sample prompts → roll out G completions each → score → group
stages → (reference log-probs) → advantages → μ optimiser steps → metrics → trackers."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import record_function

from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.regularisers.kl import kl_estimate
from rlexp.algorithms.regularisers.reference import ReferenceModel
from rlexp.algorithms.regularisers.rollout_correction import RolloutCorrection
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import (
    CONDITION,
    HIDDEN_RANK,
    IS_WEIGHTS,
    KL_PENALTY,
    OLD_MEAN_LOGPROBS,
    POLICY_TOKENS,
    PRECEDENT,
    PROXY_LOGPROBS,
    SUPPORT_IDX,
    SUPPORT_OLD,
    SUPPORT_TOKEN,
    TOKEN_ENTROPY,
    replayed_rows,
)
from rlexp.data.prompts import PromptFormat
from rlexp.data.sources import DatasetSplits
from rlexp.models.attention import use_cpu_matmul_grad_attention
from rlexp.rewards.scoring import score
from rlexp.samplers.shuffle import PromptSampler
from rlexp.tracking.base import JSONLTracker, Tracker
from rlexp.trainer import checkpoint as ckpt
from rlexp.trainer.metrics import batch_metrics, with_accuracy_gain
from rlexp.trainer.optimize import batch_logprobs, policy_update

log = logging.getLogger(__name__)


@dataclass
class StageContext:
    """What a group stage may use: the policy, the reference, the tokenizer, the step, and
    ``sample(n_prompts)`` which rolls out and scores ``n_prompts`` fresh prompts (DAPO refill)."""

    policy: Any
    reference: Any
    tokenizer: Any
    step: int
    sample: Callable[[int], RolloutBatch]
    settings: Any = None
    answer_format: str = "hash"
    rollout: Any = None  # the rollout engine (ReMax's greedy baseline generates with it)
    reward_terms: dict | None = None  # the reward terms (to score extra rollouts)
    autocast_dtype: Any = None  # the matmul dtype the trainer generates under
    prompt_format: Any = None  # the run's PromptFormat (GHPO's hinted retries render questions with it)


@dataclass
class TrainResult:
    last_step: int
    metrics: dict = field(default_factory=dict)
    eval_metrics: dict = field(default_factory=dict)
    stopped_early: bool = False


def cpu_has_bf16_matmul() -> bool:
    """AMX / AVX512-BF16 units make bf16 matmuls ~3x faster than fp32 on the CPU (measured: SmolLM2
    forward+backward of 32x100 tokens, 14.2 s fp32 vs 4.9 s bf16 autocast on a 2-core Xeon with AMX)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def resolve_autocast(mode: str, param: torch.Tensor) -> torch.dtype | None:
    """Matmul dtype for the training forward (weights and optimiser state stay in their dtype)."""
    if mode == "off" or param.dtype != torch.float32:
        return None
    if mode == "bf16":
        return torch.bfloat16
    if mode == "fp16":
        return torch.float16
    if mode != "auto":
        raise ValueError(f"trainer.autocast={mode!r} is not one of ['auto', 'bf16', 'fp16', 'off']")
    if param.device.type == "cuda" or cpu_has_bf16_matmul():
        return torch.bfloat16
    return None


class Trainer:
    def __init__(
        self,
        *,
        settings,
        model,
        tokenizer,
        algorithm: Algorithm,
        reward_terms: dict,
        rollout,
        data: DatasetSplits,
        prompt_format: PromptFormat,
        optimizer,
        scheduler,
        tracker: Tracker,
        jsonl: JSONLTracker,
        run_dir: Path,
        run_name: str,
        config: dict,
        params: dict,
        tags: dict,
        accuracy_term: str | None = "accuracy",
        evaluator: Callable | None = None,
        callbacks: list | None = None,
        consistency=None,
        sampler=None,
        continue_tracker_runs: bool = True,
        dist=None,
    ):
        from rlexp.trainer.stopping import GracefulStop

        self.s = settings
        self.model, self.tok, self.algo = model, tokenizer, algorithm
        self.reward_terms, self.rollout, self.data, self.prompt_format = reward_terms, rollout, data, prompt_format
        self.optimizer, self.scheduler = optimizer, scheduler
        self.tracker, self.jsonl = tracker, jsonl
        self.run_dir, self.run_name = Path(run_dir), run_name
        self.config, self.params, self.tags = config, params, tags
        self.accuracy_term, self.evaluator = accuracy_term, evaluator
        self.callbacks = list(callbacks or [])
        # distributed=ddp (rlexp.trainer.distributed): this process's place among the launched ones; None: one process
        self.dist = dist
        self.is_main = dist is None or dist.is_main  # only the main process logs, checkpoints and evaluates
        # distributed=fsdp | deepspeed_zero* over several processes: the policy's parameters, gradients or optimiser
        # state are sharded (rlexp.trainer.sharding, rlexp.trainer.zero)
        self.sharded = dist is not None and dist.sharded
        # the prompt sampler (conf/sampler), built by the app; the default is the seeded shuffle
        self.sampler = (
            sampler if sampler is not None else PromptSampler(data.train, settings.prompts_per_step, settings.seed)
        )
        self.reference = None
        if algorithm.needs_reference:
            r = algorithm.reference
            source = None
            if r.model is not None:  # a fixed reference of its own (a demonstration policy)
                from omegaconf import OmegaConf

                from rlexp.models.loading import load_model

                cfg = r.model if OmegaConf.is_config(r.model) else OmegaConf.create(dict(r.model))
                device = next(model.parameters()).device
                source = load_model(cfg, device).model
            self.reference = ReferenceModel(model, r.kind, r.ema_decay, r.ema_interval, source=source)
        self.action_mask = None  # NLPO: the masking policy (a synced copy) whose top-p tokens are the allowed ones
        if algorithm.action_mask is not None:
            from rlexp.algorithms.regularisers.action_mask import TopPActionMask

            if not hasattr(rollout, "action_mask") or getattr(rollout, "speculative", None) is not None:
                raise ValueError(
                    "algorithm.action_mask (NLPO) masks sampling in the hf rollout (rollout=hf, engine loop or "
                    "generate), without rollout.speculative_reuse"
                )
            a = algorithm.action_mask
            self.action_mask = TopPActionMask(model, a.top_p, a.sync_every)
            rollout.action_mask = self.action_mask
        if algorithm.sampling_temperature is not None:  # EAD, HAPO: the rollout samples at per-token temperatures
            if not hasattr(rollout, "token_temperature"):
                raise ValueError(
                    f"algorithm.sampling_temperature needs a rollout with per-token temperatures (rollout=hf); "
                    f"{type(rollout).__name__} has none"
                )
            from rlexp.rollout.temperature import build_token_temperature

            # refused by the rollout when it cannot (vllm, a captured decode graph, speculative reuse)
            rollout.token_temperature = build_token_temperature(
                algorithm.sampling_temperature, "algorithm.sampling_temperature"
            )
        self.consistency = consistency  # evaluation.consistency.ConsistencyMeter: per-step consistency rates
        if consistency is not None:
            consistency.bind(model, self.reference)
        for term in reward_terms.values():  # before training (and before a resume loads the checkpoint):
            if hasattr(term, "bind_policy"):  # terms that judge with the policy or its initial copy (rewards.judges)
                term.bind_policy(model, tokenizer)
            if hasattr(term, "bind_tokenizer"):  # terms that pay rewards at the sampled tokens (rewards.process)
                term.bind_tokenizer(tokenizer)
        if hasattr(rollout, "bind_reward_terms"):  # a rollout that picks among candidates by the reward (AT-GRPO)
            rollout.bind_reward_terms(reward_terms)
        self.ckpt_dir = self.run_dir / "checkpoints"
        # whether a start continues the tracker runs saved in the run directory (rlexp.runs.identity: not for a
        # fresh run or a copied directory)
        self.continue_tracker_runs = continue_tracker_runs
        self._restored = None  # (step, tracker ids, resumed) once restore() ran
        self.stopper = GracefulStop(None)  # replaced by the active one while train() runs
        self.finished: str | None = None  # the final status once finish() ran
        self.autocast_dtype = resolve_autocast(settings.autocast, next(model.parameters()))
        device_type = next(model.parameters()).device.type
        self.share_prompts = (
            settings.share_prompt_forward
            if settings.share_prompt_forward is not None
            else device_type != "cuda" and not settings.compile
        )
        if self.sharded and self.share_prompts:
            # fsdp / deepspeed: every forward or backward of the update is a collective, so each micro-batch is one
            # forward on every process (a shared-prompt micro-batch is two, and whether one shares depends on its rows)
            if settings.share_prompt_forward:
                log.info(
                    "%s: trainer.share_prompt_forward=true is not used (one forward per micro-batch)",
                    dist.strategy_name,
                )
            self.share_prompts = False
        if settings.cpu_matmul_attention and device_type == "cpu":
            use_cpu_matmul_grad_attention(model)  # generation keeps SDPA (rlexp/models/attention.py)
        # the training forwards (policy update, recomputed old log-probs) go through this; generation,
        # evaluation and checkpoints use the model itself (the compiled wrapper shares its parameters)
        # dynamic=True: micro-batch shapes change every step, so compile for symbolic shapes at once
        # rather than for the first shape and again at the first change (SmolLM2 on this CPU: 183 + 13 s
        # of compiles against 83 + 125 s; the same 4.7-5.5 s train phase afterwards)
        self.train_model = (
            torch.compile(model, backend=settings.compile_backend, mode=settings.compile_mode, dynamic=True)
            if settings.compile
            else model
        )
        if dist is not None and dist.zero is not None:
            # deepspeed_zero*: through the engine's forward (it prepares the backward its ZeRO optimiser accumulates)
            self.train_model = dist.zero.engine
        self._next_group = 0
        # the update schedule: μ epochs × k optimiser steps per rollout (trainer.steps_per_rollout overrides the
        # method's); the old log-probs come from a fresh forward whenever the policy moves within a rollout
        self.steps_per_rollout = settings.steps_per_rollout or algorithm.steps_per_rollout
        # completions sampled per prompt: the method's where it fixes them (ReMax: one sample beside its greedy
        # baseline, algorithm.num_generations), else trainer.num_generations
        self.num_generations = algorithm.num_generations or settings.num_generations
        if algorithm.num_generations and algorithm.num_generations != settings.num_generations:
            log.info(
                "algorithm %s samples %d completion(s) per prompt (algorithm.num_generations; null for "
                "trainer.num_generations=%d)",
                algorithm.name,
                algorithm.num_generations,
                settings.num_generations,
            )
        # μ: trainer.num_iterations overrides the method's epochs (algorithm.num_iterations: MDPO's several steps)
        self.num_iterations = settings.num_iterations or algorithm.num_iterations
        from rlexp.trainer.slow_fast import SlowFastSchedule

        self.slow_fast = SlowFastSchedule(algorithm.slow_fast)  # SFPO: fast steps, reposition, slow correction
        self.extragradient = None
        if algorithm.extragradient:  # EGPO: look-ahead steps from a backup, restored before the next update
            from rlexp.trainer.extragradient import Extragradient

            self.extragradient = Extragradient()
        # the batch is off-policy when the policy moves within a rollout, or when it was generated a step
        # ahead (trainer.async_rollout: by the weights before the previous update)
        off_policy = (
            self.num_iterations * self.steps_per_rollout * (1 + algorithm.slow_fast.fast_steps) > 1
            or settings.async_rollout
        )
        recompute = settings.recompute_old_logprobs
        self.recompute_old_logprobs = off_policy if recompute is None else (recompute and off_policy)
        if getattr(rollout, "token_temperature", None) is not None and off_policy:
            # the sampler's log-probs are at its per-token temperatures, not the policy's: the ratio needs the policy's
            self.recompute_old_logprobs = True
        self.correction = None  # train-inference mismatch correction: needs the trainer's own old log-probs
        if settings.rollout_correction:
            self.correction = RolloutCorrection(settings.rollout_correction, settings.rollout_correction_threshold)
            self.recompute_old_logprobs = True
        elif algorithm.rollout_correction is not None:  # the method's own correction (EAD's truncated IS)
            self.correction = algorithm.rollout_correction
            self.recompute_old_logprobs = True
        if algorithm.loss_needs_old_forward:  # RL-PLUS: π_old of the demonstration rows, which no sampler gave
            self.recompute_old_logprobs = True
        self.ahead = None  # one-step-off-policy rollouts (trainer.async_rollout): the rollout in flight
        if algorithm.prompt_condition is not None:  # HBPO's budgets, e1's efforts: K prompt variants, G/K each
            algorithm.prompt_condition.values(self.num_generations)  # refused here when K does not divide G
            if settings.async_rollout:
                raise ValueError("algorithm.prompt_condition is not available with trainer.async_rollout")
        if settings.async_rollout:
            from rlexp.trainer.async_rollout import AsyncRollout

            self.ahead = AsyncRollout(
                rollout,
                tokenizer,
                self.num_generations,
                settings.seed,
                settings.async_rollout_threads,
                self.autocast_dtype,
            )
        if dist is not None:  # what the data-parallel step cannot keep equal across processes is refused here
            dist.check_supported(self)

    # ---- one step, stage by stage -------------------------------------------------------------
    def prompts_for(self, records: list[dict]) -> tuple[list[dict], list[str]]:
        """The records kept (trainer.max_prompt_length / overlong_prompts) and their rendered prompts."""
        from rlexp.data.lengths import prompt_limit

        # trainer.max_prompt_length / overlong_prompts: both splits measured at the first call, before generating
        limit = prompt_limit(self)
        if limit is not None:
            records = limit.select(self.sampler, self.tok, self.prompt_format, records)
        return records, [self.prompt_format.render(self.tok, r["question"]) for r in records]

    def rollout_and_score(self, records: list[dict]) -> RolloutBatch:
        G = self.num_generations
        records, prompts = self.prompts_for(records)
        shard = None
        if self.dist is not None:  # this process's share of the global prompts; group ids numbered globally
            records, prompts, first, n_global = self.dist.shard(records, prompts)
            shard = (self._next_group + first, self._next_group + n_global)
            self._next_group = shard[0]
        with (
            torch.autocast(
                self.model.device.type,
                dtype=self.autocast_dtype or torch.bfloat16,
                enabled=self.autocast_dtype is not None,
            ),
            record_function("rlexp.generate"),
        ):
            # SPEC-RL's speculative reuse (rollout.speculative_reuse) drafts from the prompts' earlier rollouts
            reuse = {"reuse": True} if getattr(self.rollout, "speculative", None) is not None else {}
            if getattr(self.rollout, "needs_records", False):  # multi-turn: an environment per record
                reuse["records"] = records
            if getattr(self.rollout, "segment_rows", False):  # SUPO: one row per summarised segment of an episode
                reuse["segment_rows"] = True
            cond = self.algo.prompt_condition
            if cond is None and shard is not None:  # distributed: from the process's or the groups' own streams
                out = self.dist.generate(self, prompts, G, shard[0], reuse)
            elif cond is None:
                out = self.rollout.generate(self.model, self.tok, prompts, num_generations=G, **reuse)
            else:  # each group's K prompt variants (HBPO's budgets, e1's efforts), G/K completions each
                variants, values = self._condition_variants(records, prompts)
                out = self.rollout.generate(self.model, self.tok, variants, num_generations=G // len(values), **reuse)
        batch = self.scored_batch(records, prompts, out)
        if shard is not None:
            self._next_group = shard[1]  # after every process's groups
        return batch

    def _condition_variants(self, records: list[dict], prompts: list[str]) -> tuple[list[str], list[float]]:
        """The K prompt variants of each record (record-major) under the prompt condition, and the K values."""
        cond = self.algo.prompt_condition
        values = cond.values(self.num_generations)
        if hasattr(cond, "prepare"):  # a paraphrase set's model source rewrites the batch's questions at once
            cond.prepare(records, values)
        if cond.position == "user":  # inside the user's turn: the question is rendered again with the condition
            return [
                self.prompt_format.render(self.tok, cond.question(r["question"], v, r)) for r in records for v in values
            ], values
        return [cond.render(p, v) for p in prompts for v in values], values

    def _row_conditions(self, records: list[dict], prompts: list[str]) -> tuple[list[str], torch.Tensor | None]:
        """Each row's prompt text and, under a prompt condition, its (N,) condition value."""
        G = self.num_generations
        if self.algo.prompt_condition is None:
            return [p for p in prompts for _ in range(G)], None
        variants, values = self._condition_variants(records, prompts)
        each = G // len(values)
        k = len(values)
        rows = [(variants[i], values[i % k]) for i in range(len(variants)) for _ in range(each)]
        return [r[0] for r in rows], torch.tensor([r[1] for r in rows], dtype=torch.float32)

    def scored_batch(self, records: list[dict], prompts: list[str], out) -> RolloutBatch:
        """The batch of a rollout's output (group ids numbered on from the step's last), scored."""
        G = self.num_generations
        n = len(records)
        row_prompts, conditions = self._row_conditions(records, prompts)
        groups = torch.arange(
            self._next_group, self._next_group + n, device=out.completion_ids.device
        ).repeat_interleave(G)
        self._next_group += n
        row_records = [r for r in records for _ in range(G)]
        rows = getattr(out, "row_episodes", None)
        if rows is not None:  # SUPO (rollout=supo): several rows per episode, each its episode's group/prompt/record
            groups = groups[torch.as_tensor(rows, dtype=torch.long, device=groups.device)]
            row_prompts = [row_prompts[j] for j in rows]
            row_records = [row_records[j] for j in rows]
            conditions = None if conditions is None else conditions[torch.as_tensor(rows, dtype=torch.long)]
        episodes = getattr(out, "episodes", None)
        if episodes is not None:  # multi-turn: each row's episode (turns, per-turn rewards) for the reward terms
            row_records = [{**r, "episode": e} for r, e in zip(row_records, episodes)]
        batch = RolloutBatch.from_generation(out, groups, row_prompts, row_records)
        if getattr(out, "policy_tokens", None) is not None:  # multi-turn: environment tokens out of the loss
            batch.extras[POLICY_TOKENS] = out.policy_tokens.to(groups.device)
        if conditions is not None:
            batch.extras[CONDITION] = conditions.to(groups.device)
        batch.stats.update(getattr(out, "stats", None) or {})
        t = time.perf_counter()
        with record_function("rlexp.score"):
            score(batch, self.reward_terms)
        batch.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + time.perf_counter() - t
        return batch

    def sample(self, n_prompts: int) -> RolloutBatch:
        if self.dist is not None and self.dist.active:
            raise RuntimeError(
                "a group stage drew more prompts (ctx.sample: DAPO's refill, …): not available under distributed=ddp "
                "with several processes (each would need a different number)"
            )
        saved = self.sampler.batch_size
        # at most the training split: a refill never holds a prompt twice
        self.sampler.batch_size = min(n_prompts, len(getattr(self.sampler, "records", None) or self.data.train))
        try:
            return self.rollout_and_score(self.sampler.next_batch())
        finally:
            self.sampler.batch_size = saved

    def train_step(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        timings = {}
        t0 = time.perf_counter()
        self.algo.on_step(step, self.s.max_steps)  # parts scheduled over training (MDPO's step size)
        if self.dist is not None:
            self.dist.step = step  # the sampling streams are seeded per step
        schedule = getattr(self.rollout, "token_temperature", None)  # per-token temperatures (EAD's decay grows)
        if schedule is not None:
            schedule.on_step(step, self.s.max_steps)
        self._next_group = 0
        # distributed=fsdp | deepspeed_zero3: the full policy on every process from the rollout to the old log-probs,
        # so each generates on its own (no collective per decode step); resharded for the update
        phase = ExitStack()
        if self.sharded:
            phase.enter_context(self.dist.gathered(self.model))
        if self.ahead is None:
            batch = self.rollout_and_score(self.sampler.next_batch())
            timings["time/generate_s"] = time.perf_counter() - t0 - batch.stats.pop("time/reward_s", 0.0)
            timings["time/reward_s"] = time.perf_counter() - t0 - timings["time/generate_s"]
        else:
            batch = self.take_rollout(step, timings)
        self.observe_sampler(batch)  # pass rates: difficulty history, the solved filter
        t1 = time.perf_counter()
        ctx = StageContext(
            self.model,
            self.reference,
            self.tok,
            step,
            self.sample,
            self.s,
            self.prompt_format.answer_format,
            self.rollout,
            self.reward_terms,
            self.autocast_dtype,
            prompt_format=self.prompt_format,
        )
        reincarnated = self.algo.reincarnated(step)  # ReMix: on-policy from here, replay off
        for stage in self.algo.group_stages:
            if reincarnated and getattr(stage, "off_policy", False):
                continue
            batch = stage(batch, ctx)
        timings["time/group_stage_s"] = time.perf_counter() - t1
        if self.ahead is not None and step < self.s.max_steps:
            # step t+1's rollout starts now, from the weights this step's update starts from; its prompts are
            # drawn here, after this step's refills: the order a synchronous run draws them in
            records, prompts = self.prompts_for(self.sampler.next_batch())
            self.ahead.launch(self.model, step + 1, records, prompts, version=step - 1)
        # stages that refill roll out more: count that as generation time
        refill = batch.stats.pop("time/reward_s", 0.0)
        timings["time/reward_s"] += refill
        if len(batch) == 0:
            raise RuntimeError(f"step {step}: the group stages left no completions to train on")
        replayed = replayed_rows(batch)  # rows a replay stage (RePO, ReMix) added from earlier steps
        own_rows = None if replayed is None else (~replayed).nonzero().squeeze(-1)  # the step's own rollouts
        if self.consistency is not None:  # measured on the completions of the policy that wrote them
            tc = time.perf_counter()
            own = batch if own_rows is None else batch.select(own_rows)
            batch.stats.update(
                self.consistency.batch_metrics(self.model, self.tok, own, self.prompt_format.answer_format)
            )
            timings["time/consistency_s"] = time.perf_counter() - tc
        t2 = time.perf_counter()
        kl_metrics = {}
        if self.algo.kl.coef > 0 or self.algo.loss_needs_reference:
            batch.ref_logprobs = batch_logprobs(
                self.reference.model,
                batch,
                self.s.micro_batch_size,
                self.rollout.temperature,
                self.autocast_dtype,
                self.share_prompts,
                self.s.micro_batch_tokens,
            )
            if self.algo.kl.coef > 0 and self.algo.kl.mode == "reward":
                pol = batch.old_logprobs if batch.old_logprobs is not None else batch.sampling_logprobs
                charged = batch.completion_mask
                policy = batch.extras.get(POLICY_TOKENS)
                if policy is not None:  # multi-turn: an environment's tokens (sampling log-prob 0) are no action
                    charged = charged * policy[:, : charged.shape[1]].to(device=charged.device, dtype=charged.dtype)
                kl_tokens = kl_estimate(pol, batch.ref_logprobs, self.algo.kl.estimator, self.algo.kl.clamp) * charged
                kl = kl_tokens.sum(-1)
                batch.reward = batch.reward - self.algo.kl.coef * kl
                # per token too: an estimator that pays rewards per token (REINFORCE++) charges each token the KL
                # from itself to the end, not the whole completion's
                batch.extras[KL_PENALTY] = self.algo.kl.coef * kl_tokens
                kl_metrics["kl/reward_penalty_mean"] = float(kl.mean())
        # after a policy reincarnation (ReMix) the update is on-policy: the old log-probs are the current ones
        on_policy_now = reincarnated and self.ahead is None and self.correction is None
        support_k = self.algo.loss_support_k  # TROLL: the old policy's top-K beside its log-probs
        # per-token quantities of the weights this update starts from, in the old log-probs' forward: the token
        # entropies (GTPO, GRPO-S) and the min-p proxy's log-probs (Lp-Reg)
        token_out = {}
        if self.algo.advantage_needs_entropy or getattr(schedule, "needs_entropy", False):
            token_out["entropy"] = batch.extras[TOKEN_ENTROPY] = torch.zeros_like(batch.sampling_logprobs)
        if self.algo.loss_minp:
            token_out["proxy_logp"] = batch.extras[PROXY_LOGPROBS] = torch.zeros_like(batch.sampling_logprobs)
        if self.algo.loss_vocab_mean:  # ROVER: the old policy's vocabulary mean of log π at each position
            token_out["mean_logp"] = batch.extras[OLD_MEAN_LOGPROBS] = torch.zeros_like(batch.sampling_logprobs)
        hidden_rank = self.algo.advantage_hidden_rank  # VERL: the completions' hidden-state effective ranks
        if hidden_rank is not None:
            rows = torch.zeros(len(batch), 3, device=batch.sampling_logprobs.device)
            token_out["hidden_rank"] = batch.extras[HIDDEN_RANK] = rows
        curvature_k = self.algo.curvature_topk  # CAPO: the final hidden states and top-K tokens, for its token mask
        if curvature_k:
            token_out["curvature"] = {}
        recompute = (self.recompute_old_logprobs and not on_policy_now) or support_k
        if token_out or recompute:  # one no-grad forward of the weights the update starts from
            old = batch_logprobs(
                self.train_model,
                batch,
                self.s.micro_batch_size,
                self.rollout.temperature,
                self.autocast_dtype,
                self.share_prompts,
                self.s.micro_batch_tokens,
                topk=support_k if recompute else 0,
                action_mask=self.action_mask,
                token_out=token_out,
                minp=self.algo.loss_minp,
                hidden_rank=hidden_rank,
                curvature_topk=curvature_k,
            )
        if curvature_k:  # consumed by the mask in policy_update
            batch.extras.update(token_out.pop("curvature"))
        if getattr(schedule, "needs_entropy", False):  # HAPO's sampler: this step's entropy statistics, for the next
            schedule.observe(batch.extras[TOKEN_ENTROPY], batch.completion_mask)
        if recompute:
            if support_k:
                from rlexp.algorithms.losses.trust_region import sparse_support

                old, top_idx, top_lp = old
                idx, old_lp, token_col = sparse_support(
                    top_idx, top_lp, batch.completion_ids, old, getattr(self.algo.loss, "delta", 1e-5)
                )
                batch.extras.update({SUPPORT_IDX: idx, SUPPORT_OLD: old_lp, SUPPORT_TOKEN: token_col})
            batch.old_logprobs = old
        if PRECEDENT in self.algo.loss_batch_extras:  # the weights this update starts from (ReMix's KL-Convex)
            batch.extras[PRECEDENT] = batch.old_logprobs if batch.old_logprobs is not None else batch.sampling_logprobs
        if replayed is not None and batch.old_logprobs is not None:
            # replayed rows (RePO): the ratio's denominator is the policy that sampled them, not this step's weights
            rows = replayed.to(batch.old_logprobs.device)[:, None]
            batch.old_logprobs = torch.where(rows, batch.sampling_logprobs, batch.old_logprobs)
        if self.correction is not None:
            weights, correction_stats = self.correction(
                batch.old_logprobs, batch.sampling_logprobs, batch.completion_mask
            )
            batch.extras[IS_WEIGHTS] = weights
            kl_metrics.update(correction_stats)
        phase.close()  # fsdp / ZeRO-3: sharded again for the update
        with record_function("rlexp.train"):  # phase markers for `rlexp bench bench.profile=true`
            with self.dist.batch_statistics() if self.dist is not None else nullcontext():
                batch.advantages = self.algo.compute_advantages(batch)  # batch statistics over every process's rows
            self.observe_advantages(batch, own_rows)  # DUMP's learnability per distribution
            if self.extragradient is not None:
                kl_metrics.update(self.extragradient.before_update(step, self.train_model, self.optimizer))
            train = policy_update(
                self.train_model,
                self.optimizer,
                self.scheduler,
                batch,
                self.algo,
                mu=1 if reincarnated else self.num_iterations,
                micro_batch=self.s.micro_batch_size,
                temperature=self.rollout.temperature,
                max_grad_norm=self.s.max_grad_norm,
                autocast_dtype=self.autocast_dtype,
                share_prompts=self.share_prompts,
                micro_batch_tokens=self.s.micro_batch_tokens,
                steps_per_rollout=1 if reincarnated else self.steps_per_rollout,
                seed=self.s.seed * 1_000_003 + step,  # the mini-batch split: seeded per step, so a resume repeats it
                slow_fast=self.algo.slow_fast if self.slow_fast.active else None,
                stale=timings.get("async/version_lag", 0.0) > 0,
                action_mask=self.action_mask,
                dist=self.dist if self.dist is not None and self.dist.active else None,
            )
        train.update(self.algo.after_update(step, train))  # the entropy bonus's coefficient controller
        if self.algo.slow_fast.fast_steps > 0:
            train.setdefault("sfpo/active", 0.0)
            self.slow_fast.observe(train.get("entropy/mean", float("nan")), step)
        if self.reference is not None and self.reference.after_optimizer_step(self.model, step):
            train["reference/ema_updates"] = 1.0
        if self.action_mask is not None:
            train["action_mask/synced"] = float(self.action_mask.after_optimizer_step(self.model, step))
        if self.algo.reincarnate_at is not None:
            if step == self.algo.reincarnate_at and self.reference is not None:
                self.reference.reset_to(self.model)  # the base model is replaced by the policy trained so far
            train["reincarnation/done"] = float(step >= self.algo.reincarnate_at)
        timings["time/train_s"] = time.perf_counter() - t2
        timings["time/step_s"] = time.perf_counter() - t0
        # the step's own rollouts: replayed rows were scored and counted on the step that sampled them
        fresh = batch if own_rows is None else batch.select(own_rows)
        tokens = float(fresh.completion_mask.sum())
        timings["throughput/completion_tokens_per_s"] = tokens / max(timings["time/step_s"], 1e-9)
        timings["throughput/generate_tokens_per_s"] = tokens / max(timings["time/generate_s"], 1e-9)
        judged = [n for n, t in self.reward_terms.items() if getattr(t, "judges_correctness", False)]
        metrics = {**batch_metrics(fresh, self.accuracy_term, judged), **train, **kl_metrics, **timings}
        if hasattr(self.sampler, "metrics"):  # its choices and the difficulty history (``sampler/…``)
            metrics.update(self.sampler.metrics())
        if self.dist is not None:  # over every process's rows (the update's metrics are global already)
            metrics = self.dist.step_metrics(fresh, metrics, set(train), self.accuracy_term, judged)
        if replayed is not None:
            metrics["batch/replayed_completions"] = float(replayed.sum())
        return batch, metrics

    def observe_sampler(self, batch: RolloutBatch) -> None:
        """Tell the sampler how the step's prompts fared: each group's pass rate under the accuracy term (its
        difficulty history, the solved filter)."""
        observe = getattr(self.sampler, "observe", None)
        if observe is None:  # a user's sampler without the feedback protocol
            return
        from rlexp.samplers.feedback import GroupFeedback

        feedback = GroupFeedback.from_batch(batch, self.accuracy_term)
        observe(feedback if self.dist is None else self.dist.gather_feedback(feedback))  # every process's groups

    def observe_advantages(self, batch: RolloutBatch, own_rows: torch.Tensor | None) -> None:
        """A sampler that schedules by learnability (DUMP) gets each of the step's own groups' mean |advantage|."""
        observe = getattr(self.sampler, "observe_advantages", None)
        if observe is None:
            return
        from rlexp.samplers.feedback import group_rows, mean_abs_advantage

        own = batch if own_rows is None else batch.select(own_rows)
        groups = group_rows(own.group_ids)
        records, values = (
            [own.records[int(rows[0])] for rows in groups],
            [mean_abs_advantage(own, rows) for rows in groups],
        )
        if self.dist is not None:  # every process's groups
            records, values = self.dist.gather_lists(records, values)
        observe(records, values)

    def take_rollout(self, step: int, timings: dict) -> RolloutBatch:
        """trainer.async_rollout: the batch of ``step`` generated ahead (during the previous step's update), scored
        now; generated here first when none is in flight (step 1; a resume from a checkpoint that holds none)."""
        if self.ahead.pending_step != step:
            records, prompts = self.prompts_for(self.sampler.next_batch())
            self.ahead.launch(self.model, step, records, prompts, version=step - 1)
        job, wait = self.ahead.take(step)
        batch = self.scored_batch(job.records, job.prompts, job.output)
        timings["time/generate_s"] = job.generate_s  # the rollout's own time, in the rollout thread
        timings["time/reward_s"] = batch.stats.pop("time/reward_s", 0.0)
        timings["time/rollout_wait_s"] = wait  # what of it the trainer thread waited for
        timings["time/rollout_overlap_s"] = max(0.0, job.generate_s - wait)  # what of it ran beside training
        # policy versions between the weights that generated the batch and those its update starts from
        timings["async/version_lag"] = float(step - 1 - job.version)
        return batch

    @property
    def stateful_parts(self) -> list:
        """Parts whose state a checkpoint keeps by position: the group stages (RePO's replay buffer), then NLPO's
        masking policy, then the entropy bonus's coefficient, then a per-token temperature's statistics (HAPO), then
        CAPO's model of the optimiser's moments, then EGPO's backup."""
        masking = [self.action_mask] if self.action_mask is not None else []
        bonus = [self.algo.entropy_control] if self.algo.entropy_control is not None else []
        schedule = getattr(self.rollout, "token_temperature", None)
        temperature = [schedule] if hasattr(schedule, "state_dict") else []
        curvature = [self.algo.curvature_mask] if self.algo.curvature_mask is not None else []
        extragradient = [self.extragradient] if self.extragradient is not None else []
        return [*self.algo.group_stages, *masking, *bonus, *temperature, *curvature, *extragradient]

    # ---- the loop -----------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the newest usable checkpoint of the run directory (``trainer.resume``), falling back to an older
        one when it does not verify (``checkpoint.restore_checkpoint``); the step to continue after (0: none).
        Called by ``train``, or before it by an app that writes the run's files only once a resume succeeded."""
        if self._restored is not None:
            return self._restored[0]
        start_step, tracker_ids = 0, None
        found = None
        if self.s.resume:
            found = ckpt.restore_checkpoint(
                self.ckpt_dir,
                model=self.model,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                sampler=self.sampler,
                reference=self.reference,
                critic=self.algo.critic,
                rollout=self.rollout,
                pending=self.ahead,
                stages=self.stateful_parts,
                states=self.dist.states if self.sharded else None,
            )
        if found is not None:
            path, meta = found
            start_step, tracker_ids = meta["step"], meta.get("tracker_ids")
            log.info("Resuming from %s at step %d", path, start_step)
        elif self.s.resume and self.jsonl.path.exists() and self.jsonl.last_step() > 0:
            raise ckpt.CheckpointError(
                f"{self.run_dir} already holds logged steps but no checkpoint to resume from; train in a new run "
                "directory (hydra.run.dir=<dir>)"
            )
        self._restored = (start_step, tracker_ids, found is not None)
        if found is not None and self.slow_fast.s.fast_steps > 0 and self.slow_fast.s.stop_window > 0:
            from rlexp.tracking.base import read_jsonl

            self.slow_fast.replay(read_jsonl(self.jsonl.path), start_step)  # SFPO's entropy history
        return start_step

    def train(self) -> TrainResult:
        from rlexp.trainer.stopping import GracefulStop

        try:
            with GracefulStop(self.s.stop_grace_s) as self.stopper:
                return self._train()
        finally:
            if self.ahead is not None:
                self.ahead.close()

    def _train(self) -> TrainResult:
        self.restore()
        start_step, tracker_ids, resumed = self._restored
        if not self.is_main:  # distributed: the main process owns the tracker runs, the logs and the run's files
            return self._loop(start_step, self.jsonl.last_step(), None)
        if self.continue_tracker_runs:
            # an id missing from the checkpoint (tracker unreachable then) may since have been filled in
            # tracker_ids.json by `rlexp replay`
            saved = self._saved_tracker_ids()
            if isinstance(tracker_ids, dict) and isinstance(saved, dict):
                tracker_ids = {**saved, **{k: v for k, v in tracker_ids.items() if v}}
            tracker_ids = tracker_ids or saved
        else:  # a fresh run, or a copy of a run: new tracker runs (rlexp.runs.identity)
            tracker_ids = None
        ids = self.tracker.start(self.run_name, self.config, self.params, self.tags, tracker_ids)
        status = "FAILED"
        try:  # from here the tracker run exists: whatever fails ends it with a status
            self._save_tracker_ids(ids)
            if not tracker_ids:
                self._log_config_artifacts()
            self.jsonl.start(self.run_name, self.config, self.params, self.tags)
            last_logged = self.jsonl.last_step()
            if resumed and last_logged > 0:  # steps logged to the JSONL but not to a tracker (a kill; a copy)
                from rlexp.tracking.base import read_jsonl

                self.tracker.backfill(read_jsonl(self.jsonl.path))
            result = self._loop(start_step, last_logged, ids)
            status = "FINISHED"
            return result
        except BaseException as e:
            # a stop signal, or an error after one (a broken `| tee` pipe once Ctrl-C killed tee): KILLED
            if isinstance(e, KeyboardInterrupt) or self.stopper.requested:
                status = "KILLED"
            raise
        finally:
            self.finish(status)

    def finish(self, status: str) -> None:
        """The run's final status in provenance.json, uploaded again (the start's copy said RUNNING), then in
        the trackers."""
        from rlexp.tracking.provenance import finish_provenance

        prov = self.run_dir / "provenance.json"
        if prov.exists():
            finish_provenance(self.run_dir, status)
            self.tracker.log_artifact(str(prov))
        self.tracker.finish(status)
        self.finished = status

    def _loop(self, start_step: int, last_logged: int, ids) -> TrainResult:
        from rlexp.trainer.progress import TrainProgress

        s = self.s
        result = TrainResult(start_step)
        with TrainProgress(total=s.max_steps, start=start_step, enabled=s.progress and self.is_main) as bar:
            if self._main_decides(
                self.evaluator is not None and s.eval_at_start and start_step == 0 and not self.jsonl.has_step(0)
            ):
                with self._full_weights():
                    if self.is_main:
                        self._evaluate_at_start()
            for step in range(start_step + 1, s.max_steps + 1):
                _, metrics = self.train_step(step)
                eval_metrics = {}
                if self._main_decides(
                    self.evaluator is not None and ((s.eval_every and step % s.eval_every == 0) or step == s.max_steps)
                ):
                    with self._full_weights():  # fsdp: every process gathers, the main process evaluates
                        if self.is_main:
                            eval_metrics = self._with_gain(self.evaluator(self.model, self.tok, step))
                    metrics.update(eval_metrics)
                    result.eval_metrics = eval_metrics
                if step > last_logged:  # a resumed run recomputes the steps after its checkpoint: log each once
                    self.jsonl.log_metrics(metrics, step)
                    self.tracker.log_metrics(metrics, step)
                if any(not math.isfinite(v) for k, v in metrics.items() if k.startswith("loss")):
                    raise FloatingPointError(f"step {step}: non-finite loss {metrics.get('loss/total')}")
                result.last_step, result.metrics = step, metrics
                bar.update(step, metrics)
                stop = False
                for cb in self.callbacks:
                    stop |= bool(cb.on_step_end(step, metrics, eval_metrics))
                signalled = self.stopper.requested
                if signalled:
                    self.stopper.step_ended()
                    stop = True
                if self.dist is not None:  # a stop on any process stops every process
                    stop = self.dist.any_true(stop)
                due = (s.checkpoint_every and step % s.checkpoint_every == 0) or step == s.max_steps or stop
                full = {}
                if due and self.sharded:  # fsdp / deepspeed: the full weights and optimiser state, gathered
                    states = self.dist.states
                    full["model_state"] = states.full_model_state(self.model)
                    if s.save_optimizer:
                        full["optimizer_state_dict"] = states.full_optimizer_state(self.model, self.optimizer)
                if due and self.is_main:
                    ckpt.save_checkpoint(
                        self.ckpt_dir,
                        step=step,
                        model=self.model,
                        optimizer=self.optimizer,
                        scheduler=self.scheduler,
                        sampler=self.sampler,
                        reference=self.reference,
                        tracker_ids=ids,
                        critic=self.algo.critic,
                        rollout=self.rollout,
                        keep=max(s.keep_checkpoints, 2 if s.fallback_checkpoint else 1),
                        optimizer_state=s.save_optimizer,
                        pending=self.ahead,  # the rollout generated ahead for the next step, waited for and kept
                        stages=self.stateful_parts,  # parts with state (RePO's replay buffer, NLPO's mask)
                        extra=None if self.dist is None else {"world_size": self.dist.world_size},
                        **full,
                    )
                if due and self.dist is not None:
                    self.dist.barrier()  # the other processes wait for the main process's checkpoint
                if signalled and step < s.max_steps:  # stopped on a signal (the last step: simply done)
                    from rlexp.trainer.stopping import RunStopped

                    raise RunStopped(self.stopper.signum, step, checkpointed=True)
                if stop:
                    result.stopped_early = True
                    break
        # a fallback checkpoint is kept while the run trains (trainer.fallback_checkpoint), not after
        if self.is_main:
            ckpt.prune(self.ckpt_dir, s.keep_checkpoints)
        return result

    def _main_decides(self, flag: bool) -> bool:
        """``flag`` as the main process has it (fsdp / deepspeed: the others do not evaluate, but must join its
        gathering)."""
        return self.dist.broadcast_object(bool(flag)) if self.sharded else bool(flag)

    def _full_weights(self):
        """The policy's full parameters on every process for the block (fsdp, ZeRO-3: gathered, a collective); else
        nothing."""
        return self.dist.gathered(self.model) if self.sharded else ExitStack()

    def _evaluate_at_start(self) -> None:
        """The untrained policy's held-out metrics, logged at step 0 (once: a run killed after it resumes
        without evaluating again)."""
        metrics = self.evaluator(self.model, self.tok, 0)
        self.jsonl.log_metrics(metrics, 0)
        self.tracker.log_metrics(metrics, 0)

    def _with_gain(self, metrics: dict) -> dict:
        """``eval/accuracy_gain`` beside the held-out metrics (``trainer.metrics.with_accuracy_gain``)."""
        return with_accuracy_gain(metrics, self.jsonl.path)

    # ---- tracker bookkeeping ------------------------------------------------------------------
    def _saved_tracker_ids(self):
        import json

        p = self.run_dir / "tracker_ids.json"
        return json.loads(p.read_text()) if p.exists() else None

    def _save_tracker_ids(self, ids) -> None:
        import json

        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "tracker_ids.json").write_text(json.dumps(ids))

    def _log_config_artifacts(self) -> None:
        for name in ("config.yaml", "overrides.yaml", "provenance.json"):
            p = self.run_dir / name
            if p.exists():
                self.tracker.log_artifact(str(p))
