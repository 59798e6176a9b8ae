#!/usr/bin/env bash
# Issue 20, acceptance 4: SmolLM2 on the default task, same seed and steps, every arm with 4 optimiser steps
# per rollout (trainer.steps_per_rollout=4): GRPO against the ratio methods. Two arms at a time, one thread
# each (2-core machine); run directories under $OUT (checkpoints stay there), metrics copied to results/.
#   bash benchmarks/offpolicy_compare.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-30}
OUT=${OUT:-/tmp/offpolicy}
DEST=results/algorithms/offpolicy_smollm2
ARMS=(${ARMS:-grpo dapo gspo cispo bapo m2po topr})
mkdir -p "$OUT" "$DEST/runs"
run_arm() {
  local m=$1
  .venv/bin/rlexp train algorithm="$m" trainer.steps_per_rollout=4 trainer.max_steps="$STEPS" trainer.num_threads=1 \
    trainer.checkpoint_every=0 trainer.progress=false tracker=none run_name="$m-k4" hydra.run.dir="$OUT/$m" \
    > "$OUT/$m.log" 2>&1
  mkdir -p "$DEST/runs/$m"
  cp "$OUT/$m/metrics.jsonl" "$OUT/$m/config.yaml" "$OUT/$m/provenance.json" "$DEST/runs/$m/"
}
for ((i = 0; i < ${#ARMS[@]}; i += 2)); do
  run_arm "${ARMS[$i]}" &
  if ((i + 1 < ${#ARMS[@]})); then run_arm "${ARMS[$((i + 1))]}" & fi
  wait
done
.venv/bin/rlexp compare --runs "$DEST/runs" --group-by algorithm --last 10 --name offpolicy_k4 --out "$DEST" \
  --metrics 'accuracy,reward/mean,clip/low_frac,clip/high_frac,clip/region_frac,ratio/max,ratio/min,entropy/mean,length/mean,mismatch/kl,topr/tapered_frac,m2po/masked_frac,time/step_s'
