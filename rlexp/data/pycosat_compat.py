"""pycosat's API (``itersolve``, ``solve``) on PySAT's MiniSat 2.2 (``python-sat``, manylinux wheels).

Why: reasoning-gym 0.1.25 requires pycosat 0.6.6 (picosat bindings), and PyPI has no pycosat wheel for any version,
so installing it compiles C. reasoning-gym calls pycosat in one place only, its zebra-puzzle generator
(``reasoning_gym/logic/contrib/logic_puzzle/sat_utils.py``: ``pycosat.itersolve(numbered_cnf)``), but
``import reasoning_gym`` loads that generator, so every task needs the module. rlexp installs reasoning-gym with
``--no-deps`` and this module stands in as ``pycosat`` when the real one is not importable
(``rlexp.data.reasoning_gym_compat``).

The semantics match pycosat's where reasoning-gym depends on them: a model lists every variable ``1..n`` (``n`` the
largest variable in the clauses or ``vars``, whichever is larger), signed by its value; ``itersolve`` yields every
model once, blocking each one before the next solve, and stops at UNSAT; ``solve`` returns a model, ``"UNSAT"`` or
``"UNKNOWN"`` (``prop_limit`` reached). The ORDER in which models come differs from picosat's. The zebra generator
does not depend on it: it asks whether a first and a second model exist (uniqueness) and, once the puzzle is unique,
compares the one model with the planted solution (tests/data/test_pycosat_compat.py generates the same puzzles with
both). ``prop_limit`` is MiniSat's propagation budget, per solve call; ``verbose`` is accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pysat.solvers import Solver

__version__ = "0.6.6"  # the pycosat API this module implements (pycosat.__version__ of reasoning-gym's pin)
RLEXP_ADAPTER = True  # tells this module apart from the real pycosat (sys.modules["pycosat"])
SOLVER = "m22"  # MiniSat 2.2: supports the propagation budget behind prop_limit


def _solver(clauses: Iterable[Iterable[int]], vars: int) -> Solver:
    # PySAT checks the literals as pycosat does (ValueError "non-zero integer expected", TypeError "integer expected")
    solver = Solver(name=SOLVER, bootstrap_with=clauses)
    n = int(vars)
    if n > max(solver.nof_vars(), 0):  # (nof_vars is -1 before any clause)
        solver.add_clause([n, -n])  # a tautology: declares the variables up to n, constrains nothing
    return solver


def _next_model(solver: Solver, prop_limit: int) -> list[int] | str:
    if prop_limit > 0:
        solver.prop_budget(int(prop_limit))
        result = solver.solve_limited()
    else:
        result = solver.solve()
    if result is None:
        return "UNKNOWN"
    if not result:
        return "UNSAT"
    return list(solver.get_model() or [])


def solve(clauses: Iterable[Iterable[int]], vars: int = 0, verbose: int = 0, prop_limit: int = 0) -> list[int] | str:
    """One model of ``clauses`` (every variable ``1..n``, signed), or ``"UNSAT"``, or ``"UNKNOWN"``."""
    with _solver(clauses, vars) as solver:
        return _next_model(solver, prop_limit)


def itersolve(clauses: Iterable[Iterable[int]], vars: int = 0, verbose: int = 0, prop_limit: int = 0) -> Iterator:
    """Every model of ``clauses``, each once (order: MiniSat's, not picosat's)."""
    with _solver(clauses, vars) as solver:
        while isinstance(model := _next_model(solver, prop_limit), list):
            yield model
            if not model:  # no variables: the one (empty) model, as pycosat gives it
                return
            solver.add_clause([-lit for lit in model])
