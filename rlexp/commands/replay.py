"""``rlexp replay <run_dir>``: upload the metrics a tracking server missed (``rlexp.tracking.replay``)."""

from __future__ import annotations

import argparse
import sys

from rlexp.tracking import replay as replay_module

USAGE = "rlexp replay RUN_DIR [--tracking-uri URI] [--experiment NAME] [--dry-run]"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="rlexp replay", description=(replay_module.__doc__ or "").split("\n\n")[0], usage=USAGE
    )
    p.add_argument("run_dir", help="a run directory (holds metrics.jsonl, config.yaml, tracker_ids.json)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the one in the run's config.yaml)")
    p.add_argument("--experiment", help="MLflow experiment for a run that is created (default: the run's)")
    p.add_argument("--dry-run", action="store_true", help="only report what would be uploaded")
    a = p.parse_args(argv)
    out = replay_module.replay(a.run_dir, a.tracking_uri, a.experiment, a.dry_run)
    steps = out["steps"]
    span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
    verb = "would upload" if a.dry_run else "uploaded"
    print(
        f"{a.run_dir}: {verb} {out['uploaded']} metric values ({span}) to MLflow run {out['run_id']} at "
        f"{out['tracking_uri']}{' (created)' if out['created'] else ''}; {out['present']} were already there"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
