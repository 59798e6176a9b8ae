#!/usr/bin/env bash
# The SmolLM2 comparisons of issues 2, 3 and 8, run side by side on one GPU (same seed, same steps
# within each comparison). Results (metrics.jsonl per run) land in $OUT; summarise them with
# `python benchmarks/summarize_runs.py <dir>`.
set -u
export OMP_NUM_THREADS=2
steps=${STEPS:-150}
limit=${LIMIT:-560}
base="${EXTRA:-} trainer.max_steps=$steps eval.size=100 trainer.eval_every=25 trainer.checkpoint_every=${CKPT:-0}"
care="+experiment=care_vs_grpo_smollm2 $base reward.terms.accuracy.fallback_last_number=false consistency.enabled=true consistency.max_completions=32"
lam="+experiment=lambda_vs_length_penalty_smollm2 $base"
if [ -n "${ONLY_ISSUE8:-}" ]; then
bash benchmarks/device/parallel_runs.sh "$limit" \
  "care_grpo|algorithm=grpo $care" \
  "care_grpo_care|algorithm=grpo_care $care" \
  "lam_grpo|algorithm=grpo $lam" \
  "lam_grpo_lambda|algorithm=grpo_lambda $lam" \
  "lam_length_penalty|algorithm=grpo reward=length_penalty $lam"
exit
fi
bash benchmarks/device/parallel_runs.sh "$limit" \
  "lib_grpo|algorithm=grpo $base" \
  "lib_dr_grpo|algorithm=dr_grpo $base" \
  "lib_dapo|algorithm=dapo $base" \
  "lib_gspo|algorithm=gspo $base" \
  "lib_rloo|algorithm=rloo $base" \
  "lib_ppo|algorithm=ppo $base" \
  "care_grpo|algorithm=grpo $care" \
  "care_grpo_care|algorithm=grpo_care $care" \
  "lam_grpo|algorithm=grpo $lam" \
  "lam_grpo_lambda|algorithm=grpo_lambda $lam" \
  "lam_length_penalty|algorithm=grpo reward=length_penalty $lam"
