"""New problems from a dataset's own generator (reasoning-gym): the offline stand-in for problem synthesis
(SwS's weakness-driven synthesis, ``rlexp.samplers.synthesis``). ``generator_tasks`` reads which generators and
options a dataset config uses; ``generate`` draws fresh records from one of them, in the training records' schema."""

from __future__ import annotations

from collections.abc import Mapping

from rlexp.data.reasoning_gym_compat import import_reasoning_gym


def generator_tasks(dataset: Mapping) -> dict[str, dict]:
    """``{task: options}`` of a reasoning-gym dataset config: ``dataset=reasoning_gym`` (``task`` + ``options``, or
    the ``tasks`` mixture) or a one-task entry such as ``dataset=arithmetic_add_sub`` (``name`` + ``options``).
    Any other dataset has no generator: a ``ConfigError`` naming the dataset."""
    from rlexp.config.schema import ConfigError
    from rlexp.data.hub import _container, _mixture

    dataset = _container(dataset) or {}
    target = str(dataset.get("_target_", ""))
    if target.endswith("reasoning_gym_tasks"):
        if dataset.get("tasks"):
            return {task: options for task, _, options in _mixture(dataset["tasks"])}
        if dataset.get("task"):
            return {dataset["task"]: dict(dataset.get("options") or {})}
    if target.endswith("reasoning_gym_task") and dataset.get("name"):
        return {dataset["name"]: dict(dataset.get("options") or {})}
    raise ConfigError(
        f"problem synthesis draws new problems from the dataset's generator, and dataset {dataset.get('name')!r} "
        f"({target or 'no _target_'}) has none: use a reasoning-gym dataset (dataset=reasoning_gym, arithmetic_add_sub)"
    )


def generate(task: str, options: Mapping, n: int, seed: int, prefix: str) -> list[dict]:
    """``n`` fresh records of reasoning-gym ``task`` under ``options`` (seeded), ids ``<prefix>-<i>``."""
    from rlexp.data.sources import reasoning_gym_records

    ds = import_reasoning_gym().create_dataset(task, size=n, seed=seed, **dict(options))
    return reasoning_gym_records(ds, prefix)
