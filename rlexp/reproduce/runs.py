"""The runs of an experiment: one per arm × seed in ``<out>/runs/<arm>-s<seed>/``, each composed like ``rlexp train
+experiment=<name> <scale overrides> <arm overrides> <extra overrides> trainer.seed=<seed>`` and identified by its
**config hash**: sha256 of the resolved config (JSON, sorted keys) without the keys in ``DROPPED``, which say where
a run writes or how it reports, not what it trains. A run is

* ``finished`` — its directory's ``config.yaml`` has the same hash and its ``provenance.json`` says FINISHED: not
  repeated;
* ``in tracker`` — no finished directory, but the config's MLflow store holds a FINISHED run tagged with the same
  ``config_hash`` (``rlexp reproduce`` tags every run it launches): not repeated, its metrics read from MLflow (or
  from its run directory, where that still holds it);
* ``resume`` — the directory has the same hash but did not finish (killed, failed): launched again, and the
  trainer resumes it from its checkpoint;
* ``launch`` — nothing yet: launched;
* ``changed`` — the directory holds a run of another config (the spec or the scale changed): refused unless
  ``--replace``, which moves it aside to ``<out>/replaced/<arm>-s<seed>-<its hash>``.

Runs are launched one after another in this process through ``rlexp.runs.training.run`` (the train command's
entry), each with its Hydra config composed as the CLI composes it."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rlexp.reproduce.spec import Scale, Spec

log = logging.getLogger("rlexp.reproduce")

# not part of the config hash: where a run writes and how it reports (never what it trains)
DROPPED = (
    "hydra",
    "reproduce",  # the spec itself (its wording may change without changing a run)
    "pipeline",  # an experiment's stage list (`rlexp pipeline`): each stage's own overrides say what it trains
    "run_name",
    "experiment_name",
    "tracker",  # which dashboards receive the metrics (and their URIs, absolute paths)
    "trial",  # an Optuna sweep's bookkeeping
    "trainer.run_dir",
    "eval.by",  # reporting: the held-out accuracy broken down by distribution, never what is trained
    "trainer.num_threads",  # placement: how many CPU threads, never what is trained
    "distributed",  # placement: data-parallel processes (distributed=ddp), like the thread count
    "trainer.device",
    "trainer.progress",
    "trainer.resume",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoints",
    "trainer.fallback_checkpoint",
    "trainer.save_optimizer",
    "trainer.stop_grace_s",
)
# groups added after runs were recorded: left out of the hash while null, so that the runs before them keep theirs
DROPPED_WHILE_NULL = ("environment", "tools")
HASH_TAG = "config_hash"

FINISHED, IN_TRACKER, RESUME, LAUNCH, CHANGED = "finished", "in tracker", "resume", "launch", "changed"


def hashed_view(container: dict) -> dict:
    """The config without ``DROPPED`` (and ``DROPPED_WHILE_NULL`` where null)."""
    out = copy.deepcopy(container)
    for key in DROPPED_WHILE_NULL:
        if isinstance(out, dict) and key in out and out[key] is None:
            del out[key]
    for key in DROPPED:
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def config_hash(cfg) -> str:
    """16 hex digits of sha256 over the resolved config (a DictConfig or a plain dict) without ``DROPPED``."""
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    text = json.dumps(hashed_view(container), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def saved_hash(run_dir: Path) -> str | None:
    """The hash of a run directory's ``config.yaml`` (None without one)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    return config_hash(OmegaConf.to_container(OmegaConf.load(path), resolve=False))


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """``key: a -> b`` for the hashed keys whose values differ."""
    out = []
    for k in sorted(set(a) | set(b), key=str):
        key = f"{prefix}{k}"
        va, vb = a.get(k, "<absent>"), b.get(k, "<absent>")
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, key + ".")
        elif va != vb:
            out.append(f"{key}: {va!r} -> {vb!r}")
    return out


def run_status(run_dir: Path) -> str | None:
    """``provenance.json``'s status (FINISHED, KILLED, FAILED, RUNNING), None without one."""
    path = Path(run_dir) / "provenance.json"
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None


# ---- composing ----------------------------------------------------------------------------------------------------
def run_overrides(
    spec: Spec, scale: Scale, arm: str, seed: int, extra: list[str] = (), out: Path | None = None
) -> list[str]:
    """The run's train overrides; a staged arm's (its last stage's) end with the links to its earlier stages'
    models in ``stage_dirs`` (``out`` needed)."""
    if arm in spec.staged:
        return list(staged_overrides(spec, scale, arm, seed, extra, out).values())[-1]
    return [f"+experiment={spec.name}", *scale.overrides, *spec.arms[arm], *extra, f"trainer.seed={seed}"]


def staged_overrides(
    spec: Spec, scale: Scale, arm: str, seed: int, extra: list[str] = (), out: Path | None = None
) -> dict[str, list[str]]:
    """A staged arm's train overrides, stage by stage: the experiment, the scale's, the stage's own, the extra ones,
    the seed, then the links to its parents' directories (``stage_dirs``)."""
    from rlexp.runs.pipeline import stage_overrides

    if out is None:
        raise ValueError(f"{spec.name}: arm {arm} is staged; its runs' overrides need the output folder")
    p = spec.staged[arm]
    dirs = stage_dirs(spec, arm, seed, out)
    tail = [*extra, f"trainer.seed={seed}"]
    return {st.name: stage_overrides(p, st, out, tail, scale.overrides, dirs) for st in p.stages}


def stage_dirs(spec: Spec, arm: str, seed: int, out: Path) -> dict[str, Path]:
    """A staged arm's run directories: its earlier stages in ``<out>/stages/<arm>-s<seed>/<stage>``, its last stage
    (the run the table reads) in ``<out>/runs/<arm>-s<seed>``."""
    stages = spec.staged[arm].stages
    dirs = {s.name: Path(out) / "stages" / f"{arm}-s{seed}" / s.name for s in stages[:-1]}
    dirs[stages[-1].name] = Path(out) / "runs" / f"{arm}-s{seed}"
    return dirs


def compose_run(overrides: list[str], run_dir: Path, cwd: str | None = None) -> DictConfig:
    """The train config ``rlexp train <overrides> hydra.run.dir=<run_dir>`` runs, hydra-free, with the Hydra
    runtime (output dir, cwd, overrides) set as the CLI sets it, so that ``${hydra:...}`` resolves and the
    provenance records the overrides. The spec node is set to null (training ignores it; the hash drops it)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from rlexp.config.paths import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    OmegaConf.set_readonly(cfg.hydra, False)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(Path(run_dir).resolve())
        cfg.hydra.runtime.cwd = cwd or os.getcwd()
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.trainer.run_dir = str(run_dir)
        cfg.reproduce = None
        del cfg["hydra"]
    return cfg


# ---- planning -----------------------------------------------------------------------------------------------------
@dataclass
class PlannedRun:
    arm: str
    seed: int
    overrides: list[str]
    run_dir: Path
    config_hash: str
    status: str
    detail: str = ""
    tracker_run: dict | None = None  # IN_TRACKER: {"tracking_uri", "run_id", "run_dir"}
    diff: list[str] = field(default_factory=list)  # CHANGED: how the directory's config differs

    @property
    def name(self) -> str:
        return f"{self.arm}-s{self.seed}"

    @property
    def to_launch(self) -> bool:
        return self.status in (LAUNCH, RESUME, CHANGED)


def plan_runs(
    spec: Spec, scale: Scale, out: Path, extra: list[str] = (), tracker_lookup: bool = True
) -> list[PlannedRun]:
    """Every arm × seed of the spec at a scale, with what exists of it already."""
    plans = []
    for arm in spec.arms:
        for seed in spec.seeds:
            overrides = run_overrides(spec, scale, arm, seed, extra, out)
            run_dir = Path(out) / "runs" / f"{arm}-s{seed}"
            cfg = compose_run(overrides, run_dir)
            h = config_hash(cfg)
            plan = _status(PlannedRun(arm, seed, overrides, run_dir, h, LAUNCH), cfg, tracker_lookup)
            if arm in spec.staged and plan.to_launch:
                before = [
                    f"{n} {run_status(d) or 'not started'}"
                    for n, d in list(stage_dirs(spec, arm, seed, out).items())[:-1]
                ]
                plan.detail = (plan.detail + " " if plan.detail else "") + f"(after stages: {', '.join(before)})"
            plans.append(plan)
    return plans


def _status(p: PlannedRun, cfg: DictConfig, tracker_lookup: bool) -> PlannedRun:
    old = saved_hash(p.run_dir)
    if old is not None and old != p.config_hash:
        p.status, p.detail = CHANGED, f"{p.run_dir} holds a run of another config (hash {old})"
        mine = hashed_view(OmegaConf.to_container(cfg, resolve=True))
        theirs = hashed_view(OmegaConf.to_container(OmegaConf.load(p.run_dir / "config.yaml"), resolve=False))
        p.diff = config_diff(theirs, mine)
        return p
    if old is not None:
        status = run_status(p.run_dir)
        if status == "FINISHED":
            p.status, p.detail = FINISHED, f"{p.run_dir} (FINISHED)"
        else:
            p.status, p.detail = RESUME, f"{p.run_dir} ({status or 'no provenance'}): resumed"
        return p
    if tracker_lookup:
        found = find_in_tracker(cfg, p.config_hash)
        if found is not None:
            p.status, p.tracker_run = IN_TRACKER, found
            p.detail = f"MLflow run {found['run_id']} at {found['tracking_uri']}"
    return p


def find_in_tracker(cfg: DictConfig, h: str) -> dict | None:
    """A FINISHED MLflow run tagged ``config_hash=<h>`` in the config's MLflow store (a file store that does not
    exist yet is not created; W&B is not searched). Its run directory is used when it is still here with the same
    hash."""
    backends = (cfg.get("tracker") or {}).get("backends") or {}
    mlflow_cfg = backends.get("mlflow") if hasattr(backends, "get") else None
    if mlflow_cfg is None:
        return None
    uri = str(mlflow_cfg.get("tracking_uri"))
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        return None
    if "://" not in uri and not Path(uri).exists():
        return None
    try:
        from mlflow import MlflowClient
        from mlflow.entities import ViewType

        if uri.startswith(("http://", "https://")):
            from rlexp.tracking.mlflow_tracker import bound_http_waits

            bound_http_waits()
        client = MlflowClient(tracking_uri=uri)
        ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
        if not ids:
            return None
        runs = client.search_runs(
            ids,
            filter_string=f"tags.`{HASH_TAG}` = '{h}' and attributes.status = 'FINISHED'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
    except Exception as e:  # an unreachable server: launch rather than fail the plan
        log.warning("could not search the MLflow store %s for finished runs: %r", uri, e)
        return None
    if not runs:
        return None
    run = runs[0]
    run_dir = run.data.tags.get("run_dir")
    here = run_dir if run_dir and saved_hash(Path(run_dir)) == h and run_status(Path(run_dir)) == "FINISHED" else None
    return {"tracking_uri": uri, "run_id": run.info.run_id, "run_dir": here}


# ---- launching ----------------------------------------------------------------------------------------------------
class ReproduceTags:
    """A trainer callback that tags the run's tracker runs with its experiment, arm and config hash (what
    ``find_in_tracker`` searches)."""

    def __init__(self, experiment: str, arm: str, scale: str, h: str):
        self.tags = {HASH_TAG: h, "reproduce.experiment": experiment, "reproduce.arm": arm, "reproduce.scale": scale}

    def bind(self, trainer) -> None:
        trainer.tags.update(self.tags)

    def on_step_end(self, step, metrics, eval_metrics) -> bool:
        return False


def move_aside(p: PlannedRun, out: Path) -> Path:
    """``--replace``: a directory of another config goes to ``<out>/replaced/<arm>-s<seed>-<its hash>``."""
    dest = Path(out) / "replaced" / f"{p.name}-{saved_hash(p.run_dir)}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.move(str(p.run_dir), str(dest))
    return dest


def launch(
    p: PlannedRun, spec: Spec, scale: Scale, extra: list[str] = (), out: Path | None = None, replace: bool = False
) -> None:
    """Train one run (composed again, so that the Hydra runtime is this run's); its log goes to
    ``<run dir>/train.log`` too. A staged arm's run goes through ``rlexp.runs.pipeline.run_pipeline``: its earlier
    stages first (a finished one of the same config is not run again), each linked to its parent in the tracker."""
    from rlexp.runs.training import run

    if p.arm in spec.staged:
        from rlexp.runs.pipeline import run_pipeline

        dirs = stage_dirs(spec, p.arm, p.seed, out)
        tags = ReproduceTags(spec.name, p.arm, scale.name, p.config_hash).tags
        root = Path(out) / "stages" / p.name
        run_pipeline(spec.staged[p.arm], root, [*extra, f"trainer.seed={p.seed}"], replace, scale.overrides, dirs, tags)
        return
    cfg = compose_run(p.overrides, p.run_dir)
    h = config_hash(cfg)
    if h != p.config_hash:  # the config tree changed under the plan
        raise RuntimeError(f"{p.name}: config hash {h} differs from the planned {p.config_hash}")
    p.run_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(p.run_dir / "train.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root, ours = logging.getLogger(), logging.getLogger("rlexp")
    level = ours.level
    root.addHandler(handler)
    if ours.getEffectiveLevel() > logging.INFO:  # the run's INFO lines reach its train.log, as under `rlexp train`
        ours.setLevel(logging.INFO)
    try:
        run(cfg, callbacks=[ReproduceTags(spec.name, p.arm, scale.name, h)])
    finally:
        ours.setLevel(level)
        root.removeHandler(handler)
        handler.close()
