"""Custom search-space hooks (``hydra.sweeper.custom_search_space: rlexp.sweeping.spaces.<fn>``).

A hook is called as ``fn(cfg, trial)`` after the trial's ``params`` are sampled (``cfg`` is the
sweep's composed config, command-line fixed values applied). As in the upstream plugin it may sample
more parameters with ``trial.suggest_*``; here it may also return a dict of *derived* overrides —
values computed from the sampled ones, recorded on the trial as the user attr ``derived`` but not
searched.
"""

from __future__ import annotations


def fixed_sample_budget(cfg, trial) -> dict:
    """G vs prompts per step at a fixed number of completions per step: the budget is the base
    config's ``trainer.prompts_per_step × trainer.num_generations`` (set those two on the command line
    to change it); the trial's sampled ``trainer.num_generations`` = G gets ``prompts_per_step =
    budget // G``."""
    key = "trainer.num_generations"
    if key not in trial.params:
        raise ValueError(f"fixed_sample_budget: hydra.sweeper.params must search {key}")
    budget = int(cfg.trainer.prompts_per_step) * int(cfg.trainer.num_generations)
    g = int(trial.params[key])
    if g < 2 or budget % g:
        raise ValueError(
            f"fixed_sample_budget: {key}={g} does not divide the budget of {budget} completions per step "
            f"(trainer.prompts_per_step={cfg.trainer.prompts_per_step} x "
            f"trainer.num_generations={cfg.trainer.num_generations})"
        )
    return {"trainer.prompts_per_step": budget // g}
