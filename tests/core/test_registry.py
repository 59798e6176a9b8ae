"""The part registries: every ``_target_`` of a method, reward or sampler config is a registered part of
the right kind; every kind's parts share its signature; ``rlexp list parts`` prints them."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.core.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    CRITICS,
    GROUP_STAGES,
    KL_ESTIMATORS,
    LOSSES,
    PROMPT_CONDITIONS,
    REGULARISERS,
    REWARDS,
    SAMPLERS,
    Registry,
    load_all,
)

load_all()
CONF = Path(CONF_DIR)


def _targets(node, path=""):
    """(key path, _target_) of every node below ``node`` that names one."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield path, node["_target_"]
        for k, v in node.items():
            yield from _targets(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _targets(v, f"{path}[{i}]")


def _kind_of(key: str) -> Registry | None:
    """Which registry a config key's target belongs to (None: not a part, e.g. the Algorithm itself)."""
    head = key.split(".")[0].split("[")[0]
    return {
        "advantage": ADVANTAGES,
        "loss": LOSSES,
        "group_stages": GROUP_STAGES,
        "critic": CRITICS,
        "entropy_control": REGULARISERS,
        "curvature_mask": REGULARISERS,
        "prompt_condition": PROMPT_CONDITIONS,
        "terms": REWARDS,
    }.get(head)


# methods run through TRL's trainers (``backend: trl``) are one node, not parts (tests/preference)
ALGORITHMS = sorted(p for p in CONF.glob("algorithm/*.yaml") if "\nbackend: trl" not in p.read_text())


@pytest.mark.parametrize("path", ALGORITHMS, ids=lambda p: p.stem)
def test_every_part_a_method_names_is_registered(path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # a method may extend another (defaults)
        composed = compose(config_name="config", overrides=[f"algorithm={path.stem}"]).algorithm
    cfg = OmegaConf.to_container(composed, resolve=False)
    assert cfg["_target_"] == "rlexp.algorithms.algorithm.Algorithm"
    parts = [(k, t) for k, t in _targets(cfg) if k]
    assert parts, "a method names at least an advantage and a loss"
    for key, target in parts:
        registry = _kind_of(key)
        assert registry is not None, f"{path.name}: {key} is not a part key"
        part = registry.by_target(target)
        assert part is not None, f"{path.name}: {key}._target_={target} is not a registered {registry.kind}"
    assert cfg["family"], f"{path.name} has no family"


@pytest.mark.parametrize("path", sorted(CONF.glob("reward/*.yaml")), ids=lambda p: p.stem)
def test_reward_terms_are_registered(path):
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    for name, term in (cfg.get("terms") or {}).items():
        assert REWARDS.by_target(term["_target_"]) is not None, f"{path.name}: terms.{name}"


def test_samplers_are_registered():
    for path in CONF.glob("sampler/*.yaml"):
        assert SAMPLERS.by_target(OmegaConf.load(path)["_target_"]) is not None, path.name


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_each_kind_keeps_its_signature():
    for part in ADVANTAGES.parts():
        assert _params(part.obj)[0] == "batch", part.target
    for part in LOSSES.parts():  # a class (Clip-Cov, KL-Cov: settings and a mini-batch select step) by its __call__
        call = part.obj.__call__ if inspect.isclass(part.obj) else part.obj
        params = [p for p in _params(call) if p != "self"]
        assert params[:4] == ["logp", "old_logp", "advantages", "mask"], part.target
    for part in AGGREGATIONS.parts():
        assert _params(part.obj) == ["per_token", "mask", "norm"], part.target
    for part in KL_ESTIMATORS.parts():
        assert _params(part.obj) == ["log_ratio"], part.target
    for part in GROUP_STAGES.parts():
        call = part.obj.__call__ if inspect.isclass(part.obj) else part.obj
        params = [p for p in _params(call) if p != "self"]
        assert params[:2] == ["batch", "ctx"], part.target


def test_families_are_the_modules():
    assert LOSSES.get("ppo_clip").family == "clip"
    assert ADVANTAGES.get("rloo").family == "leave_one_out"
    assert ADVANTAGES.get("grpo").target == "rlexp.algorithms.advantages.group.grpo"


def test_string_selected_kinds_dispatch_by_name():
    import torch

    log_ratio = torch.tensor([0.5, -1.0])
    assert torch.allclose(KL_ESTIMATORS("k3")(log_ratio), torch.exp(log_ratio) - log_ratio - 1)
    assert set(AGGREGATIONS.names()) == {
        "token-mean",
        "token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    }
    with pytest.raises(KeyError, match="unknown loss 'nope'"):
        LOSSES.get("nope")


def test_a_name_cannot_be_registered_twice():
    reg = Registry("thing", "f()", ())

    @reg.register(name="x")
    def a():
        """First."""

    def b():
        pass

    with pytest.raises(ValueError, match="registered twice"):
        reg.register(b, name="x")
    assert reg.get("x").summary == "First." and reg.get("x").family == "test_registry"


def test_list_parts_prints_every_kind(capsys):
    from rlexp.cli import main

    main(["list", "parts"])
    out = capsys.readouterr().out
    for kind in ("advantage", "loss", "aggregation", "kl_estimator", "group_stage", "critic", "reward", "sampler"):
        assert f"\n{kind} (" in f"\n{out}"
    assert "rlexp.algorithms.losses.sequence.gspo" in out
    main(["list", "parts", "losses"])
    out = capsys.readouterr().out
    assert out.startswith("loss (") and "advantage (" not in out
