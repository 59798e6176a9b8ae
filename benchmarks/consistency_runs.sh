#!/usr/bin/env bash
# Consistency methods on SmolLM2 (issue 22, acceptance 3): GRPO, GRPO-CARE, ACRE and TTRL from the same seed on the
# multiple-choice view of the default task (view=multiple_choice: lettered options; the answer a letter or the option's
# content) with the default hash prompt (SmolLM2-135M states "#### <answer>" under it; under the tag prompt it rarely
# closes an <answer> tag, so nothing could be measured) and 64 new tokens, 12 steps; per step the three consistency
# rates (re-derivation, likelihood, option shuffle) on the first 32 completions, judged by the frozen initial model.
# Two arms at a time, one thread each.
# Runs go to results/consistency/smollm2/runs/.
#   bash benchmarks/consistency_runs.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-results/consistency/smollm2/runs}
COMMON=(view=multiple_choice prompt=hash trainer.max_new_tokens=64 trainer.max_steps=12 trainer.eval_every=12
  trainer.num_threads=1 trainer.checkpoint_every=0 tracker=none trainer.micro_batch_size=16
  consistency.enabled=true consistency.shuffle=true consistency.max_completions=32 consistency.max_new_tokens=16)
export MALLOC_ARENA_MAX=2
mkdir -p "$DEST"
source benchmarks/arms.sh
arm grpo algorithm=grpo &
arm acre algorithm=acre &
wait
arm grpo_care algorithm=grpo_care &
arm ttrl algorithm=grpo reward=majority_vote &
wait
