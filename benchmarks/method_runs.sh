#!/usr/bin/env bash
# SmolLM2 learning runs of methods on the default task (arithmetic_add_sub), each at its own config's schedule
# (its algorithm.steps_per_rollout / num_iterations), seed 0, 18 steps with the held-out greedy evaluation
# (100 prompts) at steps 0 and 18: the same seed, task and evaluation points as results/learning/default_task,
# whose step-18 evaluation is GRPO's reference. Two arms at a time, one thread each (2-core machine); each arm's
# metrics, config and summary are copied to $DEST/runs/<arm> as soon as it ends, so a cut-short batch keeps
# what finished. An arm may carry overrides after a colon: "grpo:trainer.steps_per_rollout=4".
#   ARMS="grpo:trainer.steps_per_rollout=4 luspo dppo_tv" bash benchmarks/method_runs.sh [steps=18]
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-18}
OUT=${OUT:-/tmp/method_runs}
DEST=${DEST:-results/algorithms/method_runs_smollm2}
read -r -a ARMS <<< "${ARMS:?set ARMS}"
mkdir -p "$OUT" "$DEST/runs"
run_arm() {
  local spec=$1 m=${1%%:*} extra=() name
  [[ $spec == *:* ]] && read -r -a extra <<< "${spec#*:}"
  name=$m$( ((${#extra[@]})) && echo "-k4" )
  local start=$(date +%s)
  .venv/bin/rlexp train algorithm="$m" "${extra[@]}" trainer.max_steps="$STEPS" trainer.eval_every="$STEPS" \
    trainer.num_threads=1 trainer.checkpoint_every=0 trainer.progress=false tracker=none run_name="$name" \
    hydra.run.dir="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - start ))s load: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/done.txt"
  mkdir -p "$DEST/runs/$name"
  cp "$OUT/$name"/{metrics.jsonl,config.yaml,summary.md,provenance.json} "$DEST/runs/$name/" 2>/dev/null
}
for ((i = 0; i < ${#ARMS[@]}; i += 2)); do
  run_arm "${ARMS[$i]}" &
  if ((i + 1 < ${#ARMS[@]})); then run_arm "${ARMS[$((i + 1))]}" & fi
  wait
done
