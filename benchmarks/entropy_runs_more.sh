#!/usr/bin/env bash
# The entropy methods added after benchmarks/entropy_runs.sh — EAD, HAPO, ROVER, AEPO and VERL — at the same settings (the
# default task, seed 0, 18 steps, held-out accuracy at steps 0, 9 and 18) into the same results folder, so
# `rlexp compare` puts them beside that script's GRPO arm. Two arms at a time, one thread each.
#   bash benchmarks/entropy_runs_more.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-results/entropy/smollm2/runs}
COMMON=(trainer.max_steps=18 trainer.eval_every=9 trainer.num_threads=1 trainer.checkpoint_every=0 tracker=none)
export MALLOC_ARENA_MAX=2
mkdir -p "$DEST"
source benchmarks/arms.sh
arm ead algorithm=ead  # ran beside the last consistency arms (benchmarks/consistency_runs.sh)
arm hapo algorithm=hapo &
# ROVER ran beside HAPO (after EAD)
arm rover algorithm=rover
wait
arm aepo algorithm=aepo &
arm verl_rank algorithm=verl_rank &
wait
