#!/usr/bin/env bash
# Issue 24's SmolLM2 comparison: GRPO vs SPO vs P3O online, and DPO on pairs built from SmolLM2's own rollouts of the
# same 192 prompts (dataset.train_size=192: the online arms see each once over 24 steps of 8 prompts; DPO's pairs come
# from 8 completions of each, at most 2 sampled pairs per prompt (correct beats wrong, shorter beats longer among correct),
# 24 steps of 8 pairs, 4 pairs per forward: 16 pairs per forward took 10 GB and the OOM killer). Held-out: 100
# questions, greedy, at steps 0, 12 and 24. Two arms at a time, one thread each.
set -u
cd "$(dirname "$0")/.."
source benchmarks/arms.sh
DEST=${DEST:-results/preference/smollm2/runs}
mkdir -p "$DEST"
export MALLOC_ARENA_MAX=2
COMMON=(trainer.max_steps=24 trainer.eval_every=12 dataset.train_size=192 trainer.checkpoint_every=0 tracker=none
  trainer.num_threads=1 eval.size=100)
arm grpo algorithm=grpo &
arm spo_minimax algorithm=spo_minimax &
wait
arm p3o algorithm=p3o &
arm dpo algorithm=dpo dataset.num_prompts=192 dataset.mode=sampled dataset.pairs_per_group=2 trainer.prompts_per_step=8 trainer.micro_batch_size=8 &
wait
