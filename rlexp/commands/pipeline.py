"""``rlexp pipeline <experiment>``: train an experiment's stages in order (SFT → RL, RL → re-distillation), each a
run of its own in ``<out>/<stage>`` starting from the model the stage before saved, the child run tagged with its
parent's; a stage that finished before is not run again (``rlexp.runs.pipeline``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

EPILOG = """examples:
  rlexp pipeline sft_then_grpo --dry-run           # the stages, their overrides and what is already done
  rlexp pipeline sft_then_grpo                     # into outputs/pipelines/sft_then_grpo/{sft,grpo}
  rlexp pipeline grpo_then_redistill model=tiny trainer.max_steps=2 --out /tmp/redistill

Extra train overrides after the experiment go to every stage."""


def main(argv: list[str] | None = None) -> dict:
    from rlexp.runs.pipeline import PipelineError, load_pipeline, pipeline_names, stage_overrides

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="rlexp pipeline",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    p.add_argument("experiment", nargs="?", help="an experiment file with a pipeline: node (conf/experiment/)")
    p.add_argument("overrides", nargs="*", help="train overrides added to every stage (key=value)")
    p.add_argument("--out", help="output folder (default outputs/pipelines/<experiment>); stage runs in <out>/<stage>")
    p.add_argument("--dry-run", action="store_true", help="print the stages and what exists of them; run nothing")
    p.add_argument(
        "--replace",
        action="store_true",
        help="move a stage directory holding another run aside (<out>/replaced/) instead of refusing",
    )
    a = p.parse_intermixed_args(argv)
    if not a.experiment:
        raise PipelineError(f"name an experiment: one of {', '.join(pipeline_names())}")
    for o in a.overrides:
        if "=" not in o:
            raise PipelineError(f"{o!r} is not a train override key=value (extra overrides follow the experiment)")
    spec = load_pipeline(a.experiment)
    out = Path(a.out or Path("outputs") / "pipelines" / spec.name).resolve()
    print(f"pipeline {spec.name}: {len(spec.stages)} stages in {out}")
    for stage in spec.stages:
        print(f"  {stage.name:<12} rlexp train {' '.join(stage_overrides(spec, stage, out, a.overrides))}")
    if a.dry_run:
        from rlexp.reproduce.runs import config_hash, run_status, saved_hash
        from rlexp.runs.pipeline import compose_stage

        for stage in spec.stages:
            run_dir = out / stage.name
            status = run_status(run_dir) or "not started"
            old = saved_hash(run_dir)
            if old is not None and old != config_hash(
                compose_stage(stage_overrides(spec, stage, out, a.overrides), run_dir)
            ):
                status += " (a run of another config: refused without --replace)"
            print(f"  {stage.name:<12} {status}")
        print("dry run: nothing run, nothing written")
        return {"pipeline": spec, "out": out}
    _logging()
    from rlexp.runs.pipeline import run_pipeline

    results = run_pipeline(spec, out, a.overrides, replace=a.replace)
    for r in results:
        print(f"  {r.name:<12} {r.status:<8} {r.run_dir}  model: {r.model}")
    return {"pipeline": spec, "out": out, "results": results}


def _logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")


if __name__ == "__main__":
    main()
