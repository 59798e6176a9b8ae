"""The loss mask: which completion tokens enter the policy (and value) loss.

It is the completion mask, times an optional per-row weight in ``batch.extras["loss_mask"]`` that
group stages set to drop rows from the loss without touching the completion itself (DAPO's overlong
masking): such rows keep their tokens, length, reward and place in their group's statistics, but
contribute no loss and are not counted by the aggregation's token/row normalisers (TRL's
``mask_truncated_completions`` does the same).
"""

from __future__ import annotations

import torch

LOSS_MASK = "loss_mask"
KL_PENALTY = "kl_penalty"  # (N, T) β·KL_t of algorithm.kl.mode=reward, per token (REINFORCE++ returns)
UNSCORED = "unscored"  # (N,) bool: every reward term failed or returned None on the row (the reward stage)
TOKEN_REWARDS = "token_rewards"  # (N, T) rewards at token positions (process rewards), beside the outcome reward
IS_WEIGHTS = "is_weights"  # (N, T) importance weights on the per-token loss (train-inference correction)
# (N,) bool: the row was replayed from an earlier step (RePO); its sampling_logprobs are its behaviour policy's, which
# stay the ratio's denominator, and it is left out of the reward metrics and the train-inference mismatch
REPLAYED = "replayed"
# (N, T) log-probs of the policy the step's update starts from (the precedent policy), set by the trainer for a loss
# that reads them (ReMix's KL-Convex); unlike old_logprobs they are not the behaviour policy's on replayed rows
PRECEDENT = "precedent_logprobs"
# the old policy's sparse support per token (TROLL): (N, T, S) vocabulary ids, their old log-probs (−inf: left out),
# and (N, T) the sampled token's column; set by the trainer for a loss with ``support_k`` > 0
SUPPORT_IDX = "support_idx"
SUPPORT_OLD = "support_old_logprobs"
SUPPORT_TOKEN = "support_token_pos"
# (N, T) token entropies of the policy the step's update starts from (no gradient), at the rollout temperature; set by
# the trainer for an advantage estimator marked ``token_entropy = True`` (GTPO, GRPO-S)
TOKEN_ENTROPY = "token_entropy"
# (N,) float: the prompt condition each row was sampled under (HBPO's token budget, e1's effort), set by the trainer
CONDITION = "condition"
# (N, T) the sampled token's log-prob under the old policy's min-p proxy (Lp-Reg): the policy renormalised on the tokens
# whose probability is at least κ × the position's largest (−1e4 where the token itself is filtered out)
PROXY_LOGPROBS = "proxy_logprobs"
# (N, T) the old policy's mean over the vocabulary of log π(v) at each position (ROVER's uniform valuation of the next
# state), set by the trainer in the old log-probs' forward for a loss with ``vocab_mean = True``
OLD_MEAN_LOGPROBS = "old_mean_logprobs"
# (N,) per-row weight of the KL term in the loss (APO's difficulty-adaptive KL), set by the advantage estimator
KL_ROW_WEIGHTS = "kl_row_weights"
# (N, T) per-token loss weight beside the per-row ``loss_mask``: group stages that drop single positions from the loss
# (AdaCoT's Selective Loss Masking of the CoT decision token); absent: every completion token enters
TOKEN_LOSS_MASK = "token_loss_mask"
# (N, T) 1 on the tokens the policy sampled, 0 on an environment's or a tool's tokens inside the completion (multi-turn
# episodes, rlexp.rollout.multi_turn): attended to, never in the loss nor in the train-inference mismatch
POLICY_TOKENS = "policy_tokens"
# (N, K) float: each episode's per-turn rewards, turn k in column k, NaN past the episode's turns (multi-turn rollouts);
# the last turn's is the outcome reward. Set by a group stage (IGPO's information gain,
# rlexp.algorithms.group_stages.information_gain), read by the turn-level advantage (advantages.turn_level)
TURN_REWARDS = "turn_rewards"
# (N, 3) float: [effective rank, its velocity, its acceleration] of each completion's final hidden states under the
# policy the step's update starts from (VERL); set by the trainer for an advantage estimator marked ``hidden_rank``
HIDDEN_RANK = "hidden_rank"
# (N,) the row's answer cluster within its group (-1: no answer) and that cluster's share of the group
# (group_stages.votes.AnswerVotes; label-free advantages such as RESTRAIN)
ANSWER_CLUSTER = "answer_cluster"
ANSWER_SHARE = "answer_share"
# CAPO's curvature mask (rlexp.algorithms.regularisers.curvature): the old policy's (N, T, d) final hidden states and
# the (N, T, K) ids and log-probs of each position's top-K tokens, kept by the old log-probs' forward when
# algorithm.curvature_mask is set and consumed by the mask before the update
CURVATURE_HIDDEN = "curvature_hidden"
CURVATURE_TOPK_IDX = "curvature_topk_idx"
CURVATURE_TOPK_LOGP = "curvature_topk_logp"
# (N,) bool: the row is a demonstration (the record's reference solution), not a rollout of the policy
# (rlexp.algorithms.group_stages.demonstrations: LUFFY's off-policy rows, CHORD's expert rows); such rows are also
# REPLAYED (their sampling_logprobs, 0 = a behaviour policy π_φ = 1, are the ratio's denominator; out of the reward
# metrics and the mismatch). Read by the SFT–RL hybrid losses (rlexp.algorithms.losses.off_policy)
DEMONSTRATION = "demonstration"
# (N,) float: N_tokens / N_tokens(part) for each row, the parts being the demonstration rows and the others, counted on
# the loss mask when the demonstration stage ran: a per-token value times this weight, summed and divided by all the
# loss tokens (token-mean), is the mean over the row's own part (CHORD's per-part token means; per-part metrics)
DEMO_PART_WEIGHT = "demo_part_weight"


def replayed_rows(batch) -> torch.Tensor | None:
    """(N,) bool of the replayed rows, or None when the batch holds none."""
    rows = batch.extras.get(REPLAYED)
    return rows.bool() if rows is not None and bool(rows.any()) else None


def loss_mask(batch) -> torch.Tensor:
    """(N, T) mask of the tokens that enter the loss."""
    mask = batch.completion_mask
    rows = batch.extras.get(LOSS_MASK)
    for key in (TOKEN_LOSS_MASK, POLICY_TOKENS):
        tokens = batch.extras.get(key)
        if tokens is not None:
            mask = mask * tokens[:, : mask.shape[1]].to(device=mask.device, dtype=mask.dtype)
    if rows is None:
        return mask
    return mask * rows.to(device=mask.device, dtype=mask.dtype)[:, None]


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row has no EOS."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    has_eos = is_eos.any(-1)
    first = torch.where(
        has_eos, is_eos.int().argmax(-1), torch.full_like(has_eos, completion_ids.shape[1], dtype=torch.long)
    )
    pos = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    mask = (pos[None, :] <= first[:, None]).long()
    return mask, ~has_eos
