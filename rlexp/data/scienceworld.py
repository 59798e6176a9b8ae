"""ScienceWorld's task variations as a dataset (issue 28): one record per variation of a ScienceWorld task
("ScienceWorld: Is your Agent Smarter than a 5th Grader?", Wang et al., EMNLP 2022; the ``scienceworld`` package,
optional extra ``rlexp[agents]``, with Java), played by ``rlexp.environments.scienceworld`` in multi-turn episodes.

Train records come from the task's own train variations, held-out ones from its dev variations (ScienceWorld's
split: different objects, places and goals), each list shuffled by ``seed``. ``simplification``: ScienceWorld's
simplifications (``easy``: teleporting, open doors and containers, no electrical actions, self-watering pots; or a
comma-separated list of them; "" none).

A record::

    {"id": "scienceworld-<task>-<variation>", "question": the task description and the first room,
     "answer": "", "scorer": "scienceworld", "metadata": {"task", "variation", "simplification", "opening_score"
     (the score the first room already gives), "max_score" ((100 - opening_score) / 100: the reward still to earn,
     as the environment pays it), "split", "source_dataset": "scienceworld"}}

Reading a variation's opening loads it in the simulator (~0.5 s, after 2-3 s to start it); the task's variation
lists and the openings read are cached in ``<cache_dir>/scienceworld/<task>-<hash>.json`` (``cache_dir``:
``$RLEXP_CACHE``, default ``~/.cache/rlexp``): a later run with the same choice starts no simulator."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path

from rlexp.data.sources import DatasetSplits

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is cached per variation changes


def cache_file(task: str, simplification: str, cache_dir: str | Path | None = None) -> Path:
    import scienceworld

    if cache_dir is None:
        from rlexp.models.loading import default_cache_dir

        cache_dir = default_cache_dir()
    version = getattr(scienceworld, "__version__", "?")
    key = {"task": task, "simplification": simplification, "scienceworld": version, "v": FORMAT}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / "scienceworld" / f"{task}-{digest}.json"


def task_variations(task: str, simplification: str, seed: int, sizes: tuple[int, int], cache_dir=None):
    """``(train, dev)`` variations of ``task`` (each shuffled by ``seed``, cut at ``sizes``) and ``{variation:
    {description, room, score}}`` of the chosen ones: read from the cache, the simulator started only for what is
    not there (and written back)."""
    from filelock import FileLock

    from rlexp.environments.scienceworld import canonical, restart, start_simulator

    path = cache_file(task, simplification, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        data = json.loads(path.read_text()) if path.exists() else {}
        openings = {int(k): v for k, v in data.get("openings", {}).items()}
        env = None
        try:
            if "train" not in data:
                env = start_simulator()
                tasks = list(env.get_task_names())
                if task not in tasks:
                    raise ValueError(f"dataset.task={task!r} is not a ScienceWorld task: {tasks}")
                try:  # checks the simplification against the task (electrical tasks)
                    env.load(task, 0, simplification)
                except ValueError as e:
                    raise ValueError(f"dataset.simplification={simplification!r} for {task}: {e}") from e
                data["train"], data["dev"] = list(env.get_variations_train()), list(env.get_variations_dev())
            rng = random.Random(seed)
            train, dev = list(data["train"]), list(data["dev"])
            rng.shuffle(train)
            rng.shuffle(dev)
            train, dev = train[: sizes[0]], dev[: sizes[1]]
            missing = [v for v in train + dev if v not in openings]
            if missing:
                log.info("reading %d ScienceWorld %s openings into %s (once)", len(missing), task, path)
                env = env or start_simulator()
                for v in missing:
                    room, score = restart(env, task, v, simplification)
                    openings[v] = {
                        "description": str(env.get_task_description()).strip(),
                        "room": canonical(room),
                        "score": score,
                    }
        finally:
            if env is not None:
                env.close()
        if env is not None:  # something was read: write the cache back
            data["openings"] = {str(k): openings[k] for k in sorted(openings)}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)
    return train, dev, {v: openings[v] for v in train + dev}


def scienceworld_tasks(
    seed: int,
    name: str = "scienceworld",
    task: str = "find-living-thing",
    simplification: str = "easy",
    train_size: int = 64,
    eval_size: int = 16,
    cache_dir: str | None = None,
) -> DatasetSplits:
    """``train_size`` train variations and ``eval_size`` dev variations of ``task`` (see module doc)."""
    if train_size < 1 or eval_size < 1:
        raise ValueError(f"dataset.train_size and dataset.eval_size must be >= 1, got {train_size}, {eval_size}")
    train, dev, openings = task_variations(task, simplification, seed, (train_size, eval_size), cache_dir)
    chosen = {"train": train, "eval": dev}
    splits = {}
    for split, variations in chosen.items():
        splits[split] = [
            {
                "id": f"scienceworld-{task}-{v}",
                "question": f"{openings[v]['description']}\n\n{openings[v]['room']}",
                "answer": "",
                "scorer": "scienceworld",
                "metadata": {
                    "task": task,
                    "variation": v,
                    "simplification": simplification,
                    "opening_score": openings[v]["score"],
                    "max_score": (100 - openings[v]["score"]) / 100.0,
                    "split": "train" if split == "train" else "dev",
                    "source_dataset": "scienceworld",
                },
            }
            for v in variations
        ]
    return DatasetSplits(f"{name}/{task}", splits["train"], splits["eval"])
