"""ROVER — "Random Policy Valuation is Enough for LLM Reasoning with Verifiable Rewards" (He et al., 2025; arXiv
2509.24981; released code tinnerhrhe/ROVER, ``Math/verl/workers/actor/dp_actor.py`` ``DataParallelROVERActor.
update_policy`` and ``core_algos.compute_rover_loss``).

RLVR is a finite-horizon MDP with deterministic transitions, tree-structured states (a prefix) and a binary terminal
reward. In such an MDP the greedy policy of the uniformly random policy's Q-function is optimal, so ROVER learns
Q^{π_u} — the value of a token followed by uniformly random tokens — instead of iterating evaluation and improvement,
and acts by a softmax over Q. Q is parameterised by the policy's log-probs relative to the policy the update starts
from, Q(s, a) = ρ·(log π_θ(a|s) − log π_old(a|s)), so that π_θ(a|s) ∝ π_old(a|s)·exp(Q(s, a)/ρ): sampling from the
trained policy is the softmax over Q/ρ (with π_old as the base measure), and the rollout needs nothing of its own.

The uniform policy's Bellman target of token t (state s_t, action a_t, next state s_{t+1} = s_t·a_t) is

    y_t = r̃ + mean_{v ∈ V} Q(s_{t+1}, v) = r̃ + ρ·(mean_v log π_θ(v|s_{t+1}) − mean_v log π_old(v|s_{t+1}))

with r̃ the reward minus its group mean, broadcast to every token (the paper's Eq. 4 and the countdown code; the
released math script divides by the group std too, as GRPO: the config's advantage estimator carries r̃), and 0 for
the next state's term after the last valid token (terminal). The loss is the squared error (Q_t − sg(y_t))² per
token, averaged over the tokens (Algorithm 1; the released code's token mean over each micro-batch). Both
vocabulary means are over the whole vocabulary at the rollout temperature:
the old one comes from the old log-probs' forward (``batch.extras["old_mean_logprobs"]``), the current one from the
training forward (no gradient, as the target is detached); ``rlexp.core.forward.vocab_mean_logprobs``. On the first
optimiser step of a rollout the two coincide and y_t = r̃; the next-state term acts from the second step on.
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.core.masks import OLD_MEAN_LOGPROBS
from rlexp.core.registry import LOSSES


def next_state_values(mean_logp: torch.Tensor, old_mean_logp: torch.Tensor, mask: torch.Tensor, rho: float):
    """(N, T) mean over the vocabulary of Q at the state after token t: ρ·(m_θ − m_old) at position t + 1 (whose logits
    predict token t + 1 from s_{t+1}), 0 after a row's last valid token (the terminal state) and past the row's end."""
    q_mean = rho * (mean_logp - old_mean_logp)
    out = torch.zeros_like(q_mean)
    out[:, :-1] = q_mean[:, 1:] * (mask[:, 1:] > 0).to(q_mean.dtype)
    return out


@LOSSES.register
class Rover:
    """ROVER's regression of Q = ρ·(log π_θ − log π_old) onto r̃ + the uniform mean of the next state's Q (module doc).

    ``rho``: the temperature ρ (the released ``rover_t``, 1.0); ``next_q_scale``: a factor on the next state's term
    (the released ``next_q_scale_factor``, 1.0). Stats: ``rover/q_mean`` (Q of the sampled tokens),
    ``rover/next_q_mean`` and ``rover/next_q_abs`` (the uniform valuation of the next state: 0 on a rollout's first
    optimiser step, non-zero once the policy has moved), ``rover/target_mean``, ``rover/td_abs`` (|Q − y|)."""

    batch_extras = (OLD_MEAN_LOGPROBS,)
    vocab_mean = True  # the forward computes the current policy's vocabulary mean of log π (Algorithm.loss_vocab_mean)

    def __init__(self, rho: float = 1.0, next_q_scale: float = 1.0):
        if not rho > 0:
            raise ValueError(f"algorithm.loss.rho={rho} must be > 0")
        if next_q_scale < 0:
            raise ValueError(f"algorithm.loss.next_q_scale={next_q_scale} must be >= 0")
        self.rho, self.next_q_scale = float(rho), float(next_q_scale)

    def __call__(self, logp, old_logp, advantages, mask, mean_logprobs, old_mean_logprobs) -> LossOutput:
        adv = expand_like(advantages, logp).to(logp.dtype)
        q = self.rho * (logp - old_logp)
        next_q = next_state_values(mean_logprobs.to(logp.dtype), old_mean_logprobs.to(logp.dtype), mask, self.rho)
        target = (adv + self.next_q_scale * next_q).detach()
        loss = (q - target) ** 2
        stats = {
            "rover/q_mean": q.detach(),
            "rover/next_q_mean": next_q.detach(),
            "rover/next_q_abs": next_q.detach().abs(),
            "rover/target_mean": target,
            "rover/td_abs": (q.detach() - target).abs(),
            "ratio/mean": torch.exp(logp - old_logp).detach(),
        }
        return LossOutput(loss, stats)
