"""pycosat's API on PySAT (rlexp/data/pycosat_compat.py), the stand-in reasoning-gym gets where pycosat (no wheel on
PyPI) is not installed: every model of small formulas against the truth table, by hand and at random, UNSAT, the
``vars`` argument, the empty formula, ``prop_limit``, pycosat's errors; and the same answers as the real pycosat
where it is installed."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import random

import pytest

from rlexp.data import pycosat_compat as adapter


def brute_force(cnf: list[list[int]], n: int) -> set[tuple[int, ...]]:
    """Every model over variables 1..n, as pycosat writes one: (±1, ±2, ..., ±n)."""
    models = set()
    for values in itertools.product([False, True], repeat=n):
        if all(any(values[abs(lit) - 1] == (lit > 0) for lit in clause) for clause in cnf):
            models.add(tuple(v if values[v - 1] else -v for v in range(1, n + 1)))
    return models


def random_cnf(rng: random.Random, n: int, m: int, k: int = 3) -> list[list[int]]:
    return [[rng.choice([-1, 1]) * v for v in rng.sample(range(1, n + 1), k)] for _ in range(m)]


def php(n: int) -> list[list[int]]:
    """The pigeonhole formula: n + 1 pigeons in n holes, UNSAT and hard for resolution."""
    v = lambda i, j: i * n + j + 1
    cnf = [[v(i, j) for j in range(n)] for i in range(n + 1)]
    return cnf + [[-v(i, j), -v(k, j)] for j in range(n) for i, k in itertools.combinations(range(n + 1), 2)]


def test_every_model_of_a_3_variable_formula_once():
    # (x1 ∨ ¬x2) ∧ (x2 ∨ x3), by hand over the 8 rows: 000 ✗ (x2 ∨ x3), 001 ✓, 010 ✗ (x1 ∨ ¬x2), 011 ✗, 100 ✗,
    # 101 ✓, 110 ✓, 111 ✓
    cnf = [[1, -2], [2, 3]]
    models = list(adapter.itersolve(cnf))
    assert len(models) == 4
    assert {tuple(m) for m in models} == {(-1, -2, 3), (1, -2, 3), (1, 2, -3), (1, 2, 3)} == brute_force(cnf, 3)
    assert tuple(adapter.solve(cnf)) in brute_force(cnf, 3)


def test_random_formulas_against_the_truth_table():
    rng = random.Random(0)
    sat = unsat = 0
    for m in [2, 5, 10, 15, 20, 25, 30, 40, 60] * 4:  # 5 variables: from many models to none
        cnf = random_cnf(rng, 5, m)
        n = max(abs(lit) for clause in cnf for lit in clause)
        truth = brute_force(cnf, n)
        models = [tuple(model) for model in adapter.itersolve(cnf)]
        assert len(models) == len(set(models)) and set(models) == truth
        one = adapter.solve(cnf)
        assert (one == "UNSAT") if not truth else (tuple(one) in truth)
        sat, unsat = sat + bool(truth), unsat + (not truth)
    assert sat >= 5 and unsat >= 5  # both kinds were drawn


def test_unsat():
    for cnf in ([[1], [-1]], [[1, 2], [-1, 2], [1, -2], [-1, -2]], php(4)):
        assert adapter.solve(cnf) == "UNSAT"
        assert list(adapter.itersolve(cnf)) == []


def test_vars_declares_variables_beyond_the_clauses():
    # x1 over 3 variables: x2, x3 free -> 4 models, each of length 3
    assert sorted(map(tuple, adapter.itersolve([[1]], vars=3))) == [(1, -2, -3), (1, -2, 3), (1, 2, -3), (1, 2, 3)]
    assert len(adapter.solve([[1]], vars=3)) == 3 and adapter.solve([[1]], vars=3)[0] == 1
    # a variable between two used ones (x2 in [[1], [3]]) is enumerated too, as pycosat does
    assert sorted(map(tuple, adapter.itersolve([[1], [3]]))) == [(1, -2, 3), (1, 2, 3)]
    assert len(list(adapter.itersolve([], vars=2))) == 4
    assert len(list(adapter.itersolve([[1, 2]], vars=1))) == 3  # vars below the clauses' largest: the clauses win


def test_the_empty_formula_has_one_empty_model():
    assert adapter.solve([]) == []
    assert list(adapter.itersolve([])) == [[]]


def test_prop_limit_gives_unknown():
    assert adapter.solve(php(7)) == "UNSAT"
    assert adapter.solve(php(7), prop_limit=100) == "UNKNOWN"
    assert list(adapter.itersolve(php(7), prop_limit=100)) == []
    assert adapter.solve([[1, 2]], prop_limit=100) in ([1, 2], [1, -2], [-1, 2])


def test_bad_literals_are_refused_as_pycosat_refuses_them():
    with pytest.raises(ValueError, match="non-zero integer expected"):
        adapter.solve([[1, 0, 2]])
    with pytest.raises(TypeError, match="integer expected"):
        adapter.solve([["a"]])


def real_pycosat():
    """The installed pycosat, loaded from its file (``sys.modules["pycosat"]`` may hold the stand-in by now)."""
    spec = importlib.machinery.PathFinder.find_spec("pycosat")
    if spec is None:
        pytest.skip(
            "pycosat is not installed (no wheel on PyPI: the README set-up leaves it out); this parity check needs "
            "the real one"
        )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not hasattr(module, "RLEXP_ADAPTER")
    return module


def test_the_same_answers_as_the_real_pycosat():
    pycosat = real_pycosat()
    rng = random.Random(1)
    for m in [3, 8, 12, 18, 22, 26, 30] * 5:
        cnf = random_cnf(rng, 6, m)
        ours, theirs = list(adapter.itersolve(cnf)), list(pycosat.itersolve(cnf))
        assert sorted(ours) == sorted(theirs)  # the same models; their order differs between the solvers
        assert (adapter.solve(cnf) == "UNSAT") == (pycosat.solve(cnf) == "UNSAT")
    for args in [([],), ([[1]], 3), ([], 2), ([[1], [3]],)]:
        assert sorted(adapter.itersolve(*args)) == sorted(pycosat.itersolve(*args))
    assert adapter.solve([]) == pycosat.solve([]) == []
    assert adapter.solve(php(7), prop_limit=100) == pycosat.solve(php(7), prop_limit=100) == "UNKNOWN"
