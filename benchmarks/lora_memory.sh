#!/usr/bin/env bash
# Peak resident memory of two training steps on the default model (SmolLM2-135M-Instruct, default task and
# settings, one thread, no evaluation, no checkpoint), full fine-tuning against model/peft=lora (rank 16, the
# attention and MLP projections): GNU time's "Maximum resident set size" of the whole `rlexp train` process.
#   bash benchmarks/lora_memory.sh [out_dir]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/lora_memory}
mkdir -p "$OUT"
for arm in full lora; do
  extra=()
  [[ $arm == lora ]] && extra=(model/peft=lora)
  /usr/bin/time -v .venv/bin/rlexp train "${extra[@]}" trainer.max_steps=2 trainer.eval_at_start=false \
    trainer.eval_every=0 trainer.num_threads=1 trainer.checkpoint_every=0 trainer.progress=false tracker=none \
    run_name="mem-$arm" hydra.run.dir="$OUT/$arm" > "$OUT/$arm.log" 2>&1
  kb=$(grep "Maximum resident set size" "$OUT/$arm.log" | awk '{print $NF}')
  step=$(python3 -c "import json;r=[json.loads(l) for l in open('$OUT/$arm/metrics.jsonl')];print(round(sum(x['time/step_s'] for x in r if 'time/step_s' in x)/2,1))")
  echo "$arm peak_rss_mb=$((kb / 1024)) step_s=$step load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.txt"
done
