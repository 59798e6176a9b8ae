#!/usr/bin/env bash
# Replay methods on SmolLM2 (issue 20 §4): RePO and ReMix against GRPO on the same 48-prompt split, 18 steps, seed 0,
# held-out accuracy at steps 0, 9 and 18. 48 prompts at 8 a step is three epochs in 18 steps, so RePO (replay from a
# prompt's third visit) replays in steps 13-18, as the paper's third epoch; ReMix reincarnates at step 9, half-way.
# Two arms at a time, one thread each; the runs' metrics, configs and summaries go to results/replay/.
#   bash benchmarks/replay_runs.sh            # grpo + repo, then remix
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-results/replay/smollm2/runs}
COMMON=(dataset.train_size=48 trainer.max_steps=18 trainer.eval_every=9 trainer.num_threads=1 trainer.checkpoint_every=0
  tracker=none)
mkdir -p "$DEST"
source benchmarks/arms.sh
arm grpo algorithm=grpo &
arm repo +experiment=repo &
wait
arm remix algorithm=remix algorithm.reincarnate_at=9
