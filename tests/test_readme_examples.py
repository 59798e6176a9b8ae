"""Every README code block marked ``offline`` runs as written, in order, from a copy of the repository's tracked
files (a fresh clone's layout), with the venv's ``rlexp`` on PATH as the README's set-up leaves it. Only the size
changes: training and evaluation commands get ``model=tiny`` and a few short steps (``SMALL``), merged into
the command's own overrides. Every ``bash`` block carries exactly one tag (``offline``: run here; ``hub``: needs
internet; ``gpu``: needs CUDA; ``setup``: installs or tests, not an example), so none escapes unmarked; a
``python <path>`` block must match that file of the repository."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TAGS = ("offline", "hub", "gpu", "setup")
FENCE = re.compile(r"^```(\w+)[ \t]*([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)

SMALL = {
    "train": {
        "model": "tiny",
        "trainer.max_steps": "2",
        "trainer.prompts_per_step": "2",
        "trainer.num_generations": "2",
        "trainer.max_new_tokens": "8",
        "trainer.micro_batch_size": "4",
        "dataset.train_size": "32",
        "dataset.eval_size": "8",
        "hydra.sweeper.n_trials": "2",
    },
    "eval": {"model": "tiny", "eval.limit": "2", "eval.max_new_tokens": "8"},
}
CAPS = {"eval.size": 2, "trainer.eval_every": 1, "eval.n": 4}  # kept when smaller, else lowered to this


def blocks(lang: str | None = None) -> list[tuple[str, str, str]]:
    """(language, tag line, body) of every fenced block of the README."""
    return [m.groups() for m in FENCE.finditer(README.read_text()) if lang is None or m.group(1) == lang]


def commands(body: str) -> list[list[str]]:
    """The commands of a block: continuation lines joined, comments dropped."""
    lines = body.replace("\\\n", " ").splitlines()
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]  # comment lines: none


def shrink(argv: list[str]) -> list[str]:
    """``argv`` with ``SMALL``'s overrides for its command (replacing the command's own values) and ``CAPS``."""
    if len(argv) < 2 or argv[0] != "rlexp" or argv[1] not in SMALL:
        return argv
    small = dict(SMALL[argv[1]])
    if not any("sweeper" in tok or tok.startswith("+sweep=") for tok in argv):  # an Optuna sweep
        small.pop("hydra.sweeper.n_trials", None)
    out = []
    for tok in argv:
        key, eq, value = tok.partition("=")
        if eq and key in small:
            continue
        if eq and key in CAPS and value.isdigit():
            tok = f"{key}={min(int(value), CAPS[key])}"
        out.append(tok)
    return out + [f"{k}={v}" for k, v in small.items()]


def test_every_bash_block_is_tagged_and_python_blocks_match_their_files():
    for lang, tag, body in blocks():
        if lang == "bash":
            assert tag.split() and tag.split()[0] in TAGS and len(tag.split()) == 1, (
                f"README bash block needs one tag of {TAGS}:\n{body}"
            )
        if lang == "python" and tag.strip():
            assert body.strip() in (REPO / tag.strip()).read_text(), f"README python block differs from {tag}"
    assert any(tag.strip() == "offline" for _, tag, _ in blocks("bash"))


def test_shrink_merges_the_small_overrides():
    argv = shrink(["rlexp", "train", "algorithm=dr_grpo", "trainer.max_steps=100", "eval.size=100"])
    assert argv[:3] == ["rlexp", "train", "algorithm=dr_grpo"] and "trainer.max_steps=2" in argv
    assert "trainer.max_steps=100" not in argv and "eval.size=2" in argv
    assert shrink(["rlexp", "compare", "--runs", "outputs/"]) == ["rlexp", "compare", "--runs", "outputs/"]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The repository's tracked files (what a fresh clone holds), copied."""
    dest = tmp_path_factory.mktemp("clone")
    try:
        files = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, text=True
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for f in filter(None, files):
        src = REPO / f
        if src.is_symlink():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / f)
        elif src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


OFFLINE = [body for lang, tag, body in blocks("bash") if tag.strip() == "offline"]


@pytest.mark.long
@pytest.mark.parametrize("index", range(len(OFFLINE)))
def test_offline_block_runs(clone, index):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    for argv in commands(OFFLINE[index]):
        argv = shrink(argv)
        proc = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"README command failed: {shlex.join(argv)}\n{proc.stderr[-4000:]}"
