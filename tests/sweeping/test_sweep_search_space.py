"""The search-space syntax of the upstream hydra-optuna-sweeper (its docs' examples and its test table)
gives the same Optuna distributions here, written with Optuna's current classes."""

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from optuna.distributions import CategoricalDistribution as Cat
from optuna.distributions import FloatDistribution as Float
from optuna.distributions import IntDistribution as Int

from rlexp.sweeping.search_space import (
    SearchSpaceError,
    build_search_space,
    distribution_from_dict,
    distribution_from_override,
    format_value,
    grid_points,
    grid_values,
    range_values,
)


def parse(line: str):
    return distribution_from_override(OverridesParser.create().parse_overrides([line])[0])


def same(expected, actual) -> None:
    if isinstance(expected, Cat):  # shuffle() randomises the order of the choices
        assert isinstance(actual, Cat) and set(expected.choices) == set(actual.choices)
    else:
        assert actual == expected, (actual, expected)


UPSTREAM_TABLE = [  # upstream tests/test_optuna_sweeper_plugin.py, test_create_optuna_distribution_from_override
    ("key=choice(1,2)", Cat([1, 2])),
    ("key=choice(true, false)", Cat([True, False])),
    ("key=choice('hello', 'world')", Cat(["hello", "world"])),
    ("key=shuffle(range(1,3))", Cat((1, 2))),
    ("key=range(1,3)", Int(1, 3)),
    ("key=interval(1, 5)", Float(1, 5)),
    ("key=int(interval(1, 5))", Int(1, 5)),
    ("key=tag(log, interval(1, 5))", Float(1, 5, log=True)),
    ("key=tag(log, int(interval(1, 5)))", Int(1, 5, log=True)),
    ("key=range(0.5, 5.5, step=1)", Float(0.5, 5.5, step=1)),
]

UPSTREAM_DOCS = [  # website/docs/plugins/optuna_sweeper.md (Hydra 1.3): sphere, multi-objective, custom examples
    ("x=range(-5.5,5.5,step=0.5)", Float(-5.5, 5.5, step=0.5)),
    ("y=choice(-5,0,5)", Cat([-5, 0, 5])),
    ("x=interval(-5.0, 5.0)", Float(-5.0, 5.0)),
    ("y=interval(0, 10)", Float(0, 10)),
    ("x=int(interval(-5.0, 5.0))", Int(-5, 5)),
    ("y=tag(log, interval(1, 10))", Float(1, 10, log=True)),
    ("x=range(-5.0, 5.0)", Float(-5.0, 5.0, step=1.0)),
    ("y=shuffle(range(-5, 5))", Cat(list(range(-5, 5)))),
    ("x=choice(-5.0, 0.0, 5.0)", Cat([-5.0, 0.0, 5.0])),
    ("y=choice(0, 1, 2, 3, 4, 5)", Cat([0, 1, 2, 3, 4, 5])),
    ("x=range(0, 5, step=0.5)", Float(0, 5, step=0.5)),
    ("y=range(0, 3, step=0.5)", Float(0, 3, step=0.5)),
    ("x=range(-5.5, 5.5, 0.5)", Float(-5.5, 5.5, step=0.5)),
]


@pytest.mark.parametrize("line,expected", UPSTREAM_TABLE + UPSTREAM_DOCS)
def test_upstream_override_syntax_gives_upstream_distributions(line, expected):
    same(expected, parse(line))


UPSTREAM_CONFIG_TABLE = [  # upstream test_create_optuna_distribution_from_config (type/low/high/log/step/choices)
    ({"type": "categorical", "choices": [1, 2, 3]}, Cat([1, 2, 3])),
    ({"type": "int", "low": 0, "high": 10}, Int(0, 10)),
    ({"type": "int", "low": 0, "high": 10, "step": 2}, Int(0, 10, step=2)),
    ({"type": "int", "low": 0, "high": 5}, Int(0, 5)),
    ({"type": "int", "low": 1, "high": 100, "log": True}, Int(1, 100, log=True)),
    ({"type": "float", "low": 0, "high": 1}, Float(0, 1)),
    ({"type": "float", "low": 0, "high": 10, "step": 2}, Float(0, 10, step=2)),
    ({"type": "float", "low": 1, "high": 100, "log": True}, Float(1, 100, log=True)),
]


@pytest.mark.parametrize("spec,expected", UPSTREAM_CONFIG_TABLE)
def test_explicit_distribution_dicts(spec, expected):
    same(expected, distribution_from_dict("key", spec))


def test_params_and_command_line_split_into_space_and_fixed():
    # upstream test_create_params_from_overrides, plus an explicit dict and a command-line override winning
    space, fixed = build_search_space(
        {"key1": "choice(1,2)", "lr": {"type": "float", "low": 1e-6, "high": 1e-4, "log": True}, "key3": "range(1,3)"},
        ["key2=5", "key3=7"],
    )
    assert space == {"key1": Cat([1, 2]), "lr": Float(1e-6, 1e-4, log=True)}
    assert fixed == {"key2": "5", "key3": "7"}
    space, fixed = build_search_space(None, ["+w=interval(0, 1)", "~z"])
    assert space == {"+w": Float(0, 1)} and "~z" in fixed


@pytest.mark.parametrize(
    "spec,needle",
    [
        ({"type": "float", "low": 1}, "needs 'low' and 'high'"),
        ({"type": "gaussian", "low": 0, "high": 1}, "type must be"),
        ({"type": "categorical"}, "needs 'choices'"),
        ({"type": "int", "low": 0, "high": 3, "mean": 1}, "unknown distribution keys"),
    ],
)
def test_bad_explicit_distributions_name_the_parameter(spec, needle):
    with pytest.raises(SearchSpaceError, match=needle) as e:
        distribution_from_dict("optimizer.lr", spec)
    assert "optimizer.lr" in str(e.value)


def test_a_list_is_not_a_search_space():
    with pytest.raises(SearchSpaceError, match="hydra.sweeper.params.x"):
        build_search_space({"x": [1, 2]}, [])


def test_grid_values_enumerate_discrete_distributions_inclusively():
    assert grid_values("a", Cat(["x", "y"])) == ["x", "y"]
    assert grid_values("b", Int(2, 8, step=2)) == [2, 4, 6, 8]
    assert grid_values("c", Float(0.0, 1.0, step=0.25)) == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(SearchSpaceError, match="d: the grid sampler needs a discrete"):
        grid_values("d", Float(0, 1))


@pytest.mark.filterwarnings("ignore:The distribution is specified by")  # Optuna rounds range(0, 5, step=2) to 0..4
def test_grid_points_of_a_range_exclude_its_stop_as_upstream():
    params = {"y": "range(-1.0, 1.0, step=1)", "n": "int(interval(1, 3))", "s": "range(0, 5, step=2)"}
    args = ["f=range(0, 1, 0.1)", "k=range(1, 4)", "k=choice(7, 8)"]  # a later k wins: not a range any more
    space, _ = build_search_space(params, args)
    grid = grid_points(space, range_values(params, args))
    assert grid["y"] == [-1.0, 0.0]  # upstream's test_grid: the grid holds 2 x 2 x 2 = 8 points
    assert grid["s"] == [0, 2, 4]  # Hydra's range (upstream: [0, 2], Optuna rounds 5 down to 4 first)
    assert grid["f"] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert grid["n"] == [1, 2, 3]  # an interval is closed (upstream: [1, 2])
    assert grid["k"] == [7, 8]


def test_sampled_values_round_trip_through_the_override_parser():
    parser = OverridesParser.create()
    for value in (1e-05, 0.1, 3, True, None, "adamw", -2.5):
        parsed = parser.parse_overrides([f"k={format_value(value)}"])[0].value()
        assert parsed == value and type(parsed) is type(value)
    # a string choice with a space arrives escaped (as upstream) and parses back to itself
    choice = parse("k=choice('a b', c)").choices[0]
    assert parser.parse_overrides([f"k={format_value(choice)}"])[0].value() == "a b"


@pytest.mark.parametrize(
    "params,arguments,message",
    [
        (
            None,
            ["optimizer.lr=tag(log, interval(0, 1e-4))"],
            "optimizer.lr=tag(log, interval(0, 1e-4)): a log scale needs a lower bound > 0 (got 0.0)",
        ),
        (
            {"optimizer.lr": "tag(log, interval(-1e-5, 1e-4))"},
            [],
            "hydra.sweeper.params.optimizer.lr=tag(log, interval(-1e-5, 1e-4)): a log scale needs a lower bound > 0 "
            "(got -1e-05)",
        ),
        (
            {"algorithm.loss.eps_low": "interval(0.3, 0.1)"},
            [],
            "hydra.sweeper.params.algorithm.loss.eps_low=interval(0.3, 0.1): the lower bound 0.3 is above the upper "
            "bound 0.1",
        ),
        (
            None,
            ["trainer.max_new_tokens=tag(log, int(interval(0, 64)))"],
            "trainer.max_new_tokens=tag(log, int(interval(0, 64))): a log scale over integers needs a lower bound >= 1 "
            "(got 0)",
        ),
        (
            None,
            ["trainer.num_generations=int(interval(8, 2))"],
            "trainer.num_generations=int(interval(8, 2)): the lower bound 8 is above the upper bound 2",
        ),
        (None, ["x=range(5, 1)"], "x=range(5, 1): the lower bound 5 is above the upper bound 1"),
        (
            {"optimizer.lr": {"type": "float", "low": 0, "high": 1e-4, "log": True}},
            [],
            "hydra.sweeper.params.optimizer.lr: {type: float, low: 0, high: 0.0001, log: True}: a log scale needs a "
            "lower bound > 0 (got 0.0)",
        ),
        (
            {"k": {"type": "int", "low": 9, "high": 1}},
            [],
            "hydra.sweeper.params.k: {type: int, low: 9, high: 1}: the lower bound 9 is above the upper bound 1",
        ),
    ],
)
def test_bad_bounds_are_one_line_naming_the_parameter(params, arguments, message):
    """Issue 16: Optuna's own error for these names no parameter; here the line names it and where it was written
    (an entry of hydra.sweeper.params, or the command-line override as typed)."""
    with pytest.raises(SearchSpaceError) as e:
        build_search_space(params, arguments)
    assert str(e.value) == message
