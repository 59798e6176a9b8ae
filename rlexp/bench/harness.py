"""The bench harness (``rlexp bench``, ``rlexp.commands.bench``): our trainer against TRL's GRPOTrainer, step by step.

Both trainers run in this one process on the identical setting: the same model directory, loaded the
same way (``rlexp.models.loading.load_pretrained``, fp32 weights); the same prompts in the same order
(rendered with the same chat template and system prompt); G completions per prompt; the same number of
new tokens, temperature, top-k/top-p; β = 0; μ = 1 with one optimiser step per rollout (the same
micro-batch size, so the same gradient accumulation); the same AdamW hyper-parameters and constant LR;
the accuracy reward term only. They alternate: ours step 1, TRL step 1, ours step 2, TRL step 2, ...
(``bench.first=trl`` swaps the order); the first ``bench.warmup_steps`` of each are not measured.

Precision: our trainer keeps fp32 master weights and runs the matmuls of rollout and training under
bf16 autocast when ``trainer.autocast`` resolves to bf16 (``auto``: on CUDA, and on CPUs with AMX /
AVX512-BF16). ``bench.trl.bf16=null`` gives TRL the matching policy: ``bf16=True`` exactly when ours
autocasts in bf16 (transformers/accelerate then also keep fp32 weights and autocast the forward);
otherwise TRL runs in fp32 (``bf16=False``). The dtype each side's matmuls actually ran in, during
generation and during training, is observed with a forward hook and written into the report.

Phases of a step (wall time; on CUDA the device is synchronised at each boundary):

* ours (``rlexp.trainer.loop.Trainer.train_step``): ``generate`` = prompt rendering + tokenisation,
  ``model.generate`` with the sampling log-prob recorder, EOS masking, decoding; ``score`` = the reward
  terms; ``train`` = advantages + the policy update (forward + backward of every micro-batch, gradient
  clipping, ``optimizer.step``); ``other`` = the rest of the step (group stages, batch assembly).
* TRL: see ``rlexp/bench/trl_side.py`` (``_generate``, ``_calculate_rewards``, the rest of the step up to
  ``on_step_end``, and the loop's overhead before ``on_step_begin``).

``step = generate + score + train + other`` for every step of both. The summary takes the median step
by step time (the mean of the two middle steps for an even count), so its phases add up too; peak
memory is the maximum over the measured steps: CPU — the process's peak RSS during the step
(``VmHWM``, reset before each step through /proc/self/clear_refs, after malloc_trim has returned freed
heap to the OS; a 5 ms psutil sampler where clear_refs is not writable); CUDA —
``torch.cuda.max_memory_allocated`` (reset before each step). Both trainers live in one process, so
the absolute peak includes the other trainer's resident model and optimiser state; ``mem_delta_mb`` is
the peak minus the memory in use when the step started. Ratios are TRL / ours for every column
(time > 1: ours is faster; tokens/s < 1: ours is faster).

Writes ``<bench.out_dir>/<setting>-<device>.{md,csv,json}``.
"""

from __future__ import annotations

import logging
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.bench.meter import DtypeProbe, Meter
from rlexp.bench.report import PHASE_NOTES, device_name, device_slug, git_info, ratios, summarise, write_report
from rlexp.config.schema import ConfigError, TrainerConfig
from rlexp.runs.setup import build, prepare_process

log = logging.getLogger("rlexp.bench")


def trainer_settings(cfg: DictConfig) -> DictConfig:
    """``cfg.trainer`` over the train app's TrainerConfig defaults (what Trainer reads)."""
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), cfg.trainer)


def check_comparable(cfg: DictConfig, t: DictConfig) -> None:
    """The bench compares like with like: refuse settings TRL's GRPOTrainer would run differently."""
    a = cfg.algorithm
    checks = [
        (a.kl.coef == 0, "algorithm.kl.coef", a.kl.coef, "must be 0 (β = 0: no reference model on either side)"),
        (
            a.aggregation == "seq-mean-token-mean",
            "algorithm.aggregation",
            a.aggregation,
            "must be seq-mean-token-mean (TRL loss_type=grpo)",
        ),
        (not a.get("group_stages"), "algorithm.group_stages", a.get("group_stages"), "must be empty"),
        (a.get("entropy_coef", 0.0) == 0, "algorithm.entropy_coef", a.get("entropy_coef"), "must be 0"),
        (
            a.get("top_entropy_quantile", 1.0) == 1.0,
            "algorithm.top_entropy_quantile",
            a.get("top_entropy_quantile"),
            "must be 1",
        ),
        (a.get("critic") is None, "algorithm.critic", a.get("critic"), "must be null"),
        (
            a.get("num_generations") is None,
            "algorithm.num_generations",
            a.get("num_generations"),
            "must be null (both trainers take G from trainer.num_generations)",
        ),
        (str(a.advantage._target_).endswith(".grpo"), "algorithm.advantage", a.advantage._target_, "must be grpo"),
        (
            str(a.loss._target_).endswith(".ppo_clip") and a.loss.get("dual_clip") is None,
            "algorithm.loss",
            a.loss._target_,
            "must be ppo_clip without dual clip",
        ),
        (
            t.num_iterations in (None, 1),
            "trainer.num_iterations",
            t.num_iterations,
            "must be 1 (one optimiser step per rollout)",
        ),
        (
            cfg.optimizer._target_ == "torch.optim.AdamW",
            "optimizer._target_",
            cfg.optimizer._target_,
            "must be torch.optim.AdamW (TRL's optim=adamw_torch[_fused])",
        ),
        (t.warmup_steps == 0, "trainer.warmup_steps", t.warmup_steps, "must be 0 (constant LR on both sides)"),
        (len(cfg.reward.terms) == 1, "reward.terms", list(cfg.reward.terms), "must be one term (reward=accuracy)"),
        (
            cfg.rollout.get("micro_batch", 0) == 0,
            "rollout.micro_batch",
            cfg.rollout.get("micro_batch"),
            "must be 0 (TRL generates the whole batch in one call)",
        ),
    ]
    n = t.prompts_per_step * t.num_generations
    mb = t.micro_batch_size or n
    checks.append(
        (
            n % mb == 0,
            "trainer.micro_batch_size",
            t.micro_batch_size,
            f"must divide prompts × G = {n} (TRL's gradient accumulation)",
        )
    )
    for ok, key, value, why in checks:
        if not ok:
            raise ConfigError(f"{key}={value}: {why}")


def model_directory(model_cfg: DictConfig, run_dir: Path) -> Path:
    """The one directory both trainers load the model from."""
    from rlexp.models import loading

    src = model_cfg.source
    if src == "gguf_package":
        return loading.convert_gguf_once(
            model_cfg.package, model_cfg.gguf_file, model_cfg.get("cache_dir"), model_cfg.get("gguf_path")
        )
    if src == "hub":
        return Path(model_cfg.path)
    if src == "tiny":  # random weights: save them once so both trainers load the same ones
        target = run_dir / "tiny-model"
        if not (target / "config.json").exists():
            dtype = loading.resolve_dtype(model_cfg.dtype, torch.device("cpu"))
            params = {k: v for k, v in dict(model_cfg).items() if k not in ("source", "dtype")}
            loaded = loading.load_tiny(dtype=dtype, device=torch.device("cpu"), **params)
            loaded.model.save_pretrained(target)
            loaded.tokenizer.save_pretrained(target)
        return target
    raise ConfigError(f"model.source={src!r} is not one of ['gguf_package', 'hub', 'tiny']")


def load(model_cfg: DictConfig, path: Path, device: torch.device):
    from rlexp.models.loading import load_pretrained, resolve_dtype

    return load_pretrained(str(path), resolve_dtype(model_cfg.dtype, device), device, name=model_cfg.name)


class OursSide:
    """rlexp's Trainer, driven step by step (``train_step``; no tracker, no checkpoints)."""

    def __init__(self, cfg: DictConfig, t: DictConfig, loaded, data, prompt_format, run_dir: Path):
        from rlexp.tracking.base import JSONLTracker, NoTracker
        from rlexp.trainer.loop import Trainer

        self.reward_terms = {name: build(term, f"reward.terms.{name}") for name, term in cfg.reward.terms.items()}
        algorithm = build(cfg.algorithm, "algorithm", _convert_="all")
        rollout = build(cfg.rollout, "rollout")
        optimizer = build(cfg.optimizer, "optimizer")(loaded.model.parameters())
        self.trainer = Trainer(
            settings=t,
            model=loaded.model,
            tokenizer=loaded.tokenizer,
            algorithm=algorithm,
            reward_terms=self.reward_terms,
            rollout=rollout,
            data=data,
            prompt_format=prompt_format,
            optimizer=optimizer,
            scheduler=None,
            tracker=NoTracker(),
            jsonl=JSONLTracker(run_dir / "metrics.jsonl"),
            run_dir=run_dir,
            run_name="bench-ours",
            config={},
            params={},
            tags={},
            accuracy_term=t.accuracy_term,
        )
        self.records: list[dict] = []
        self.prompt_ids: list[list[list[int]]] = []  # per step: the prompt tokens of every completion
        self.probe: DtypeProbe | None = None

    def step(self, k: int, meter: Meter) -> None:
        meter.start()
        batch, m = self.trainer.train_step(k)
        step_s, mem = meter.stop()
        if self.probe is not None:
            self.probe.watch(getattr(self.trainer.rollout, "shadow", None))
        self.prompt_ids.append([ids[mask.bool()].tolist() for ids, mask in zip(batch.prompt_ids, batch.prompt_mask)])
        self.records.append(
            {
                "step": k,
                "generate_s": m["time/generate_s"],
                "score_s": m["time/reward_s"],
                "train_s": m["time/train_s"],
                "step_s": step_s,
                "completion_tokens": float(batch.completion_mask.sum()),
                "completions": len(batch),
                "max_length": float(batch.completion_mask.sum(-1).max()),
                "reward_mean": m["reward/mean"],
                **mem,
            }
        )
        log_step("ours", self.records[-1])


def log_step(trainer: str, r: dict) -> None:
    log.info(
        "%-4s step %d: %.3f s (generate %.3f, score %.3f, train %.3f), %d tokens, peak %.0f MB, load %.2f",
        trainer,
        r["step"],
        r["step_s"],
        r["generate_s"],
        r["score_s"],
        r["train_s"],
        r["completion_tokens"],
        r["peak_mem_mb"],
        r["load1"],
    )


def _finish(records: list[dict], trainer: str, warmup: int) -> list[dict]:
    out = []
    for i, r in enumerate(records, 1):
        r = {"trainer": trainer, "step": i, "warmup": i <= warmup, **{k: v for k, v in r.items() if k != "step"}}
        r["other_s"] = max(r["step_s"] - r["generate_s"] - r["score_s"] - r["train_s"], 0.0)
        r["tokens_per_s"] = r["completion_tokens"] / r["step_s"]
        r["generate_tokens_per_s"] = r["completion_tokens"] / r["generate_s"]
        r["mean_length"] = r["completion_tokens"] / max(r["completions"], 1)
        out.append(r)
    return out


def run(cfg: DictConfig, command: str = "") -> dict:
    """Run the bench on a composed config; returns the report (also written to ``bench.out_dir``)."""
    b = cfg.bench
    t = trainer_settings(cfg)
    check_comparable(cfg, t)
    if b.warmup_steps < 0 or b.steps < 1:
        raise ConfigError(f"bench.warmup_steps={b.warmup_steps}, bench.steps={b.steps}: need >= 0 and >= 1")
    if b.first not in ("ours", "trl"):
        raise ConfigError(f"bench.first={b.first!r} is not one of ['ours', 'trl']")
    device = prepare_process(t)
    run_dir = Path(t.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    total = b.warmup_steps + b.steps

    data = build(cfg.dataset, "dataset")
    prompt_format = build(cfg.prompt, "prompt")
    path = model_directory(cfg.model, run_dir)
    ours_loaded = load(cfg.model, path, device)
    ours = OursSide(cfg, t, ours_loaded, data, prompt_format, run_dir)
    from rlexp.trainer.loop import resolve_autocast

    autocast = resolve_autocast(t.autocast, next(ours_loaded.model.parameters()))
    probes = {"ours": DtypeProbe(ours_loaded.model)}
    ours.probe = probes["ours"]
    meter = Meter(device, b.rss_interval_s)
    n_rows = t.prompts_per_step * t.num_generations
    micro = t.micro_batch_size or n_rows
    opt = cfg.optimizer
    setting = {
        "prompts_per_step": t.prompts_per_step,
        "num_generations": t.num_generations,
        "max_new_tokens": t.max_new_tokens,
        "micro_batch_size": micro,
        "lr": opt.lr,
        "temperature": cfg.rollout.temperature,
        "top_k": cfg.rollout.top_k,
        "top_p": cfg.rollout.top_p,
        "model": cfg.model.name,
        "model_dir": str(path),
        "dataset": cfg.dataset.get("name"),
    }
    precision = {
        "ours": f"fp32 weights, autocast {str(autocast).replace('torch.', '') if autocast else 'off'}, "
        f"{opt._target_}(fused={opt.get('fused')}), compile={t.compile}"
    }

    trl = None
    versions = {}
    if b.compare_trl:
        from rlexp.bench import trl_side as bench_trl
        from rlexp.samplers.shuffle import PromptSampler

        bf16 = (autocast == torch.bfloat16) if b.trl.bf16 is None else bool(b.trl.bf16)
        optim = b.trl.optim or ("adamw_torch_fused" if opt.get("fused") else "adamw_torch")
        trl_compile, trl_cache = bool(b.trl.get("torch_compile", False)), b.trl.get("cache_implementation")
        order = PromptSampler(data.train, t.prompts_per_step, t.seed)  # the order ours draws, step by step
        records = [r for _ in range(total) for r in order.next_batch()]
        term_name, term_cfg = next(iter(cfg.reward.terms.items()))
        trl_loaded = load(cfg.model, path, device)
        config = bench_trl.grpo_config(
            output_dir=str(run_dir / "trl"),
            device=device,
            n_rows=n_rows,
            micro_batch=micro,
            num_generations=t.num_generations,
            max_new_tokens=t.max_new_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            lr=opt.lr,
            betas=list(opt.betas),
            weight_decay=opt.weight_decay,
            adam_eps=opt.eps,
            max_grad_norm=t.max_grad_norm,
            eps_low=cfg.algorithm.loss.eps_low,
            eps_high=cfg.algorithm.loss.eps_high,
            total_steps=total,
            seed=t.seed,
            bf16=bf16,
            gradient_checkpointing=b.trl.gradient_checkpointing,
            optim=optim,
            scale_rewards=cfg.algorithm.advantage.get("scale", "group"),
            reward_weight=term_cfg.get("weight", 1.0),
            torch_compile=trl_compile,
            cache_implementation=trl_cache,
        )
        trl = bench_trl.TRLSide(
            model=trl_loaded.model,
            tokenizer=trl_loaded.tokenizer,
            records=records,
            prompt_format=prompt_format,
            reward_term=ours.reward_terms[term_name],
            config=config,
            skip_nonfinite_steps=b.trl.get("skip_nonfinite_steps", True),
        )
        probes["trl"] = DtypeProbe(trl_loaded.model)
        precision["trl"] = (
            f"fp32 weights, bf16={bf16} (accelerate autocast {'bf16' if bf16 else 'off'}), "
            f"gradient_checkpointing={b.trl.gradient_checkpointing}, optim={optim}, "
            f"torch_compile={trl_compile}, cache_implementation={trl_cache}"
        )
        versions = bench_trl.versions()

    log.info(
        "bench %s on %s: %d warm-up + %d measured steps each", b.setting, device_name(device), b.warmup_steps, b.steps
    )
    if trl is None:
        for k in range(1, total + 1):
            ours.step(k, meter)
    else:
        if b.first == "ours":
            ours.step(1, meter)
            trl.run(lambda k: ours.step(k + 1, meter) if k < total else None, meter, log_step)
        else:
            trl.run(lambda k: ours.step(k, meter), meter, log_step)
        if len(trl.records) != total:
            raise RuntimeError(f"TRL ran {len(trl.records)} steps, expected {total}")
    if len(ours.records) != total:
        raise RuntimeError(f"our trainer ran {len(ours.records)} steps, expected {total}")

    profile = None
    if b.get("profile"):  # one more step of ours, unmeasured, under the profiler (rlexp/bench/profile.py)
        from rlexp.bench.profile import profile_step

        Path(b.out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(b.out_dir) / f"{b.setting}-{device_slug(device)}-profile.txt"
        profile = {"file": str(path), "phases": profile_step(lambda: ours.trainer.train_step(total + 1), device, path)}

    rows = _finish(ours.records, "ours", b.warmup_steps)
    summary = {"ours": summarise(rows)}
    if trl is not None:
        trl_rows = _finish(trl.records, "trl", b.warmup_steps)
        summary["trl"] = summarise(trl_rows)
        # interleave the per-step rows in the order they ran
        rows = [r for pair in zip(*((rows, trl_rows) if b.first == "ours" else (trl_rows, rows))) for r in pair]
    checks = {"compute_dtype_" + k: p.summary() for k, p in probes.items()}
    checks["activation_checkpointing_ours"] = _checkpointing(ours_loaded.model)
    if trl is not None:
        checks["activation_checkpointing_trl"] = _checkpointing(trl.trainer.model)
        checks["same_prompt_tokens_every_step"] = ours.prompt_ids == trl.prompt_ids
        checks["trl_steps_with_nonfinite_grads_skipped"] = (
            (trl.skipped_steps or "none") if trl.skip_nonfinite_steps else "guard off"
        )
        checks["same_eos_ids"] = trl.trainer.eos_token_ids == _eos_list(
            ours_loaded.model.generation_config.eos_token_id
        )
    import transformers

    report = {
        "setting": b.setting,
        "device_slug": device_slug(device),
        "command": command,
        "warmup_steps": b.warmup_steps,
        "measured_steps": b.steps,
        "order": f"alternate, {b.first} first" if trl is not None else "ours only",
        "setting_detail": setting,
        "precision": precision,
        "summary": summary,
        "ratio": ratios(summary["ours"], summary["trl"]) if trl is not None else None,
        "steps": rows,
        "checks": checks,
        "phase_notes": PHASE_NOTES,
        "profile": profile,
        "provenance": {
            **git_info(),
            "device": str(device),
            "device_name": device_name(device),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **versions,
            "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "memory": meter.memory_method,
            "precision": precision,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    write_report(report, Path(b.out_dir))
    for name, m in summary.items():
        log.info(
            "%-4s median step %.3f s (generate %.3f, score %.3f, train %.3f), %.1f tokens/s, peak %.0f MB",
            name,
            m["step_s"],
            m["generate_s"],
            m["score_s"],
            m["train_s"],
            m["tokens_per_s"],
            m["peak_mem_mb"],
        )
    if report["ratio"]:
        log.info(
            "TRL / ours: step time %.2f, tokens/s %.2f", report["ratio"]["step_s"], report["ratio"]["tokens_per_s"]
        )
    log.info("wrote %s", report["files"]["md"])
    return report


def _checkpointing(model) -> bool:
    """Whether the model recomputes activations in the backward (transformers renamed the flag in 5.x)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _eos_list(eos) -> list[int]:
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def command_line() -> str:
    from hydra.core.hydra_config import HydraConfig

    prog = sys.argv[0] if sys.argv and sys.argv[0].startswith("rlexp") else "python3 -m rlexp.commands.bench"
    try:
        o = HydraConfig.get().overrides
        overrides = [*o.task, *(x for x in o.hydra if not x.startswith("hydra.mode="))]
    except ValueError:
        overrides = sys.argv[1:]
    return " ".join([prog, *map(shlex.quote, overrides)])
