"""Advantage estimators: ``estimator(batch) -> advantages`` of shape (N,) or (N, T).

Conventions (see ../shared/reference/conventions.md; chosen on purpose):

* Group statistics are computed in float32 with the unbiased (n-1, Bessel) standard deviation and
  ``eps`` added to the std, not under the root. ``eps`` defaults to 1e-6 (verl); TRL uses 1e-4 —
  set ``eps: 1.0e-4`` to reproduce TRL exactly.
* A singleton group (one completion) has no peer baseline: its advantage is 0 (TRL's convention;
  verl passes the raw reward through: ``singleton: raw`` on grpo, gpg and rloo). Exceptions follow the
  method's released code and are named in the estimator's docstring (REINFORCE++-baseline and BNPO use
  baseline 0, like verl).
* Every row counts in its group's statistics, whatever its mask (verl); per-term reward failures
  are scored 0 by the reward stage, not left out (TRL leaves rows that no reward function scored out:
  ``algorithm.unscored_rows=exclude``, applied around any estimator by ``Algorithm.compute_advantages``).
* Per-token estimators (REINFORCE++, GAE) consume token-level rewards: the outcome at the last token, the
  KL-in-reward penalty per token and ``batch.extras["token_rewards"]`` (``reinforce.token_level_rewards``).
* Batch-level normalisations: ``grpo(scale=batch)`` and GDPO standardise per sequence (TRL);
  REINFORCE++ (and its baseline variant) and GAE whiten over the valid tokens with
  rsqrt(var + 1e-8), Bessel's correction on the token count (verl's ``masked_whiten``).

Estimators: grpo (group / batch / none scaling: GRPO, Lite PPO, Dr. GRPO), rloo, reinforce_pp,
reinforce_pp_baseline, remax, opo, gpg, bnpo, gdpo, gae (PPO; needs the critic), raw_reward.
The full list of conventions, with the setting that switches to the other peer's, is in
CONVENTIONS.md beside this file.
"""
