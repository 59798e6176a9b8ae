"""The package's layering: imports run with the data flow, never against it.

Every import statement of every module (function-level ones included) is read with ``ast``; a module
of a lower layer that imports a higher one fails the test with the file, line and import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "rlexp"

APPS = ("rlexp.trainer", "rlexp.rollout", "rlexp.commands", "rlexp.runs", "rlexp.cli", "rlexp.bench")
# package -> the packages it must not import
FORBIDDEN = {
    "core": (*APPS, "rlexp.algorithms", "rlexp.rewards", "rlexp.data", "rlexp.samplers", "rlexp.evaluation"),
    "algorithms": APPS,
    "rewards": (*APPS, "rlexp.algorithms", "rlexp.rollout", "rlexp.environments", "rlexp.tools"),
    "data": (*APPS, "rlexp.algorithms", "rlexp.rewards"),
    "samplers": (*APPS, "rlexp.algorithms", "rlexp.rewards"),
    "evaluation": ("rlexp.trainer", "rlexp.commands", "rlexp.runs", "rlexp.cli", "rlexp.bench"),
    "tracking": ("rlexp.trainer", "rlexp.commands", "rlexp.runs", "rlexp.cli", "rlexp.bench"),
    "models": (*APPS, "rlexp.algorithms", "rlexp.rewards"),
    "config": (*APPS, "rlexp.algorithms"),
    "optimizers": (*APPS, "rlexp.algorithms", "rlexp.rewards", "rlexp.data"),
    # running generated code (the sandbox, test suites): below the code reward and the code benchmarks
    "execution": (*APPS, "rlexp.algorithms", "rlexp.rewards", "rlexp.data", "rlexp.samplers", "rlexp.evaluation"),
    # what answers a multi-turn episode's policy: below the multi-turn rollout, above the sandbox
    "tools": (*APPS, "rlexp.algorithms", "rlexp.rewards", "rlexp.data", "rlexp.samplers", "rlexp.evaluation"),
    # (an environment may score a turn with the rewards' verifiers: reasoning-gym tasks as one-turn episodes; the
    # rewards read finished episodes from the record and import neither environments nor rollouts)
    "environments": (*APPS, "rlexp.algorithms", "rlexp.samplers", "rlexp.evaluation"),
}


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def violations(package: str) -> list[str]:
    banned = FORBIDDEN[package]
    found = []
    for path in sorted((PKG / package).rglob("*.py")):
        for line, name in imports(path):
            if any(name == b or name.startswith(b + ".") for b in banned):
                found.append(f"{path.relative_to(PKG.parent)}:{line} imports {name}")
    return sorted(set(found))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_against_the_data_flow(package):
    assert (PKG / package).is_dir()
    assert violations(package) == []


def test_the_walk_sees_function_level_imports(tmp_path, monkeypatch):
    """The check is real: a function-level import of the trainer in a part module is caught."""
    pkg = tmp_path / "rlexp" / "algorithms"
    pkg.mkdir(parents=True)
    (pkg / "part.py").write_text("def f():\n    from rlexp.trainer.loop import Trainer\n    return Trainer\n")
    monkeypatch.setitem(globals(), "PKG", tmp_path / "rlexp")
    assert violations("algorithms") == [
        "rlexp/algorithms/part.py:2 imports rlexp.trainer.loop",
        "rlexp/algorithms/part.py:2 imports rlexp.trainer.loop.Trainer",
    ]
