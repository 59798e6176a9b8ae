"""rlexp's Optuna sweeper for Hydra (``hydra/sweeper=rlexp_optuna``), on Optuna 5. The loop itself
lives in ``rlexp.sweeping``; this package holds what Hydra's plugin discovery must find."""
