"""Every option of every config group composes (and its _target_ imports)."""

from pathlib import Path

import pytest
from hydra.utils import get_class, get_method
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR

GROUPS = ["model", "dataset", "prompt", "reward", "algorithm", "rollout", "tracker", "optimizer"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((Path(CONF_DIR) / g).glob("*.yaml"))]


def _targets(node):
    if isinstance(node, dict):
        if "_target_" in node:
            yield node["_target_"]
        for v in node.values():
            yield from _targets(v)
    elif isinstance(node, list):
        for v in node:
            yield from _targets(v)


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_targets_import(tiny_cfg, group, option):
    overrides = [f"{group}={option}"]
    if (group, option) == ("dataset", "local"):
        overrides.append("dataset.path=/nonexistent.jsonl")
    if group == "model" or group == "dataset":
        overrides = [o for o in overrides]
    cfg = tiny_cfg(*overrides)
    container = OmegaConf.to_container(cfg, resolve=True)
    for target in _targets(container[group]):
        try:
            get_method(target)
        except Exception:
            get_class(target)
