"""Custom reward functions for `rlexp train` (README, "Write your own reward"). Name one as a reward term's
_target_ (`+reward.terms.<name>._target_=examples.my_rewards.<function>` from the repository root, or
`my_rewards.<function>` from this folder)."""


def reward_len(completions, **kwargs):
    """TRL's signature, from its GRPOTrainer docs: completions close to 20 characters score best."""
    return [-abs(20 - len(completion)) for completion in completions]


def shows_work(sample) -> float:
    """rlexp's per-sample signature: ``sample`` has .prompt, .completion, .record (the dataset row), .group,
    .num_tokens, .truncated, .completion_ids. 1 when the completion has a line of reasoning before its answer."""
    lines = [line for line in sample.completion.splitlines() if line.strip()]
    return float(len(lines) >= 2)
