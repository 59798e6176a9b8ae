#!/usr/bin/env bash
# Issue 20 §4: what the one-step-off-policy rollout (trainer.async_rollout, +experiment=one_step_off_policy) buys on
# this CPU. SmolLM2-135M-Instruct (the default `rlexp train`, offline GGUF), same seed and steps, both threads of
# the 2-core machine (trainer.num_threads=2), arms one after the other under `nice -n 19`; held-out evaluation off
# (trainer.eval_at_start=false eval.size=0) so that only training steps are timed. `uptime` is logged beside each
# arm (load.txt): the machine is shared, so the timings are under its load.
#   bash benchmarks/async_rollout.sh [steps]        ARMS="sync async" by default; also async_sampler
#   TABLE_ONLY=1 bash benchmarks/async_rollout.sh   the table of the arms already run (runs/<arm>/metrics.jsonl)
# arms: sync = the default run; async = +experiment=one_step_off_policy (old log-probs recomputed by the learner,
# the paper's choice: one more no-grad forward than sync); async_sampler = the same with
# trainer.recompute_old_logprobs=false (the sampler's log-probs as the old ones: no recompute forward).
# PYTHONPATH: the console script would otherwise import the rlexp its virtualenv was installed from; SRC=<dir>
# runs a frozen copy of the package (every arm then runs the same code while the tree changes).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6}
OUT=${OUT:-/tmp/async_rollout_bench}
DEST=${DEST:-results/trainer/async_rollout_smollm2}
ARMS=(${ARMS:-sync async})
mkdir -p "$OUT" "$DEST/runs"
if [[ -z ${TABLE_ONLY:-} ]]; then
  for arm in "${ARMS[@]}"; do
    case $arm in
      sync) extra=() ;;
      async) extra=(+experiment=one_step_off_policy) ;;
      async_sampler) extra=(+experiment=one_step_off_policy trainer.recompute_old_logprobs=false) ;;
      *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
    echo "$arm start $(date -u +%FT%TZ) $(uptime)" | tee -a "$DEST/load.txt"
    PYTHONPATH="${SRC:-$PWD}" nice -n 19 .venv/bin/rlexp train "${extra[@]}" trainer.max_steps="$STEPS" \
      trainer.num_threads=2 trainer.eval_at_start=false eval.size=0 trainer.checkpoint_every=0 \
      trainer.progress=false tracker=none run_name="async-bench-$arm" hydra.run.dir="$OUT/$arm" > "$OUT/$arm.log" 2>&1
    echo "$arm end   $(date -u +%FT%TZ) $(uptime)" | tee -a "$DEST/load.txt"
    mkdir -p "$DEST/runs/$arm"
    cp "$OUT/$arm/metrics.jsonl" "$OUT/$arm/config.yaml" "$DEST/runs/$arm/"
  done
fi
.venv/bin/python - "$DEST" "${ARMS[@]}" <<'PY'
import json, statistics, sys
dest, arms = sys.argv[1], sys.argv[2:]
cols = ["time/step_s", "throughput/completion_tokens_per_s", "time/generate_s", "time/train_s",
        "time/rollout_wait_s", "time/rollout_overlap_s",
        "async/version_lag", "length/mean", "reward/mean", "mismatch/kl"]
lines = ["| arm | steps | " + " | ".join(f"median {c}" for c in cols) + " |", "|---" * (len(cols) + 2) + "|"]
for arm in arms:
    rows = [json.loads(l) for l in open(f"{dest}/runs/{arm}/metrics.jsonl") if l.strip()]
    rows = [r for r in rows if r.get("step", 0) >= 1]
    cell = lambda c: f"{statistics.median(r[c] for r in rows):.4g}" if all(c in r for r in rows) else "–"
    lines.append(f"| {arm} | {len(rows)} | " + " | ".join(cell(c) for c in cols) + " |")
    lines.append(f"| {arm} per step | | " + " | ".join(
        "/".join(f"{r[c]:.3g}" for r in rows) if all(c in r for r in rows) else "–" for c in cols) + " |")
open(f"{dest}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
