"""Per-token policy losses: ``loss(logp, old_logp, advantages, mask) -> LossOutput``.

``logp`` are the current policy's log-probs of the sampled tokens (N, T), ``old_logp`` those of the
policy that sampled them (equal to ``logp.detach()`` on-policy), ``advantages`` (N,) or (N, T).
Token statistics (clip indicators, ratios) come back per token so the trainer can reduce them over
the whole batch, independent of micro-batching.

Conventions: no log-ratio clamps anywhere (TRL; verl clamps to ±20, GSPO's sequence log-ratio at 10);
a loss that needs batch statistics (Clip-Cov, KL-Cov covariances) takes them over the optimiser step's
mini-batch through its ``select`` step (``scope=micro_batch``: per micro-batch, as verl). Losses: ppo_clip
(+ clip-higher, dual clip, two-sided delta), gspo, cispo and sapo (token or sequence level), vespo, dppo_tv,
dppo_kl, dro, ClipCov, KLCov, gmpo, reinforce, ... (``rlexp list parts losses``). See CONVENTIONS.md beside
this file.
"""
