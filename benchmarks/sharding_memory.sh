#!/usr/bin/env bash
# Peak resident memory per process of two training steps on the default model (SmolLM2-135M-Instruct, default task
# and settings: 8 prompts x 8 completions; one thread per process, no evaluation, no checkpoint) with 2 CPU processes
# (torchrun, gloo), one arm per distributed= entry: ddp (replicated: full weights, gradients and AdamW state on each
# process), fsdp (FSDP2: parameters, gradients and AdamW state sharded, parameters gathered for the rollout phase),
# deepspeed_zero2 (gradients and AdamW state partitioned), deepspeed_zero3 (weights too; gathered for the rollout phase).
# Shared-prompt forwards off in all (the sharded ones run one forward per micro-batch). GNU time's "Maximum resident
# set size" of each rank.
#   bash benchmarks/sharding_memory.sh [out_dir] [arm ...]      (arms default: ddp fsdp)
#   EXTRA="model/peft=lora" bash benchmarks/sharding_memory.sh ...  (more overrides for every arm, space-separated)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/sharding_memory}
shift || true
ARMS=("$@")
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
[ ${#ARMS[@]} -eq 0 ] && ARMS=(ddp fsdp)
mkdir -p "$OUT"
for arm in "${ARMS[@]}"; do
  OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 --no-python bash -c \
    '/usr/bin/time -v -o "$0/$1-rank$LOCAL_RANK.time" .venv/bin/python -m rlexp.cli train "${@:2}"' "$OUT" "$arm" \
    distributed="$arm" trainer.share_prompt_forward=false trainer.max_steps=2 trainer.eval_at_start=false \
    trainer.eval_every=0 trainer.num_threads=1 trainer.checkpoint_every=0 trainer.progress=false tracker=none \
    run_name="mem-$arm" hydra.run.dir="$OUT/$arm" "${EXTRA_ARGS[@]}" > "$OUT/$arm.log" 2>&1
  rss=$(for r in 0 1; do grep "Maximum resident set size" "$OUT/$arm-rank$r.time" | awk '{printf "%d ", $NF/1024}'; done)
  step=$(python3 -c "import json;r=[json.loads(l) for l in open('$OUT/$arm/metrics.jsonl')];print(round(sum(x['time/step_s'] for x in r if 'time/step_s' in x)/2,1))")
  echo "$arm ${EXTRA:-} peak_rss_mb_per_rank=[ $rss] step_s=$step load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.txt"
done
