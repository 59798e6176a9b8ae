"""Group stages: ``stage(batch, ctx) -> batch``, run in order after the rewards and before the
advantages (listed in ``algorithm.group_stages``; configs bind their settings with ``_partial_``).

* ``dynamic_sampling``  DAPO's dynamic sampling: drop groups whose rewards do not vary, refill
                         with fresh groups through ``ctx.sample`` (at most ``max_rounds`` rounds);
                         with ``min_varied_frac`` and ``keep_degenerate``, GPG's resampling (refill
                         until that share of the groups varies, keep the degenerate ones).
* ``overlong_mask``     DAPO's overlong filtering: truncated completions leave the loss.
* ``policy_filtration`` PF-PPO: each group keeps its best- and worst-rewarded rows (BW; BR, BoN), where a reward
                         model is reliable.
* ``reward_std_filter`` ReST-GRPO: groups whose reward std is below 0.05 leave the step (optional refill).
* ``overlong_penalty``  DAPO's soft overlong punishment, added as a reward term ``overlong``.
* ``greedy_baseline``   ReMax's baseline: the reward of one greedy completion per prompt.
* ``Replay``            RePO's per-prompt replay buffer: earlier completions of the prompt join the step.
* ``MixPolicyReplay``   ReMix's mix-policy data: whole groups of the previous policies' rollouts join the step.
* ``selective_loss_mask`` AdaCoT's SLM: the think/no-think decision token leaves the loss.
* ``AnytimeBudgets``    AnytimeReasoner: the thinking cut at token budgets, a verified summary per cut.

(DAPO: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", 2025.)
"""
