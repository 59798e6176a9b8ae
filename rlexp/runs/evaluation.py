"""Evaluation run assembly (``rlexp eval``, ``rlexp.commands.evaluate``; config ``conf/eval.yaml``).

Evaluates the ``model`` group's model — or a training checkpoint (``eval.checkpoint=<run dir>``, its
``checkpoints/last``, or a ``save_pretrained`` model directory, loaded into the ``model`` group's
architecture) — on the selected benchmarks with ``eval.n`` samples per problem, logs
``eval/<benchmark>/<metric>`` to the same trackers as training (at the checkpoint's step), and
writes ``<run dir>/eval/summary.json`` with a per-problem ``<benchmark>.jsonl`` beside it.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlexp.runs.setup import build_trackers, prepare_process, write_provenance
from rlexp.tracking.params import flatten
from rlexp.tracking.provenance import eval_tags, finish_provenance

log = logging.getLogger("rlexp.evaluate")


def resolve_checkpoint(path: str) -> tuple[Path, int | None]:
    """The model directory of a run dir / checkpoint dir / model dir, and the checkpoint's step."""
    p = Path(path)
    for cand in (p / "checkpoints" / "last" / "model", p / "model", p):
        if ((cand / "config.json").exists() or (cand / "adapter_config.json").exists()) and any(
            cand.glob("*.safetensors")
        ):
            meta = cand.parent / "trainer.json"
            step = json.loads(meta.read_text())["step"] if meta.exists() else None
            return cand, step
    raise FileNotFoundError(
        f"eval.checkpoint={path}: no model found (expected <run dir>/checkpoints/last/model, "
        "<checkpoint>/model or a directory with config.json and *.safetensors)"
    )


def load_checkpoint_weights(base_model, model_dir: Path):
    """A copy of ``base_model`` with the weights saved in ``model_dir`` (strict up to tied lm_head)."""
    from safetensors.torch import load_file

    if (model_dir / "adapter_config.json").exists():  # a model/peft=lora run: base + its adapters
        from peft import PeftModel

        return PeftModel.from_pretrained(copy.deepcopy(base_model), str(model_dir)).eval()
    model = copy.deepcopy(base_model)
    state = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f), device=str(next(model.parameters()).device)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(
            f"eval.checkpoint {model_dir} does not match model={model.config.model_type}: "
            f"missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    if missing:
        model.tie_weights()
    return model.eval()


def run_eval(cfg: DictConfig):
    """Build everything from a composed eval config and evaluate. Returns ``EvalResult``. provenance.json ends
    FINISHED, FAILED or KILLED whatever happens; a tracker run exists only once the inputs have loaded, and a
    failed one carries an ``error`` tag and the run's config files."""

    t = cfg.trainer
    if cfg.eval.temperature is None or cfg.eval.temperature <= 0:
        from rlexp.config.schema import ConfigError

        raise ConfigError(f"eval.temperature={cfg.eval.temperature}: must be > 0")
    device = prepare_process(t)
    run_dir = Path(t.run_dir)
    prov = write_provenance(cfg, run_dir)
    status, tracker = "FAILED", None
    try:
        result, step, tracker = _evaluate(cfg, t, device, run_dir, prov)
        status = "FINISHED"
    except BaseException as e:
        tracker = tracker or getattr(e, "tracker", None)
        if isinstance(e, KeyboardInterrupt):
            status = "KILLED"
        elif tracker is not None:  # the failed run says why, with the config it ran
            tracker.set_tags({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:5000]})
        raise
    finally:
        finish_provenance(run_dir, status)
        if tracker is not None:
            for name in ("config.yaml", "overrides.yaml", "provenance.json"):
                if (run_dir / name).exists():
                    tracker.log_artifact(str(run_dir / name))
            tracker.finish(status)
    log.info(
        "eval done (step %d): %s",
        step,
        {k: round(v, 4) for k, v in result.metrics.items() if k.endswith(("/accuracy", "/pass_at_1", "rederive_rate"))},
    )
    return result


def _evaluate(cfg: DictConfig, t, device, run_dir: Path, prov: dict):
    """Build, start the trackers and evaluate: (result, step, tracker). The trackers start only once the
    benchmarks, the model and the checkpoint have loaded, so a bad input leaves no empty tracker run; an error
    after that carries the started tracker (``error.tracker``) for the caller to record it."""
    from rlexp.evaluation.consistency import meter_from_config
    from rlexp.evaluation.runner import BenchmarkEvaluator, build_benchmarks, settings_from_config
    from rlexp.models.loading import load_model

    benchmarks = build_benchmarks(cfg.benchmark)
    settings = settings_from_config(cfg.eval, t.seed)
    meter = meter_from_config(cfg.consistency)
    base = load_model(cfg.model, device)
    policy, step, ckpt_dir = base.model, 0, None
    if cfg.eval.checkpoint:
        ckpt_dir, ckpt_step = resolve_checkpoint(cfg.eval.checkpoint)
        policy = load_checkpoint_weights(base.model, ckpt_dir)
        step = ckpt_step or 0
        log.info("Evaluating checkpoint %s (step %s)", ckpt_dir, ckpt_step)
    if cfg.eval.step is not None:
        step = cfg.eval.step
    if meter is not None and meter.judge == "reference":
        meter.reference_model = base.model  # the base model; the evaluated model itself without a checkpoint
    rollout = instantiate(cfg.rollout)
    evaluator = BenchmarkEvaluator(benchmarks, rollout, settings, meter, progress=t.progress)
    tracker, jsonl = build_trackers(cfg, run_dir)
    container = OmegaConf.to_container(cfg, resolve=True)
    tags = eval_tags(cfg, prov, run_dir, list(benchmarks), ckpt_dir or "")
    tracker.start(cfg.run_name or run_dir.name, container, flatten(container), tags)
    jsonl.start(cfg.run_name or run_dir.name, container, {}, tags)
    try:
        result = evaluator.evaluate(policy, base.tokenizer, step, out_dir=run_dir / "eval")
        tracker.log_metrics(result.metrics, step)
        jsonl.log_metrics(result.metrics, step)
        for f in result.files:
            tracker.log_artifact(str(f), "eval")
    except BaseException as e:
        e.tracker = tracker
        raise
    return result, step, tracker
