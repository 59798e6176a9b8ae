#!/usr/bin/env bash
# Run several `rlexp train` jobs side by side on one GPU (a 135M model leaves the GPU mostly idle per
# process), each bounded by a wall-clock limit; copy each run's metrics.jsonl to $OUT.
# usage: parallel_runs.sh <limit_seconds> "<name>|<overrides>" ...
set -u
source benchmarks/device/env.sh >/dev/null
limit=$1; shift
mkdir -p "$OUT/runs" /tmp/runs
for spec in "$@"; do
  name=${spec%%|*}; args=${spec#*|}
  ( timeout "$limit" python3 -m rlexp train tracker=none trainer.progress=false model.gguf_path=$HOME/smol.gguf \
      hydra.run.dir=/tmp/runs/$name $args > /tmp/runs/$name.log 2>&1 ; echo "$name rc=$?" ) &
done
wait
for spec in "$@"; do
  name=${spec%%|*}
  cp /tmp/runs/$name/metrics.jsonl "$OUT/runs/$name.jsonl" 2>/dev/null || { echo "== $name failed"; tail -20 /tmp/runs/$name.log; }
done
