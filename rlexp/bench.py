"""`rlexp bench` (also `python3 -m rlexp.bench`): our trainer against TRL's GRPOTrainer, step by step.

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
* TRL: see ``rlexp/bench_trl.py`` (``_generate``, ``_calculate_rewards``, the rest of the step up to
  ``on_step_end``, and the loop's overhead before ``on_step_begin``).

``step = generate + score + train + other`` for every step of both. The summary takes the median step
by step time (the mean of the two middle steps for an even count), so its phases add up too; peak
memory is the maximum over the measured steps: CPU — the process's peak RSS during the step
(``VmHWM``, reset before each step through /proc/self/clear_refs, after malloc_trim has returned freed
heap to the OS; a 5 ms psutil sampler where clear_refs is not writable); CUDA —
``torch.cuda.max_memory_allocated`` (reset before each step). Both trainers live in one process, so
the absolute peak includes the other trainer's resident model and optimiser state; ``mem_delta_mb`` is the peak minus the memory in use when the step started. Ratios are TRL / ours
for every column (time > 1: ours is faster; tokens/s < 1: ours is faster).

Writes ``<bench.out_dir>/<setting>-<device>.{md,csv,json}``.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import ConfigError, TrainerConfig
from rlexp.tracking.provenance import cpu_model
from rlexp.train import CONF_DIR, build, prepare_process

log = logging.getLogger("rlexp.bench")
REPO = Path(__file__).resolve().parent.parent
PHASES = ("generate_s", "score_s", "train_s", "other_s")
COLUMNS = ("generate_s", "score_s", "train_s", "other_s", "step_s", "completion_tokens", "tokens_per_s",
           "generate_tokens_per_s", "tokens_per_s_all", "peak_mem_mb", "mem_delta_mb", "mean_length", "max_length",
           "reward_mean")


# ---- measuring ----------------------------------------------------------------------------------

def _read_hwm_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_mb() -> float:
    try:
        import psutil
        return psutil.Process().memory_info().rss / 2 ** 20
    except ImportError:  # Linux without psutil
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _malloc_trim() -> None:
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Meter:
    """Wall time and peak memory of one step. ``start()`` / ``stop()`` bracket it; ``sync()`` waits
    for queued CUDA work so that the clock measures finished work."""

    def __init__(self, device: torch.device, rss_interval_s: float = 0.005):
        self.device = device
        self.cuda = device.type == "cuda"
        self.t_start = self.t_stop = 0.0
        self.mem_start = 0.0
        self.interval = rss_interval_s
        self._hwm_reset = False
        if not self.cuda:
            self._hwm_reset = self._reset_hwm()
        self.memory_method = ("torch.cuda.max_memory_allocated" if self.cuda else
                              "peak RSS (VmHWM, reset per step)" if self._hwm_reset else
                              f"peak RSS (psutil sampled every {rss_interval_s * 1000:g} ms)")
        self._peak = 0.0
        self._stop_sampler = threading.Event()
        self._sampler = None

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return _read_hwm_kb() is not None
        except OSError:
            return False

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _sample(self) -> None:
        while not self._stop_sampler.wait(self.interval):
            self._peak = max(self._peak, _rss_mb())

    def start(self) -> None:
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.mem_start = torch.cuda.memory_allocated(self.device) / 2 ** 20
        else:
            _malloc_trim()  # freed heap of the other trainer's step back to the OS: the start RSS is live memory
            self.mem_start = _rss_mb()
            if self._hwm_reset:
                self._reset_hwm()
            else:
                self._peak = self.mem_start
                self._stop_sampler.clear()
                self._sampler = threading.Thread(target=self._sample, daemon=True)
                self._sampler.start()
        self.t_start = time.perf_counter()

    def stop(self) -> tuple[float, dict[str, float]]:
        self.sync()
        self.t_stop = time.perf_counter()
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device) / 2 ** 20
        elif self._hwm_reset:
            peak = _read_hwm_kb() / 1024
        else:
            self._stop_sampler.set()
            self._sampler.join()
            peak = max(self._peak, _rss_mb())
        return self.t_stop - self.t_start, {"peak_mem_mb": peak, "mem_delta_mb": max(peak - self.mem_start, 0.0),
                                            "load1": os.getloadavg()[0]}


class DtypeProbe:
    """Forward hook on the first Linear layer of each watched model: the dtypes its outputs had with
    gradients off (generation) and on (training). Ours also watches the rollout's half-precision copy
    of the policy (``rollout.inference_dtype``) once it exists."""

    def __init__(self, model):
        self.seen = {"generate": set(), "train": set()}
        self._watched: set[int] = set()
        self.watch(model)

    def watch(self, model) -> None:
        if model is None or id(model) in self._watched:
            return
        self._watched.add(id(model))
        layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        layer.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.seen["train" if torch.is_grad_enabled() else "generate"].add(str(output.dtype).replace("torch.", ""))

    def summary(self) -> dict[str, str]:
        return {k: "/".join(sorted(v)) or "-" for k, v in self.seen.items()}


# ---- the setting ------------------------------------------------------------------------------------

def trainer_settings(cfg: DictConfig) -> DictConfig:
    """``cfg.trainer`` over the train app's TrainerConfig defaults (what Trainer reads)."""
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), cfg.trainer)


def check_comparable(cfg: DictConfig, t: DictConfig) -> None:
    """The bench compares like with like: refuse settings TRL's GRPOTrainer would run differently."""
    a = cfg.algorithm
    checks = [
        (a.kl.coef == 0, "algorithm.kl.coef", a.kl.coef, "must be 0 (β = 0: no reference model on either side)"),
        (a.aggregation == "seq-mean-token-mean", "algorithm.aggregation", a.aggregation,
         "must be seq-mean-token-mean (TRL loss_type=grpo)"),
        (not a.get("group_stages"), "algorithm.group_stages", a.get("group_stages"), "must be empty"),
        (a.get("entropy_coef", 0.0) == 0, "algorithm.entropy_coef", a.get("entropy_coef"), "must be 0"),
        (a.get("top_entropy_quantile", 1.0) == 1.0, "algorithm.top_entropy_quantile", a.get("top_entropy_quantile"),
         "must be 1"),
        (a.get("critic") is None, "algorithm.critic", a.get("critic"), "must be null"),
        (str(a.advantage._target_).endswith(".grpo"), "algorithm.advantage", a.advantage._target_, "must be grpo"),
        (str(a.loss._target_).endswith(".ppo_clip") and a.loss.get("dual_clip") is None, "algorithm.loss",
         a.loss._target_, "must be ppo_clip without dual clip"),
        (t.num_iterations == 1, "trainer.num_iterations", t.num_iterations, "must be 1 (one optimiser step per rollout)"),
        (cfg.optimizer._target_ == "torch.optim.AdamW", "optimizer._target_", cfg.optimizer._target_,
         "must be torch.optim.AdamW (TRL's optim=adamw_torch[_fused])"),
        (t.warmup_steps == 0, "trainer.warmup_steps", t.warmup_steps, "must be 0 (constant LR on both sides)"),
        (len(cfg.reward.terms) == 1, "reward.terms", list(cfg.reward.terms), "must be one term (reward=accuracy)"),
        (cfg.rollout.get("micro_batch", 0) == 0, "rollout.micro_batch", cfg.rollout.get("micro_batch"),
         "must be 0 (TRL generates the whole batch in one call)"),
    ]
    n = t.prompts_per_step * t.num_generations
    mb = t.micro_batch_size or n
    checks.append((n % mb == 0, "trainer.micro_batch_size", t.micro_batch_size,
                   f"must divide prompts × G = {n} (TRL's gradient accumulation)"))
    for ok, key, value, why in checks:
        if not ok:
            raise ConfigError(f"{key}={value}: {why}")


def model_directory(model_cfg: DictConfig, run_dir: Path) -> Path:
    """The one directory both trainers load the model from."""
    from rlexp.models import loading
    src = model_cfg.source
    if src == "gguf_package":
        return loading.convert_gguf_once(model_cfg.package, model_cfg.gguf_file, model_cfg.get("cache_dir"),
                                         model_cfg.get("gguf_path"))
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


# ---- the two sides -------------------------------------------------------------------------------

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
            settings=t, model=loaded.model, tokenizer=loaded.tokenizer, algorithm=algorithm,
            reward_terms=self.reward_terms, rollout=rollout, data=data, prompt_format=prompt_format,
            optimizer=optimizer, scheduler=None, tracker=NoTracker(), jsonl=JSONLTracker(run_dir / "metrics.jsonl"),
            run_dir=run_dir, run_name="bench-ours", config={}, params={}, tags={}, accuracy_term=t.accuracy_term)
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
        self.records.append({
            "step": k, "generate_s": m["time/generate_s"], "score_s": m["time/reward_s"], "train_s": m["time/train_s"],
            "step_s": step_s, "completion_tokens": float(batch.completion_mask.sum()), "completions": len(batch),
            "max_length": float(batch.completion_mask.sum(-1).max()),
            "reward_mean": m["reward/mean"], **mem})
        log_step("ours", self.records[-1])


def log_step(trainer: str, r: dict) -> None:
    log.info("%-4s step %d: %.3f s (generate %.3f, score %.3f, train %.3f), %d tokens, peak %.0f MB, load %.2f",
             trainer, r["step"], r["step_s"], r["generate_s"], r["score_s"], r["train_s"], r["completion_tokens"],
             r["peak_mem_mb"], r["load1"])


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


# ---- the report -----------------------------------------------------------------------------------

def summarise(rows: list[dict]) -> dict:
    """The median step by step time (mean of the two middle steps for an even count) of the
    measured steps; peak memory is the maximum over them; ``tokens_per_s_all`` is all measured
    completion tokens over all measured step time (less sensitive to one step's sampled lengths)."""
    meas = sorted((r for r in rows if not r["warmup"]), key=lambda r: r["step_s"])
    if not meas:
        raise ValueError("no measured steps (bench.steps must be >= 1)")
    mid = [meas[(len(meas) - 1) // 2], meas[len(meas) // 2]]
    s = {k: (mid[0][k] + mid[1][k]) / 2 for k in COLUMNS if k not in ("peak_mem_mb", "mem_delta_mb", "tokens_per_s_all")}
    s["tokens_per_s"] = s["completion_tokens"] / s["step_s"]
    s["generate_tokens_per_s"] = s["completion_tokens"] / s["generate_s"]
    s["tokens_per_s_all"] = sum(r["completion_tokens"] for r in meas) / sum(r["step_s"] for r in meas)
    s["peak_mem_mb"] = max(r["peak_mem_mb"] for r in meas)
    s["mem_delta_mb"] = max(r["mem_delta_mb"] for r in meas)
    s["steps"] = len(meas)
    s["step_s_min"], s["step_s_max"] = meas[0]["step_s"], meas[-1]["step_s"]
    return s


def ratios(ours: dict, trl: dict) -> dict:
    """TRL / ours for every summary column (None where ours is 0)."""
    return {k: (trl[k] / ours[k] if ours[k] else None) for k in COLUMNS}


def git_info() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit or "unknown", "git_dirty": bool(dirty) if commit else None}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return "cuda-" + re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def _fmt(v, nd=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def write_report(report: dict, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{report['setting']}-{report['device_slug']}"
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("md", "csv", "json")}
    report["files"] = {k: str(v) for k, v in paths.items()}
    paths["json"].write_text(json.dumps(report, indent=1, default=str) + "\n")
    fields = ["kind", "trainer", "step", "warmup", *COLUMNS, "load1"]
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in report["steps"]:
            w.writerow({"kind": "step", **r})
        for name, s in report["summary"].items():
            w.writerow({"kind": "median", "trainer": name, **s})
        if report.get("ratio"):
            w.writerow({"kind": "ratio_trl_over_ours", "trainer": "trl/ours", **report["ratio"]})
    paths["md"].write_text(markdown(report))
    return paths


def markdown(r: dict) -> str:
    p = r["provenance"]
    s = r["setting_detail"]
    lines = [f"# Bench: {r['setting']} on {p['device_name']}", "",
             f"`{r['command']}`", "",
             f"{s['prompts_per_step']} prompts × G={s['num_generations']} × {s['max_new_tokens']} new tokens, "
             f"micro-batch {s['micro_batch_size']}, lr {s['lr']}, temperature {s['temperature']}, "
             f"top_k {s['top_k']}, top_p {s['top_p']}, β=0, μ=1; {r['warmup_steps']} warm-up + {r['measured_steps']} "
             f"measured steps each, order: {r['order']}.", ""]
    head = ("| trainer | generate s | score s | train s | other s | step s (min–max) | tokens | tokens/s | "
            "generate tokens/s | tokens/s, all measured | peak mem MB | Δmem MB | mean len | max len | reward |")
    lines += ["## Median step", "", "The measured step with the median step time (the mean of the two middle steps "
              "for an even count); peak memory: the maximum over the measured steps; tokens/s, all measured: every "
              "measured completion token over all measured step time.", "", head, "|" + "---|" * 15]
    for name, m in r["summary"].items():
        lines.append(f"| {name} | {_fmt(m['generate_s'])} | {_fmt(m['score_s'])} | {_fmt(m['train_s'])} | "
                     f"{_fmt(m['other_s'])} | {_fmt(m['step_s'])} ({_fmt(m['step_s_min'])}–{_fmt(m['step_s_max'])}) | "
                     f"{_fmt(m['completion_tokens'], 1)} | {_fmt(m['tokens_per_s'], 1)} | "
                     f"{_fmt(m['generate_tokens_per_s'], 1)} | {_fmt(m['tokens_per_s_all'], 1)} | {_fmt(m['peak_mem_mb'], 0)} | "
                     f"{_fmt(m['mem_delta_mb'], 0)} | {_fmt(m['mean_length'], 1)} | {_fmt(m['max_length'], 1)} | "
                     f"{_fmt(m['reward_mean'])} |")
    q = r.get("ratio")
    if q:
        lines.append("| **TRL / ours** | " + " | ".join(_fmt(q[k], 2) for k in (
            "generate_s", "score_s", "train_s", "other_s", "step_s", "completion_tokens", "tokens_per_s",
            "generate_tokens_per_s", "tokens_per_s_all", "peak_mem_mb", "mem_delta_mb", "mean_length", "max_length",
            "reward_mean")) + " |")
        lines += ["", f"Step time TRL / ours = **{q['step_s']:.2f}** (>1: ours faster); completion tokens/s "
                      f"TRL / ours = **{q['tokens_per_s']:.2f}** for the median step, **{q['tokens_per_s_all']:.2f}** "
                      "over all measured steps (<1: ours faster). Completion lengths are sampled, so tokens/s moves "
                      "with them; the step time is the steadier comparison while generation runs to the same "
                      "max length on both sides (max len)."]
    lines += ["", "## Every step (in the order they ran)", "",
              "| trainer | step | warm-up | generate s | score s | train s | other s | step s | tokens | max len | "
              "tokens/s | peak mem MB | Δmem MB | load1 |", "|" + "---|" * 14]
    for x in r["steps"]:
        lines.append(f"| {x['trainer']} | {x['step']} | {_fmt(x['warmup'])} | {_fmt(x['generate_s'])} | {_fmt(x['score_s'])} | "
                     f"{_fmt(x['train_s'])} | {_fmt(x['other_s'])} | {_fmt(x['step_s'])} | {_fmt(x['completion_tokens'], 0)} | "
                     f"{_fmt(x['max_length'], 0)} | {_fmt(x['tokens_per_s'], 1)} | {_fmt(x['peak_mem_mb'], 0)} | "
                     f"{_fmt(x['mem_delta_mb'], 0)} | {_fmt(x['load1'], 2)} |")
    if r.get("profile"):
        lines += ["", "## One profiled step of ours (after the measured ones)", "",
                  f"`{Path(r['profile']['file']).name}`: ATen ops the host dispatched and, on CUDA, the kernels "
                  "launched and their GPU time, per phase (`rlexp/bench_profile.py`).", "",
                  "| phase | wall ms | ATen ops | kernels | kernel ms |", "|---|---|---|---|---|"]
        gpu = r["device_slug"] != "cpu"
        lines += [f"| {name} | {v['wall_ms']:.1f} | {v['aten_ops']} | {v['kernels'] if gpu else 'n/a'} | "
                  f"{_fmt(v['kernel_ms'], 1) if gpu else 'n/a'} |" for name, v in r["profile"]["phases"].items()]
    lines += ["", "## Provenance", ""]
    lines += [f"- {k}: {_fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)}" for k, v in p.items()]
    lines += ["", "## Checks", ""]
    lines += [f"- {k}: {_fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)}" for k, v in r["checks"].items()]
    lines += ["", "## What the phases cover", "", *[f"- {x}" for x in r["phase_notes"]], ""]
    return "\n".join(lines)


PHASE_NOTES = [
    "ours generate: prompt rendering with the chat template + tokenisation, the rollout (rlexp's decode loop, or "
    "model.generate with the sampling log-prob recorder: rollout.engine), EOS masking, decoding "
    "(Trainer.rollout_and_score minus scoring)",
    "ours score: every reward term on every completion (rlexp.rewards.scoring.score)",
    "ours train: advantages + policy_update (forward + backward of each micro-batch, gradient clipping, "
    "optimizer.step)",
    "ours other: step wall time minus the three (group stages, batch assembly)",
    "TRL generate: GRPOTrainer._generate (chat-template tokenisation, padding, model.generate, EOS masking, "
    "decoding, length metrics)",
    "TRL score: GRPOTrainer._calculate_rewards (the same Accuracy term behind TRL's reward signature, gather)",
    "TRL train: on_step_begin -> on_step_end minus generate and score (rest of _generate_and_score_completions: "
    "padding, advantages, metrics, shuffle/split; forward + backward of each micro-batch; clipping; "
    "optimizer.step; scheduler; zero_grad)",
    "TRL other: the transformers loop between steps (log/save checks, fetching the next batch)",
    "tokens: completion tokens of the step including the EOS token (mask up to the first EOS), both sides",
]


# ---- the run --------------------------------------------------------------------------------------

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
    setting = {"prompts_per_step": t.prompts_per_step, "num_generations": t.num_generations,
               "max_new_tokens": t.max_new_tokens, "micro_batch_size": micro, "lr": opt.lr,
               "temperature": cfg.rollout.temperature, "top_k": cfg.rollout.top_k, "top_p": cfg.rollout.top_p,
               "model": cfg.model.name, "model_dir": str(path), "dataset": cfg.dataset.get("name")}
    precision = {"ours": f"fp32 weights, autocast {str(autocast).replace('torch.', '') if autocast else 'off'}, "
                         f"{opt._target_}(fused={opt.get('fused')}), compile={t.compile}"}

    trl = None
    versions = {}
    if b.compare_trl:
        from rlexp import bench_trl
        from rlexp.data.sampler import PromptSampler
        bf16 = (autocast == torch.bfloat16) if b.trl.bf16 is None else bool(b.trl.bf16)
        optim = b.trl.optim or ("adamw_torch_fused" if opt.get("fused") else "adamw_torch")
        trl_compile, trl_cache = bool(b.trl.get("torch_compile", False)), b.trl.get("cache_implementation")
        order = PromptSampler(data.train, t.prompts_per_step, t.seed)  # the order ours draws, step by step
        records = [r for _ in range(total) for r in order.next_batch()]
        term_name, term_cfg = next(iter(cfg.reward.terms.items()))
        trl_loaded = load(cfg.model, path, device)
        config = bench_trl.grpo_config(
            output_dir=str(run_dir / "trl"), device=device, n_rows=n_rows, micro_batch=micro,
            num_generations=t.num_generations, max_new_tokens=t.max_new_tokens, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, lr=opt.lr, betas=list(opt.betas),
            weight_decay=opt.weight_decay, adam_eps=opt.eps, max_grad_norm=t.max_grad_norm,
            eps_low=cfg.algorithm.loss.eps_low, eps_high=cfg.algorithm.loss.eps_high, total_steps=total, seed=t.seed,
            bf16=bf16, gradient_checkpointing=b.trl.gradient_checkpointing, optim=optim,
            scale_rewards=cfg.algorithm.advantage.get("scale", "group"), reward_weight=term_cfg.get("weight", 1.0),
            torch_compile=trl_compile, cache_implementation=trl_cache)
        trl = bench_trl.TRLSide(model=trl_loaded.model, tokenizer=trl_loaded.tokenizer, records=records,
                                prompt_format=prompt_format, reward_term=ours.reward_terms[term_name], config=config,
                                skip_nonfinite_steps=b.trl.get("skip_nonfinite_steps", True))
        probes["trl"] = DtypeProbe(trl_loaded.model)
        precision["trl"] = (f"fp32 weights, bf16={bf16} (accelerate autocast {'bf16' if bf16 else 'off'}), "
                            f"gradient_checkpointing={b.trl.gradient_checkpointing}, optim={optim}, "
                            f"torch_compile={trl_compile}, cache_implementation={trl_cache}")
        versions = bench_trl.versions()

    log.info("bench %s on %s: %d warm-up + %d measured steps each", b.setting, device_name(device), b.warmup_steps,
             b.steps)
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
    if b.get("profile"):   # one more step of ours, unmeasured, under the profiler (rlexp/bench_profile.py)
        from rlexp.bench_profile import profile_step
        Path(b.out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(b.out_dir) / f"{b.setting}-{device_slug(device)}-profile.txt"
        profile = {"file": str(path),
                   "phases": profile_step(lambda: ours.trainer.train_step(total + 1), device, path)}

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
        checks["trl_steps_with_nonfinite_grads_skipped"] = (trl.skipped_steps or "none") if trl.skip_nonfinite_steps \
            else "guard off"
        checks["same_eos_ids"] = (trl.trainer.eos_token_ids ==
                                  _eos_list(ours_loaded.model.generation_config.eos_token_id))
    import transformers
    report = {
        "setting": b.setting, "device_slug": device_slug(device), "command": command,
        "warmup_steps": b.warmup_steps, "measured_steps": b.steps, "order": f"alternate, {b.first} first"
        if trl is not None else "ours only",
        "setting_detail": setting, "precision": precision,
        "summary": summary, "ratio": ratios(summary["ours"], summary["trl"]) if trl is not None else None,
        "steps": rows, "checks": checks, "phase_notes": PHASE_NOTES, "profile": profile,
        "provenance": {
            **git_info(), "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
            "transformers": transformers.__version__, **versions, "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "memory": meter.memory_method, "precision": precision,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    }
    write_report(report, Path(b.out_dir))
    for name, m in summary.items():
        log.info("%-4s median step %.3f s (generate %.3f, score %.3f, train %.3f), %.1f tokens/s, peak %.0f MB",
                 name, m["step_s"], m["generate_s"], m["score_s"], m["train_s"], m["tokens_per_s"], m["peak_mem_mb"])
    if report["ratio"]:
        log.info("TRL / ours: step time %.2f, tokens/s %.2f", report["ratio"]["step_s"], report["ratio"]["tokens_per_s"])
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


def _command() -> str:
    from hydra.core.hydra_config import HydraConfig
    prog = sys.argv[0] if sys.argv and sys.argv[0].startswith("rlexp") else "python3 -m rlexp.bench"
    try:
        o = HydraConfig.get().overrides
        overrides = [*o.task, *(x for x in o.hydra if not x.startswith("hydra.mode="))]
    except ValueError:
        overrides = sys.argv[1:]
    return " ".join([prog, *map(shlex.quote, overrides)])


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="bench")
def main(cfg: DictConfig):
    report = run(cfg, _command())
    return report["ratio"]


if __name__ == "__main__":
    main()
