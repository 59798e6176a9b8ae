"""The reproduce: spec: the shipped experiment files read and validate; a bad spec is one error naming the key."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from rlexp.reproduce.spec import SpecError, all_specs, load_spec, spec_names

GOOD = {
    "paper": {"title": "A Paper", "year": 2025},
    "claim": "b is shorter than a",
    "figures": [{"quantity": "length", "paper": "-40 %", "ours": {"metric": "length/mean", "arm": "b", "vs": "a"}}],
    "arms": {"a": ["algorithm=grpo"], "b": ["algorithm=dr_grpo"]},
    "seeds": [0, 1],
    "scales": {"cpu": ["trainer.max_steps=2"], "gpu": {"overrides": ["trainer.max_steps=20"], "last": 5}},
    "metrics": ["length/mean", {"metric": "eval/accuracy", "last": 1}],
    "last": 3,
    "verdict": {
        "requires": [{"metric": "length/mean", "arm": "a", "value": {"min": 5}}],
        "checks": [{"metric": "length/mean", "arm": "b", "vs": "a", "ratio": {"max": 0.7}, "says": "shorter"}],
    },
}


def write(tmp_path, spec, name="x"):
    folder = tmp_path / "experiment"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text("# @package _global_\n" + yaml.safe_dump({"reproduce": spec}))
    return tmp_path


DELETE = object()


def edited(path: str, value) -> dict:
    """GOOD with the key at dotted ``path`` (list indices as numbers) set to ``value``, or deleted (``DELETE``)."""
    spec = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    node = spec
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    leaf = int(leaf) if isinstance(node, list) else leaf
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return spec


def test_the_shipped_experiments_have_valid_specs():
    specs = all_specs()
    wanted = {
        "lambda_vs_length_penalty_smollm2",
        "care_vs_grpo_smollm2",
        "dr_grpo_vs_grpo_smollm2",
        "dapo_vs_grpo_smollm2",
        "reproduce_tiny_demo",
    }
    assert wanted <= set(specs)
    for name, spec in specs.items():
        assert {"cpu", "gpu"} <= set(spec.scales), name
        assert len(spec.seeds) >= 2 and spec.checks, name
    assert specs["reproduce_tiny_demo"].demo and not specs["dapo_vs_grpo_smollm2"].demo


def test_a_good_spec_reads(tmp_path):
    spec = load_spec("x", write(tmp_path, GOOD))
    assert spec.arms == {"a": ["algorithm=grpo"], "b": ["algorithm=dr_grpo"]}
    assert spec.last_of("length/mean", spec.scales["cpu"]) == 3  # the spec's
    assert spec.last_of("length/mean", spec.scales["gpu"]) == 5  # the scale's
    assert spec.last_of("eval/accuracy", spec.scales["gpu"]) == 1  # the metric's own
    (check,) = spec.checks
    assert (check.kind, check.arm, check.vs, check.low, check.high) == ("ratio", "b", "a", None, 0.7)
    assert spec.figures[0].ours.as_ == "relative"  # the default with a vs


def test_a_staged_arm_reads_and_its_runs_link_the_stages(tmp_path):
    from pathlib import Path

    from rlexp.reproduce.runs import run_overrides, stage_dirs, staged_overrides

    stages = [{"name": "sft", "overrides": ["stage=sft", "trainer.max_steps=4"]}, {"name": "rl"}]
    spec = load_spec("x", write(tmp_path, edited("arms.b", {"stages": stages})))
    assert spec.arms["b"] == [] and [s.name for s in spec.staged["b"].stages] == ["sft", "rl"]
    out = Path("results/x")
    assert stage_dirs(spec, "b", 1, out) == {"sft": out / "stages/b-s1/sft", "rl": out / "runs/b-s1"}
    by_stage = staged_overrides(spec, spec.scales["cpu"], "b", 1, ["tracker=none"], out)
    assert by_stage["sft"] == ["+experiment=x", "trainer.max_steps=2", "stage=sft", "trainer.max_steps=4"] + [
        "tracker=none",
        "trainer.seed=1",
    ]
    assert by_stage["rl"] == ["+experiment=x", "trainer.max_steps=2", "tracker=none", "trainer.seed=1"] + [
        "model.source=hub",
        "++model.path=results/x/stages/b-s1/sft/model",
    ]
    assert run_overrides(spec, spec.scales["cpu"], "b", 1, ["tracker=none"], out) == by_stage["rl"]
    with pytest.raises(ValueError, match="arm b is staged"):
        run_overrides(spec, spec.scales["cpu"], "b", 1)


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("claim", DELETE, r"reproduce\.claim: is required"),
        ("paper.titel", "x", r"reproduce\.paper\.titel is not a key of reproduce\.paper; did you mean paper\.title\?"),
        ("seedz", [0], r"reproduce\.seedz is not a key of reproduce; did you mean reproduce\.seeds\?"),
        ("seeds", [0, 0], r"reproduce\.seeds: \[0, 0\] repeats a seed"),
        ("seeds.1", "one", r"reproduce\.seeds\.1: must be an integer >= 0"),
        ("arms", {"a": ["algorithm=grpo"]}, r"reproduce\.arms: must map at least two arm names"),
        ("arms.b", ["algorithm"], r"reproduce\.arms\.b\.0: must be a train override key=value"),
        ("arms.b", ["trainer.seed=3"], r"reproduce\.arms\.b\.0: 'trainer\.seed=3': `rlexp reproduce` sets"),
        ("arms.b", ["algorithm=grpo"], r"reproduce\.arms: two arms have the same overrides"),
        ("scales.tpu", ["a=b"], r"reproduce\.scales\.tpu: is not a scale; the scales are cpu, gpu"),
        ("scales.gpu.last", 0, r"reproduce\.scales\.gpu\.last: must be an integer >= 1"),
        ("metrics.1.metric", DELETE, r"reproduce\.metrics\.1\.metric: is required"),
        ("verdict.checks.0.metric", "entropy/mean", r"verdict\.checks\.0\.metric: 'entropy/mean' is not one of"),
        ("verdict.checks.0.arm", "c", r"reproduce\.verdict\.checks\.0\.arm: 'c' is not an arm"),
        ("verdict.checks.0.vs", "b", r"reproduce\.verdict\.checks\.0\.vs: compares arm 'b' with itself"),
        ("verdict.checks.0.vs", DELETE, r"verdict\.checks\.0\.vs: ratio compares two arms: name the other one"),
        ("verdict.checks.0.ratio", {"max": "low"}, r"verdict\.checks\.0\.ratio\.max: must be a number"),
        ("verdict.checks.0.ratio", {"min": 2, "max": 1}, r"verdict\.checks\.0\.ratio: min 2 > max 1"),
        ("verdict.checks.0.ratio", {"most": 1}, r"verdict\.checks\.0\.ratio\.most is not a key"),
        ("verdict.checks.0.within_std", 1, r"verdict\.checks\.0: needs exactly one comparison .* \['ratio', 'within"),
        ("verdict.requires.0.vs", "b", r"verdict\.requires\.0\.vs: value reads one arm"),
        ("verdict.requires.0.value", DELETE, r"verdict\.requires\.0: needs exactly one comparison"),
        ("verdict.checks", [], r"reproduce\.verdict\.checks: needs at least one check"),
        ("figures.0.ours.as", "percent", r"reproduce\.figures\.0\.ours\.as: 'percent' is not one of"),
        ("arms.b", {"stages": [{"name": "x"}]}, r"reproduce\.arms\.b\.stages: a staged arm has at least two"),
        ("arms.b", {"stages": [{"name": "s"}, {"name": "s"}]}, r"reproduce\.arms\.b\.stages\.1\.name: 's': two stages"),
        ("arms.b", {"steps": []}, r"reproduce\.arms\.b\.stages: the pipeline node holds one key, `stages`"),
        (
            "arms.b",
            {"stages": [{"name": "s", "overrides": ["stage=sft", "trainer.seed=1"]}, {"name": "r"}]},
            r"reproduce\.arms\.b\.stages\.0\.overrides\.1: 'trainer\.seed=1': `rlexp reproduce` sets",
        ),
    ],
)
def test_a_bad_spec_names_the_key(tmp_path, path, value, message):
    spec = edited(path, value)
    with pytest.raises(SpecError, match=message) as e:
        load_spec("x", write(tmp_path, spec))
    assert str(e.value).startswith(str(tmp_path / "experiment" / "x.yaml")) and "\n" not in str(e.value)


def test_unknown_experiment_and_experiment_without_spec(tmp_path):
    write(tmp_path, GOOD, "with_spec")
    (tmp_path / "experiment" / "plain.yaml").write_text("# @package _global_\ntrainer:\n  max_steps: 3\n")
    assert spec_names(tmp_path) == ["with_spec"]
    with pytest.raises(SpecError, match=r"experiment 'with_spex': no file .*; did you mean with_spec\?"):
        load_spec("with_spex", tmp_path)
    with pytest.raises(SpecError, match=re.escape("has no top-level `reproduce:` key")):
        load_spec("plain", tmp_path)


@pytest.mark.long  # ~10 s: kept out of the default suite (its 10-minute budget)
def test_every_arm_at_every_scale_composes_and_validates(tmp_path):
    """What `rlexp reproduce` would train passes the train app's checks (no SmolLM2 run here)."""
    from rlexp.config.schema import validate
    from rlexp.reproduce.runs import compose_run, run_overrides, staged_overrides

    for name, spec in all_specs().items():
        for scale in spec.scales.values():
            for arm in spec.arms:
                cfg = compose_run(run_overrides(spec, scale, arm, spec.seeds[-1], out=tmp_path), tmp_path / "run")
                validate(cfg)
                assert cfg.trainer.seed == spec.seeds[-1] and cfg.reproduce is None, (name, scale.name, arm)
                if arm in spec.staged:  # the earlier stages too
                    for stage, overrides in staged_overrides(spec, scale, arm, 0, out=tmp_path).items():
                        validate(compose_run(overrides, tmp_path / stage))
