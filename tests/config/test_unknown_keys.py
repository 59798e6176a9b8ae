"""A key the schema does not know, under a node it types itself, is refused in one line that names it and
suggests the setting meant (issue 16: `+trainer.max_stepz=2` was accepted and ignored). The open nodes (model,
dataset, reward, algorithm, rollout, tracker, optimizer, ...) still take new keys; every shipped config passes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import BRANCH_PARTS, EPISODE_PARTS, TREE_PARTS, ConfigError, validate, validate_eval
from tests.conftest import compose_train


@pytest.mark.parametrize(
    "override,message",
    [
        ("+trainer.max_stepz=2", "trainer.max_stepz is not a setting of trainer; did you mean trainer.max_steps?"),
        ("+eval.nn=3", "eval.nn is not a setting of eval; did you mean eval.n?"),
        (
            "+consistency.enabeld=true",
            "consistency.enabeld is not a setting of consistency; did you mean consistency.enabled?",
        ),
        ("+trial.x=1", "trial.x is not a setting of trial (known: storage, study, number)"),
        ("+run_nam=x", "run_nam is not a top-level key of the train config; did you mean run_name?"),
    ],
)
def test_unknown_key_under_a_typed_node_is_refused(tiny_cfg, override, message):
    cfg = tiny_cfg(override)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value) == message


def test_open_nodes_take_new_keys(tiny_cfg):
    validate(
        tiny_cfg(
            "+algorithm.my_setting=1",
            "+reward.terms.accuracy.extra=2",
            "+model.revision=main",
            "+dataset.options.flag=true",
            "+optimizer.foreach=false",
            "+benchmark=rg_chain_sum",
        )
    )


def test_eval_app_refuses_unknown_keys():
    cfg = compose_train(["+trainer.max_new_tokenz=5"], Path("/tmp/unused"), "eval")
    with pytest.raises(ConfigError, match=r"^trainer\.max_new_tokenz is not a setting of trainer; did you mean "):
        validate_eval(cfg)


ENVIRONMENT = ["environment=tool_use", "tools=[python]"]


def companions(group: str, path: Path) -> list[str]:
    """What an option needs beside it: a local dataset its file; a multi-turn rollout an environment; a method whose
    parts read episodes (schema.EPISODE_PARTS) the multi-turn rollout too."""
    if (group, path.stem) == ("dataset", "local"):
        return ["dataset.path=x.jsonl"]
    if (group, path.stem) == ("rollout", "multi_turn"):
        return ENVIRONMENT
    if group == "environment":  # played by the multi-turn rollout; tool use over a tool
        return ["rollout=multi_turn", *(["tools=[python]"] if path.stem == "tool_use" else [])]
    if group == "algorithm" and any(part in path.read_text() for part in EPISODE_PARTS):
        return ["rollout=multi_turn", *ENVIRONMENT]
    if (group, path.stem) == ("rollout", "arpo"):  # ARPO's branching rollout: an environment too
        return ENVIRONMENT
    if group == "algorithm" and any(part in path.read_text() for part in BRANCH_PARTS):
        return ["rollout=arpo", *ENVIRONMENT]
    if group == "algorithm":  # the tree methods: their tree rollout (schema.TREE_PARTS)
        tree = next((r for part, r in TREE_PARTS.items() if part in path.read_text()), None)
        if tree is not None:
            return [f"rollout={tree}"]
    # SUPO's summarising rollout: an environment
    if (group, path.stem) == ("rollout", "supo"):
        return ENVIRONMENT
    if (group, path.stem) == ("algorithm", "supo"):
        return ["rollout=supo", *ENVIRONMENT]
    # AT-GRPO's turn-wise candidates: an environment, G = K candidates x the turn limit (4 x 2 here)
    if (group, path.stem) == ("rollout", "turn_groups"):
        return [*ENVIRONMENT, "trainer.num_generations=8"]
    if (group, path.stem) == ("algorithm", "at_grpo"):
        return ["rollout=turn_groups", *ENVIRONMENT, "trainer.num_generations=8"]
    return []


OPTIONS = [
    [f"{g}={p.stem}", *companions(g, p)]
    for g in [
        "model",
        "dataset",
        "prompt",
        "reward",
        "algorithm",
        "rollout",
        "environment",
        "tracker",
        "optimizer",
        "sampler",
    ]
    for p in sorted((Path(CONF_DIR) / g).glob("*.yaml"))
] + [[f"+{g}={p.stem}"] for g in ["experiment", "sweep"] for p in sorted((Path(CONF_DIR) / g).glob("*.yaml"))]


@pytest.mark.parametrize("overrides", OPTIONS, ids=[" ".join(o) for o in OPTIONS])
def test_every_shipped_config_passes_the_check(tiny_cfg, overrides):
    validate(tiny_cfg(*overrides))


def test_every_benchmark_passes_the_eval_check(tmp_path):
    for p in sorted((Path(CONF_DIR) / "benchmark").glob("*.yaml")):
        validate_eval(compose_train([f"benchmark={p.stem}"], tmp_path / "r", "eval"))


def test_cli_says_it_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    out = subprocess.run(
        [sys.executable, "-m", "rlexp", "train", "+trainer.max_stepz=2", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: trainer.max_stepz is not a setting of trainer; did you mean trainer.max_steps?"
    )
