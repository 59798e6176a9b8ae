#!/usr/bin/env bash
# Paraphrase-set methods on SmolLM2 (issue 22): GRPO, GRPO over a paraphrase set (the group-similarity reward logged
# at weight 0: the outcome-only baseline of the same rollouts), PS-GRPO, information-consistent GRPO and Co-Reward
# (label-free), same seed, on the default task (reasoning-gym arithmetic_add_sub) with the hash prompt, 64 new tokens,
# 12 steps, 8 prompts x 8 completions; paraphrases from the offline rule-based source
# (algorithm.prompt_condition.source=template). Held-out greedy accuracy and paraphrase agreement (eval.paraphrases=1:
# each of 100 held-out questions asked again in another wording) at steps 0 and 12.
# Two arms at a time, one thread each. Runs go to results/paraphrase/smollm2/runs/.
#   bash benchmarks/paraphrase_runs.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-results/paraphrase/smollm2/runs}
COMMON=(prompt=hash trainer.max_new_tokens=64 trainer.max_steps=12 trainer.eval_every=12
  trainer.num_threads=1 trainer.checkpoint_every=0 tracker=none trainer.micro_batch_size=16 eval.paraphrases=1)
export MALLOC_ARENA_MAX=2
mkdir -p "$DEST"
source benchmarks/arms.sh
arm grpo algorithm=grpo &
arm grpo_paraphrased algorithm=ps_grpo algorithm.name=grpo_paraphrased algorithm.group_stages.0.weight=0.0 &
wait
arm ps_grpo algorithm=ps_grpo &
arm info_consistent_grpo algorithm=info_consistent_grpo &
wait
arm co_reward algorithm=co_reward reward=label_free &
wait
