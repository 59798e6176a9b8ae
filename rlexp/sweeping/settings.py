"""Reading ``hydra.sweeper.*`` as the upstream hydra-optuna-sweeper does: the sampler (null keys left
to Optuna, MOTPE refused), the search space (``params``, or the deprecated ``search_space``) and the
config node that receives the trial identity (only when the app has it)."""

from __future__ import annotations

import warnings
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

GRID = "optuna.samplers.GridSampler"
TRIAL_FIELDS = ("storage", "study", "number")
SEARCH_SPACE_URL = "https://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/"


class SweepConfigError(ValueError):
    """A sweeper setting is invalid; the message names the ``hydra.sweeper`` key."""


def trial_node_key(key: str | None, config: DictConfig) -> str | None:
    """``key`` when the app's composed config has that node with ``storage``, ``study`` and ``number``
    (rlexp train's ``trial``), else None: the trial identity is then not passed to the job."""
    if not key:
        return None
    node = OmegaConf.select(config, key, default=None, throw_on_missing=False)
    if isinstance(node, DictConfig) and all(f in node for f in TRIAL_FIELDS):
        return key
    return None


def check_sampler(target: str) -> None:
    if target.rsplit(".", 1)[-1] == "MOTPESampler":
        raise SweepConfigError(
            "hydra/sweeper/sampler=motpe: MOTPESampler was removed in Optuna 4.0; use "
            "hydra/sweeper/sampler=tpe (TPESampler optimises several directions) or nsgaii"
        )


def build_sampler(sampler_cfg: DictConfig, seed: int | None, grid: dict | None = None):
    """The Optuna sampler of ``hydra.sweeper.sampler`` seeded with ``seed``; keys left null are not
    passed (Optuna's defaults apply); the grid sampler gets ``grid`` as its search space."""
    check_sampler(str(sampler_cfg._target_))
    cfg = {k: v for k, v in OmegaConf.to_container(sampler_cfg, resolve=True).items() if v is not None}
    cfg.pop("seed", None)
    kwargs: dict[str, Any] = {"seed": seed} if seed is not None else {}
    if cfg["_target_"] == GRID:
        kwargs["search_space"] = grid
    return instantiate(cfg, **kwargs, _convert_="all")


def search_space_params(settings: DictConfig) -> dict | None:
    """``hydra.sweeper.params``, or upstream's deprecated ``hydra.sweeper.search_space`` (explicit
    distribution dicts) when only that is set; warns as upstream does."""
    params, old = settings.get("params"), settings.get("search_space")
    if old is not None and params is not None:
        warnings.warn(
            "Both hydra.sweeper.params and hydra.sweeper.search_space are configured.\n"
            f"Hydra will use hydra.sweeper.params for defining search space.\n{SEARCH_SPACE_URL}"
        )
    elif old is not None:
        from hydra._internal.deprecation_warning import deprecation_warning

        deprecation_warning(
            "`hydra.sweeper.search_space` is deprecated and will be removed in the next major release.\n"
            f"Please configure with `hydra.sweeper.params`.\n{SEARCH_SPACE_URL}"
        )
        params = old
    return OmegaConf.to_container(params, resolve=False) if params is not None else None
