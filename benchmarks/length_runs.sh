#!/usr/bin/env bash
# Length methods on SmolLM2 (issue 21, acceptance 3b): GRPO, HBPO, e1 and GRPO-λ from the same seed on the default task
# with room to reason — the tag prompt (<think>…</think><answer>…</answer>) and 128 new tokens — 12 steps, held-out
# accuracy and length at steps 0 and 12. Two arms at a time, one thread each, micro-batches of 16 completions (the
# same gradient as 32, half the activation memory: two arms at 32 held 10-12 GB each; results/length/smollm2's grpo
# and hbpo ran at 32, e1 and grpo_lambda at 16). Runs go to results/length/smollm2/runs/.
#   bash benchmarks/length_runs.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-results/length/smollm2/runs}
COMMON=(prompt=tag trainer.max_new_tokens=128 trainer.max_steps=12 trainer.eval_every=12 trainer.num_threads=1
  trainer.checkpoint_every=0 tracker=none trainer.micro_batch_size=16)
export MALLOC_ARENA_MAX=2
mkdir -p "$DEST"
source benchmarks/arms.sh
arm grpo algorithm=grpo &
arm hbpo algorithm=hbpo &
wait
arm e1_effort algorithm=e1_effort &
arm grpo_lambda algorithm=grpo_lambda &
wait
