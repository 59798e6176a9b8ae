"""Critics: value models with their own loss and optimiser, updated after the policy (PPO's)."""
