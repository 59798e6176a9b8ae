"""Training data in difficulty levels, for the level-by-level curriculum (``sampler=curriculum``,
``rlexp.samplers.curriculum``): every record carries its level (``metadata.curriculum_level``: 0 the easiest) and
the held-out split holds every level (``eval.by=curriculum_level``: accuracy per level).

``levels`` is the list of levels, easiest first. A level is one source or a mixture of sources; a source is

  - ``{task: <reasoning-gym task>, level: i}``: the task at level ``i`` of reasoning-gym's own curriculum for it
    (``reasoning_gym.create_curriculum(task)``, every attribute set to level ``i``, its ranges read in
    ``range_mode``: ``upper_bound`` — the level's own band, e.g. mini_sudoku's 6–8 empty cells at level 1 — or
    ``inclusive`` — every band up to it);
  - ``{task: <reasoning-gym task>, options: {...}}``: the task under explicit options (``level`` and ``options``
    together: the curriculum's options with these on top);
  - ``{task: sat, options: {n, k, l}}``: SATURN's SAT problems (``rlexp.data.sat``);

``{tasks: [source, source, …]}`` is a level mixing sources (``weight`` per source, 1 by default), and ``{task: t,
levels: [0, 1, 2]}`` stands for one level per listed curriculum level of ``t``. Each level gets ``train_size``
training and ``eval_size`` held-out records (seeded; no question in both splits or in two levels); the held-out
records are interleaved level by level, so the first ``eval.size`` of them span the levels."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlexp.data.reasoning_gym_compat import import_reasoning_gym
from rlexp.data.sources import DatasetSplits

LEVEL_KEY = "curriculum_level"
RANGE_MODES = ("upper_bound", "inclusive")


def _config_error(message: str):
    from rlexp.config.schema import ConfigError

    return ConfigError(message)


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _source(spec: Mapping, where: str) -> dict:
    spec = dict(spec)
    unknown = sorted(set(spec) - {"task", "level", "options", "weight"})
    if unknown or "task" not in spec:
        raise _config_error(
            f"{where}={spec}: a source is {{task, level}} (a reasoning-gym curriculum level), {{task, options}} or "
            f"both, with an optional weight" + (f"; unknown keys: {unknown}" if unknown else "; no task")
        )
    weight = float(spec.get("weight", 1.0))
    if weight <= 0:
        raise _config_error(f"{where}.weight={weight} must be > 0")
    if spec["task"] == "sat" and spec.get("level") is not None:
        raise _config_error(f"{where}: the sat task takes options {{n, k, l}}, not a curriculum level")
    if spec["task"] != "sat" and spec.get("level") is None and spec.get("options") is None:
        raise _config_error(f"{where}={spec}: give the task's curriculum level (level: 0) or its options")
    return {
        "task": str(spec["task"]),
        "level": spec.get("level"),
        "options": dict(spec.get("options") or {}),
        "weight": weight,
    }


def expand_levels(levels: Any) -> list[list[dict]]:
    """The levels as lists of sources (``_source``: task, level, options, weight), easiest first."""
    levels = _plain(levels)
    if not isinstance(levels, list) or not levels:
        raise _config_error("dataset.levels: a non-empty list of levels, easiest first (rlexp/data/curriculum.py)")
    out: list[list[dict]] = []
    for i, level in enumerate(levels):
        where = f"dataset.levels[{i}]"
        if not isinstance(level, Mapping):
            raise _config_error(f"{where}={level!r} is not a mapping ({{task, level}}, {{task, options}}, {{tasks}})")
        level = dict(level)
        if "tasks" in level:
            if set(level) != {"tasks"} or not isinstance(level["tasks"], list) or not level["tasks"]:
                raise _config_error(f"{where}: a mixture level is {{tasks: [source, ...]}} and nothing else")
            out.append([_source(s, f"{where}.tasks[{j}]") for j, s in enumerate(level["tasks"])])
        elif "levels" in level:
            steps = level.pop("levels")
            if not isinstance(steps, list) or not steps:
                raise _config_error(f"{where}.levels={steps!r}: a list of the task's curriculum levels, e.g. [0, 1]")
            out.extend([_source({**level, "level": s}, f"{where}.levels[{j}]")] for j, s in enumerate(steps))
        else:
            out.append([_source(level, where)])
    return out


def curriculum_options(task: str, level: int, range_mode: str = "upper_bound") -> dict:
    """The options of reasoning-gym ``task`` at ``level`` of its curriculum (every attribute at that level, clamped
    at the attribute's last one)."""
    rg = import_reasoning_gym()
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if range_mode not in RANGE_MODES:
        raise _config_error(f"dataset.range_mode={range_mode!r} is not one of {list(RANGE_MODES)}")
    if task not in rg.factory.DATASETS:
        raise _config_error(f"dataset.levels: {task!r} is not a reasoning-gym task (or sat)")
    if not has_curriculum(task):
        raise _config_error(f"dataset.levels: reasoning-gym has no curriculum for {task!r}; give its options instead")
    curriculum = create_curriculum(task)
    top = max(len(a.levels) for a in curriculum.attributes.values()) - 1
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= top:
        raise _config_error(f"dataset.levels: {task} level={level!r}; its curriculum has levels 0..{top}")
    curriculum.set_global_level(level)
    mode = RangeAttributeMode.UPPER_BOUND if range_mode == "upper_bound" else RangeAttributeMode.INCLUSIVE
    config = curriculum.generate_configuration({"seed": 0, "size": 1}, DefaultCurriculumContext(mode=mode))
    options = dataclasses.asdict(config)
    for key in ("seed", "size"):
        options.pop(key, None)
    return options


def _generate(source: dict, size: int, seed: int, prefix: str, range_mode: str) -> list[dict]:
    if source["task"] == "sat":
        from rlexp.data.sat import generate

        return generate(source["options"], size, seed, prefix)
    from rlexp.data.sources import reasoning_gym_records

    rg = import_reasoning_gym()
    options = {}
    if source["level"] is not None:
        options = curriculum_options(source["task"], source["level"], range_mode)
    options.update(source["options"])
    try:
        ds = rg.create_dataset(source["task"], size=size, seed=seed, **options)
    except Exception as e:  # an unknown task or a bad option: name it
        raise _config_error(f"dataset.levels: {source['task']} with options {options}: {e}") from e
    return reasoning_gym_records(ds, prefix)


def _shares(total: int, weights: list[float]) -> list[int]:
    """``total`` split over the weights (largest remainders, ties to the earlier source)."""
    exact = [total * w / sum(weights) for w in weights]
    out = [int(x) for x in exact]
    for j in sorted(range(len(exact)), key=lambda j: (-(exact[j] - out[j]), j))[: total - sum(out)]:
        out[j] += 1
    return out


def curriculum_levels(
    seed: int,
    levels: Any,
    name: str = "curriculum",
    train_size: int = 200,
    eval_size: int = 20,
    range_mode: str = "upper_bound",
) -> DatasetSplits:
    """Records level by level (``metadata.curriculum_level``, ``metadata.curriculum_task``); ``train_size`` and
    ``eval_size`` are per level."""
    import random

    if train_size < 1 or eval_size < 0:
        raise _config_error(f"dataset.train_size={train_size} / eval_size={eval_size}: per level, ≥ 1 and ≥ 0")
    if range_mode not in RANGE_MODES:
        raise _config_error(f"dataset.range_mode={range_mode!r} is not one of {list(RANGE_MODES)}")
    expanded = expand_levels(levels)
    seen: set[str] = set()
    train: list[dict] = []
    evals: list[list[dict]] = []
    for lvl, sources in enumerate(expanded):
        want = _shares(train_size + eval_size, [s["weight"] for s in sources])
        records: list[dict] = []
        for j, (source, n) in enumerate(zip(sources, want)):
            if n == 0:
                continue
            label = source["task"] if source["level"] is None else f"{source['task']}@{source['level']}"
            sub_seed = (seed * 1_000_003 + lvl * 7_919 + j * 104_729) % (2**31)
            twice = sum(s["task"] == source["task"] for s in sources) > 1  # ids stay unique within the level
            prefix = f"L{lvl}-{source['task']}{j if twice else ''}"
            made = _generate(source, int(n * 1.2) + 10, sub_seed, prefix, range_mode)
            fresh = []
            for r in made:
                if r["question"] in seen:  # a question in an earlier level or source: not again
                    continue
                seen.add(r["question"])
                r["metadata"] = {**r["metadata"], LEVEL_KEY: lvl, "curriculum_task": label}
                fresh.append(r)
            records.extend(fresh[:n])
        random.Random(seed * 31 + lvl).shuffle(records)
        if eval_size >= len(records):
            raise _config_error(
                f"dataset.levels[{lvl}]: eval_size={eval_size} leaves no training data ({len(records)} unique "
                "records at this level; its generator repeats itself: lower eval_size or vary the level's options)"
            )
        evals.append(records[:eval_size])
        train.extend(records[eval_size : eval_size + train_size])
    held_out = [part[i] for i in range(max(map(len, evals), default=0)) for part in evals if i < len(part)]
    return DatasetSplits(f"{name}/levels({len(expanded)})", train, held_out)
