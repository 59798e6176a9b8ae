#!/usr/bin/env bash
# Entropy methods on SmolLM2 (issue 21, acceptance 3a): GRPO, AEnt, GTPO and SPINE from the same seed, 18 steps on the
# default task, held-out accuracy at steps 0, 9 and 18; entropy and accuracy curves compared with `rlexp compare`.
# Two arms at a time, one thread each; runs go to results/entropy/smollm2/runs/.
#   bash benchmarks/entropy_runs.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-results/entropy/smollm2/runs}
COMMON=(trainer.max_steps=18 trainer.eval_every=9 trainer.num_threads=1 trainer.checkpoint_every=0 tracker=none)
mkdir -p "$DEST"
source benchmarks/arms.sh
arm grpo algorithm=grpo &
arm aent algorithm=aent &
wait
arm gtpo algorithm=gtpo &
arm spine algorithm=spine &
wait
# GTPO with the group's token rewards normalised together (the reading that keeps the correctness signal); this arm
# ran beside the length runs (benchmarks/length_runs.sh), three processes on two cores
arm gtpo_joint algorithm=gtpo algorithm.advantage.normalise=joint
# AEnt with a band set on SmolLM2's own entropy (the recipe's [0.05, 0.23] is below it); ran alone afterwards
arm aent_band algorithm=aent algorithm.entropy_control.low=0.35 algorithm.entropy_control.high=0.6
