"""Prompt conditions: each group's G completions are sampled under K variants of its prompt (a token budget, an effort
level), G/K each; the variant's value goes with every row in ``batch.extras["condition"]``."""
