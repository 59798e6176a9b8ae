"""TRL's log names -> ours. A TRL trainer logs a dict per logging step (``logging_steps=1``: every optimiser step);
``translate`` renames it one-to-one so that a TRL-backed run and a GRPO run share the names of what they share
(``loss/total``, ``grad_norm``, ``lr``, ``entropy/mean``, ``kl/mean``, ``reward/mean``) and the preference
quantities sit under ``pref/``. A key not in the table is kept as ``trl/<key>`` (never dropped, never mistaken for
one of ours); TRL's end-of-training summary (``train_runtime``, ``train_loss``, ...) is not a step and is left out.

=============================  ==============================  ====================================================
TRL (1.16) key                 ours                            meaning
=============================  ==============================  ====================================================
loss                           loss/total                      the trainer's loss (DPO/IPO/KTO/ORPO/online DPO)
grad_norm                      grad_norm                       gradient norm before clipping
learning_rate                  lr                              learning rate of the step
epoch                          pref/epoch                      passes over the preference data so far
rewards/chosen                 pref/chosen_reward              implicit reward β·log(π/π_ref) of the chosen
rewards/rejected               pref/rejected_reward            ... of the rejected
rewards/margins                pref/reward_margin              chosen minus rejected implicit reward
rewards/accuracies             pref/reward_accuracy            share of pairs whose chosen reward is higher
logps/chosen                   pref/chosen_logp                policy log-probability (summed) of the chosen
logps/rejected                 pref/rejected_logp              ... of the rejected
logits/chosen                  pref/chosen_logit_mean          mean logit over the chosen completions' tokens
logits/rejected                pref/rejected_logit_mean        ... over the rejected
mean_token_accuracy            pref/token_accuracy             argmax = next token, on the chosen (DPO)
num_tokens                     pref/tokens_seen                tokens trained on so far (cumulative)
entropy                        entropy/mean                    token entropy of the policy (DPO, KTO)
aux_loss                       pref/aux_loss                   router auxiliary loss (mixture-of-experts models)
kl                             pref/kto_kl                     KTO's batch KL estimate z_ref
nll_loss                       pref/nll_loss                   ORPO's SFT term on the chosen
log_odds_ratio                 pref/log_odds_ratio             ORPO's log σ(log odds ratio), mean
log_odds_chosen                pref/log_odds_chosen            ORPO's log odds of chosen over rejected, mean
objective/kl                   kl/mean                         online DPO: summed KL to the reference, mean
objective/entropy              pref/sampled_entropy            online DPO: −log π of the sampled completions, mean
objective/non_score_reward     pref/non_score_reward           online DPO: −β·KL
objective/rlhf_reward          pref/rlhf_reward                online DPO: reward − β·KL
objective/scores               reward/mean                     online DPO: our weighted reward of its samples
objective/scores_margin        pref/score_margin               online DPO: chosen minus rejected reward
val/contain_eos_token          pref/eos_frac                   online DPO: share of samples that ended
beta                           pref/beta                       online DPO: β of the step
=============================  ==============================  ====================================================
"""

from __future__ import annotations

import math

TRL_TO_OURS: dict[str, str] = {
    "loss": "loss/total",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "epoch": "pref/epoch",
    "rewards/chosen": "pref/chosen_reward",
    "rewards/rejected": "pref/rejected_reward",
    "rewards/margins": "pref/reward_margin",
    "rewards/accuracies": "pref/reward_accuracy",
    "logps/chosen": "pref/chosen_logp",
    "logps/rejected": "pref/rejected_logp",
    "logits/chosen": "pref/chosen_logit_mean",
    "logits/rejected": "pref/rejected_logit_mean",
    "mean_token_accuracy": "pref/token_accuracy",
    "num_tokens": "pref/tokens_seen",
    "entropy": "entropy/mean",
    "aux_loss": "pref/aux_loss",
    "kl": "pref/kto_kl",
    "nll_loss": "pref/nll_loss",
    "log_odds_ratio": "pref/log_odds_ratio",
    "log_odds_chosen": "pref/log_odds_chosen",
    "objective/kl": "kl/mean",
    "objective/entropy": "pref/sampled_entropy",
    "objective/non_score_reward": "pref/non_score_reward",
    "objective/rlhf_reward": "pref/rlhf_reward",
    "objective/scores": "reward/mean",
    "objective/scores_margin": "pref/score_margin",
    "val/contain_eos_token": "pref/eos_frac",
    "beta": "pref/beta",
}

# transformers' end-of-training summary: not a step's metrics
SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}
)


def is_summary(logs: dict) -> bool:
    return bool(SUMMARY_KEYS & set(logs))


def translate(logs: dict) -> dict[str, float]:
    """One TRL log dict in our names (see the table); values that are not numbers are left out."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        if key in SUMMARY_KEYS:
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(v) and key != "loss":  # a non-finite loss is kept: the run stops on it
            continue
        out[TRL_TO_OURS.get(key, f"trl/{key}")] = v
    return out
