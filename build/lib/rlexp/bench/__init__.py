"""Our trainer against TRL's GRPOTrainer on the identical setting: ``harness`` (the alternating run),
``trl_side`` (TRL's trainer, timed by phase), ``meter`` (time, memory, dtypes), ``report`` (summary,
ratios, files), ``profile`` (one profiled step, by phase)."""
