"""Search space: Hydra sweep overrides (and explicit distribution dicts) → Optuna distributions.

The mapping is the one of the upstream ``hydra-optuna-sweeper`` (1.3), expressed with Optuna's
current distribution classes:

=====================================  =========================================================
``choice(a, b, ...)``                  ``CategoricalDistribution([a, b, ...])``
``range(a, b[, step=s])`` (ints)       ``IntDistribution(a, b, step=s)`` — b *included*, as upstream
``range(...)`` with a float bound/step  ``FloatDistribution(a, b, step=s)``
``shuffle(range(...))``                ``CategoricalDistribution(list(range(...)))``
``interval(a, b)``                     ``FloatDistribution(a, b)``
``int(interval(a, b))``                ``IntDistribution(a, b)``
``tag(log, interval(a, b))``           ``FloatDistribution(a, b, log=True)``
``tag(log, int(interval(a, b)))``      ``IntDistribution(a, b, log=True)``
``{type: float|int|categorical, low, high, log, step, choices}``  the distribution it names
anything else (``x=5``)                a fixed value passed to every trial, not searched
=====================================  =========================================================

The grid sampler enumerates each parameter (``grid_points``): ``range(a, b, step)`` gives Hydra's own
range values, ``b`` *excluded* (upstream's grid points whenever ``b - a`` is a whole number of steps);
other discrete distributions give every value from low to high, both included.

Bounds are checked when the space is built, before any trial: an inverted ``interval``/``range``, a log scale
whose lower bound is not positive (int: below 1), a step that is not positive raise one line naming the
parameter and where it was written (``hydra.sweeper.params.<key>`` or the command-line override).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer
from omegaconf import DictConfig, ListConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

PARAMS = "hydra.sweeper.params."


class SearchSpaceError(ValueError):
    """A search-space entry cannot be turned into a distribution; the message names the parameter."""


def _choices(override: Override, name: str) -> list:
    out = []
    for x in override.sweep_iterator(transformer=Transformer.encode):
        if not isinstance(x, (str, int, float, bool)) and x is not None:
            raise SearchSpaceError(f"{name}: a choice must be str, int, float, bool or null, got {type(x).__name__}")
        out.append(x)
    return out


def check_bounds(low: float, high: float, log: bool = False, step: float | None = None, kind: str = "float") -> None:
    """Raise ``SearchSpaceError`` (the reason only; callers prefix the parameter) for bounds Optuna would refuse
    with a message that does not name the parameter."""
    if log and kind == "int" and low < 1:
        raise SearchSpaceError(f"a log scale over integers needs a lower bound >= 1 (got {low})")
    if log and low <= 0:
        raise SearchSpaceError(f"a log scale needs a lower bound > 0 (got {low})")
    if low > high:
        raise SearchSpaceError(f"the lower bound {low} is above the upper bound {high}")
    if step is not None and not step > 0:
        raise SearchSpaceError(f"the step must be > 0 (got {step})")


def _int_distribution(low: int, high: int, log: bool = False, step: int = 1) -> IntDistribution:
    check_bounds(low, high, log, None if log else step, kind="int")
    return IntDistribution(low, high, log=log, step=step)


def _float_distribution(low: float, high: float, log: bool = False, step: float | None = None) -> FloatDistribution:
    check_bounds(low, high, log, step)
    return FloatDistribution(low, high, log=log, step=step)


def _override_value_text(override: Override) -> str:
    line = override.input_line or ""
    return line.split("=", 1)[1] if "=" in line else line


def distribution_from_override(override: Override, where: str = "") -> BaseDistribution | Any:
    """The distribution of one parsed override, or its plain value when it is not a sweep. An invalid one
    raises ``SearchSpaceError`` naming ``<where><key>=<sweep>`` (``where``: ``hydra.sweeper.params.`` for an
    entry of ``params``, empty for the command line)."""
    name = override.get_key_element()
    if not override.is_sweep_override():
        return override.value()
    try:
        return _sweep_distribution(override, name)
    except (SearchSpaceError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if reason.startswith(f"{name}: "):  # _choices already named it
            reason = reason[len(name) + 2 :]
        raise SearchSpaceError(f"{where}{name}={_override_value_text(override)}: {reason}") from None


def _sweep_distribution(override: Override, name: str) -> BaseDistribution:
    value = override.value()
    if override.is_choice_sweep():
        assert isinstance(value, ChoiceSweep)
        return CategoricalDistribution(_choices(override, name))
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        if value.shuffle:
            return CategoricalDistribution(_choices(override, name))
        if any(isinstance(v, float) for v in (value.start, value.stop, value.step)):
            return _float_distribution(float(value.start), float(value.stop), step=float(value.step))
        return _int_distribution(int(value.start), int(value.stop), step=int(value.step))
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return _int_distribution(value.start, value.end, log=log)
        return _float_distribution(float(value.start), float(value.end), log=log)
    raise SearchSpaceError(f"unsupported sweep {override.input_line!r}")


def distribution_from_dict(name: str, spec: Mapping[str, Any]) -> BaseDistribution:
    """An explicit distribution: ``{type: float|int|categorical, low, high, log, step, choices}``."""
    spec = dict(spec)
    kind = str(spec.pop("type", "")).split(".")[-1]
    unknown = set(spec) - {"low", "high", "log", "step", "choices"}
    if unknown:
        raise SearchSpaceError(f"{name}: unknown distribution keys {sorted(unknown)}")
    if kind == "categorical":
        if not spec.get("choices"):
            raise SearchSpaceError(f"{name}: a categorical distribution needs 'choices'")
        return CategoricalDistribution(list(spec["choices"]))
    if kind not in ("int", "float"):
        raise SearchSpaceError(f"{name}: type must be int, float or categorical, got {kind!r}")
    if spec.get("low") is None or spec.get("high") is None:
        raise SearchSpaceError(f"{name}: an {kind} distribution needs 'low' and 'high'")
    log, step = bool(spec.get("log", False)), spec.get("step")
    try:
        if kind == "int":
            if log:
                return _int_distribution(int(spec["low"]), int(spec["high"]), log=True)
            return _int_distribution(int(spec["low"]), int(spec["high"]), step=int(step if step is not None else 1))
        if log:
            return _float_distribution(float(spec["low"]), float(spec["high"]), log=True)
        return _float_distribution(float(spec["low"]), float(spec["high"]), step=None if step is None else float(step))
    except (SearchSpaceError, ValueError, TypeError) as e:
        shown = ", ".join(f"{k}: {v}" for k, v in {"type": kind, **spec}.items())
        raise SearchSpaceError(f"{name}: {{{shown}}}: {str(e).splitlines()[0]}") from None


def params_to_overrides(params: Mapping[str, Any] | None) -> tuple[list[str], dict[str, BaseDistribution]]:
    """Split ``hydra.sweeper.params`` into override strings and explicit (dict) distributions."""
    lines, explicit = [], {}
    for key, value in (params or {}).items():
        if isinstance(value, (DictConfig, dict)):
            explicit[str(key)] = distribution_from_dict(
                f"{PARAMS}{key}", OmegaConf.to_container(value) if isinstance(value, DictConfig) else value
            )
        elif isinstance(value, (ListConfig, list)):
            raise SearchSpaceError(
                f"{PARAMS}{key}: a list is not a search space; "
                "write choice(...) or an explicit {type: categorical, choices: [...]}"
            )
        else:
            lines.append(f"{key}={value}")
    return lines, explicit


def _entries(params: Mapping[str, Any] | None, arguments: list[str]):
    """The explicit distributions of ``params``, then its overrides and the command line's, parsed, each
    with where it was written (``hydra.sweeper.params.`` or the command line: empty)."""
    lines, explicit = params_to_overrides(params)
    overrides = OverridesParser.create().parse_overrides(lines + list(arguments))
    return explicit, [(o, PARAMS if i < len(lines) else "") for i, o in enumerate(overrides)]


def build_search_space(
    params: Mapping[str, Any] | None, arguments: list[str]
) -> tuple[dict[str, BaseDistribution], dict[str, Any]]:
    """(distributions, fixed values) from ``hydra.sweeper.params`` then the command line; a later
    entry for the same key wins (so ``x=3`` on the command line fixes a searched ``x``)."""
    explicit, overrides = _entries(params, arguments)
    space: dict[str, BaseDistribution] = dict(explicit)
    fixed: dict[str, Any] = {}
    for override, where in overrides:
        key = override.get_key_element()
        value = distribution_from_override(override, where)
        space.pop(key, None)
        fixed.pop(key, None)
        if isinstance(value, BaseDistribution):
            space[key] = value
        else:
            fixed[key] = override.get_value_element_as_str()
    return space, fixed


def range_values(params: Mapping[str, Any] | None, arguments: list[str]) -> dict[str, list]:
    """Hydra's values of each searched ``range(...)`` sweep (``b`` excluded), by key, as the basic
    sweeper would run them; keys whose last entry is not a ``range`` are left out."""
    _, overrides = _entries(params, arguments)
    out: dict[str, list] = {}
    for override, _where in overrides:
        key = override.get_key_element()
        out.pop(key, None)
        value = override.value() if override.is_sweep_override() else None
        if isinstance(value, RangeSweep) and not value.shuffle:
            out[key] = list(override.sweep_iterator())
    return out


def grid_values(name: str, dist: BaseDistribution) -> list:
    """Every value of a discrete distribution, low and high included."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution) and not dist.log:
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, FloatDistribution) and dist.step is not None:
        n = int(round((dist.high - dist.low) / dist.step))
        return [round(dist.low + i * dist.step, 12) for i in range(n + 1)]
    raise SearchSpaceError(
        f"{name}: the grid sampler needs a discrete parameter (choice, range, or a step), got {dist}"
    )


def grid_points(space: Mapping[str, BaseDistribution], ranges: Mapping[str, list]) -> dict[str, list]:
    """The grid sampler's search space: a ``range(a, b)`` sweep's own values (``ranges``), else
    ``grid_values``."""
    out = {}
    for name, dist in space.items():
        if name in ranges:
            out[name] = [round(v, 12) if isinstance(v, float) else v for v in ranges[name]]
        else:
            out[name] = grid_values(name, dist)
    return out


def format_value(value: Any) -> str:
    """A sampled value as an override value. Strings are used verbatim: choices arrive already
    escaped for the override grammar (as upstream), so ``choice('a b')`` comes back as ``a\\ b``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)
