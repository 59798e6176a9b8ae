#!/bin/bash
# Issue 29, acceptance 3: each method whose training changed, before (OLD_TREE, a checkout of the commit before the
# fixes, run with its own code) and after (this tree), same seed and steps, side by side on SmolLM2 (CPU, 1 thread
# per arm, the two arms of a method at once). A run past LIMIT seconds is stopped; its logged steps stay.
#   OLD_TREE=/tmp/old29 STEPS=8 LIMIT=900 bash benchmarks/faithfulness_rerun.sh gpg clip_cov ...
set -u
NEW_TREE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$NEW_TREE/results/algorithms/faithfulness_29}
STEPS=${STEPS:-8}
LIMIT=${LIMIT:-900}
PY=${PY:-$NEW_TREE/.venv/bin/python}
mkdir -p "$OUT/runs"
common="trainer.max_steps=$STEPS trainer.num_threads=1 trainer.checkpoint_every=0 trainer.keep_checkpoints=0 tracker=none trainer.seed=0"
for m in "$@"; do
  (cd "$OLD_TREE" && timeout "$LIMIT" "$PY" -m rlexp train algorithm=$m $common run_name=$m-old \
     hydra.run.dir="$OUT/runs/$m-old" > "$OUT/runs/$m-old.log" 2>&1) &
  (cd "$NEW_TREE" && timeout "$LIMIT" "$PY" -m rlexp train algorithm=$m $common run_name=$m-new \
     hydra.run.dir="$OUT/runs/$m-new" > "$OUT/runs/$m-new.log" 2>&1) &
  wait
  echo "$(date +%T) $m done"
done
