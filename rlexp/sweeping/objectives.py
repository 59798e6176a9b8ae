"""Objectives named by metric: which numbers of a job's returned metrics a trial is scored on."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_AT_K = re.compile(r"\b(pass|maj|cons)@(\d+)\b")


def metric_key(name: str) -> str:
    """The logged (MLflow-safe) spelling of a metric name: ``pass@1`` → ``pass_at_1``."""
    return _AT_K.sub(r"\1_at_\2", str(name).strip())


def as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def lookup(metrics: Mapping[str, Any], name: str) -> float | None:
    """``metrics[name]`` under either spelling, as a float; None when absent."""
    for key in (name, metric_key(name)):
        if key in metrics and metrics[key] is not None:
            return float(metrics[key])
    return None


def missing_metric_message(name: str, metrics: Mapping[str, Any], key: str = "hydra.sweeper.objective") -> str:
    close = difflib.get_close_matches(metric_key(name), [str(k) for k in metrics], n=5, cutoff=0.4)
    hint = f"; close matches: {close}" if close else f"; the job returned {sorted(metrics)[:40]}"
    return f"{key}: metric {name!r} is not among the job's returned metrics{hint}"


def _floats(returned: Any, n_directions: int) -> list[float]:
    """Upstream's reading of a returned value: one direction, ``float(value)``; several, a sequence of
    float-castable values."""
    if n_directions == 1 and (isinstance(returned, str) or not isinstance(returned, Sequence)):
        try:
            return [float(returned)]
        except (TypeError, ValueError) as e:
            raise ValueError(f"the job returned {returned!r}: expected a float (one direction)") from e
    if isinstance(returned, str) or not isinstance(returned, Sequence):
        raise ValueError(f"the job returned {returned!r}: expected a list of {n_directions} floats (one per direction)")
    try:
        return [float(v) for v in returned]
    except (TypeError, ValueError) as e:
        raise ValueError(f"the job returned {returned!r}: not a list of numbers") from e


def objective_values(returned: Any, objectives: Sequence[str], n_directions: int) -> list[float]:
    """The trial's values from what the job returned: a metrics dict (read by ``objectives``), or,
    as with the upstream plugin, a float or a sequence of floats."""
    if isinstance(returned, Mapping):
        if not objectives:
            raise ValueError(
                "the job returned a dict of metrics but hydra.sweeper.objective is null: name the metric(s) "
                f"to optimise, one per direction; the job returned {sorted(map(str, returned))[:40]}"
            )
        values = []
        for name in objectives:
            v = lookup(returned, name)
            if v is None:
                raise ValueError(missing_metric_message(name, returned))
            values.append(v)
    else:
        values = _floats(returned, n_directions)
    if len(values) != n_directions:
        raise ValueError(
            f"{len(values)} objective value(s) for {n_directions} hydra.sweeper.direction(s): the job must "
            "return one value per direction"
        )
    for name, v in zip(objectives or ["value"] * len(values), values):
        if not math.isfinite(v):
            raise ValueError(f"objective {name!r} is {v} (not finite)")
    return values
