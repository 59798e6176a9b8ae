"""Method families: the ``family`` field of every ``conf/algorithm/<method>.yaml`` and of every entry
of the paper registry (``rlexp list papers``). One vocabulary for both, so a family lists its papers
and its configs together."""

from __future__ import annotations

FAMILIES: dict[str, str] = {
    "group-baseline": "critic-free policy gradient with a group or batch baseline (GRPO, RLOO, REINFORCE++, ...)",
    "actor-critic": "a learned value model and GAE (PPO, VAPO, ...)",
    "clip-ratio": "importance ratios, clipping and trust regions; off-policy updates (GSPO, SAPO, CISPO, GMPO, ...)",
    "replay": "replay buffers and rollout reuse (RePO, ReMix, SPEC-RL, ...)",
    "entropy": "entropy control and exploration (Clip-Cov, KL-Cov, 80/20 high-entropy tokens, ...)",
    "length": "response length and reasoning efficiency (GRPO-lambda, length penalties, ...)",
    "reward-shaping": "reward design on verifiable outcomes (partial credit, format, multi-reward aggregation, ...)",
    "consistency": "consistency-aware and label-free rewards (GRPO-CARE, COPO, ACRE, self-consistency, ...)",
    "model-reward": "rewards from models: reward models, LLM judges, process reward models",
    "preference": "pairwise and preference objectives, Nash and self-play methods",
    "curriculum": "which prompts to train on and how many samples each: curricula, hints, synthesis",
    "sft-hybrid": "SFT and RL combined: SFT terms, interleaving, off-policy demonstrations",
    "agentic": "multi-turn rollouts with tools and environments",
    "optimizer": "optimiser variants (SPAM, ...)",
}
