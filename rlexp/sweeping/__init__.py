"""Hyperparameter sweeps with Optuna: the sweep loop behind the ``hydra/sweeper=rlexp_optuna`` plugin
(``runner``), its settings read as the upstream plugin reads them (``settings``), its search-space
syntax (``search_space``), storages (``storage``), the objective values of a job (``objectives``),
cross-worker trial bookkeeping (``trials``), the training-side pruning callback (``callback``) and
the end-of-sweep summary (``summary``). See README "Sweeps".

Kept import-light: the train app imports ``rlexp.sweeping.callback`` on every run.
"""

PRUNED_AT = "pruned_at_step"  # trial user attr set by a job its pruner stopped
