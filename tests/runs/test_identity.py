"""A run's identity follows the run, not a file that can be copied (rlexp.runs.identity): ``resume=false`` in a
directory holding a run is refused instead of splicing two runs into one MLflow run; a copied run directory
resumes into a new MLflow run of its own; a moved one continues its run."""

import json
import shutil

import pytest
from mlflow import MlflowClient

from rlexp.config.schema import ConfigError
from rlexp.runs.identity import claim_identity, read_identity
from rlexp.runs.training import run
from tests.conftest import TINY, compose_train


def _common(tmp_path, steps):
    return [
        *TINY,
        f"trainer.max_steps={steps}",
        "trainer.checkpoint_every=1",
        "tracker=mlflow",
        f"tracker.backends.mlflow.tracking_uri=sqlite:///{tmp_path}/mlruns.db",
        f"tracker.backends.mlflow.artifact_location={tmp_path}/art",
    ]


def _steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _mlflow_runs(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns.db")
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    steps = {
        r.info.run_id: sorted(m.step for m in client.get_metric_history(r.info.run_id, "reward/mean")) for r in runs
    }
    return runs, steps


@pytest.mark.long
def test_resume_false_in_a_directory_that_holds_a_run_is_refused_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run(compose_train(_common(tmp_path, 2), run_dir))
    before = (run_dir / "metrics.jsonl").read_bytes(), (run_dir / "provenance.json").read_bytes()
    with pytest.raises(ConfigError, match=r"trainer.resume=false: .*already holds a run") as e:
        run(compose_train([*_common(tmp_path, 3), "trainer.resume=false"], run_dir))
    assert "\n" not in str(e.value) and "hydra.run.dir" in str(e.value)
    assert ((run_dir / "metrics.jsonl").read_bytes(), (run_dir / "provenance.json").read_bytes()) == before
    runs, steps = _mlflow_runs(tmp_path)
    assert len(runs) == 1 and list(steps.values()) == [[1, 2]]  # nothing spliced into the old run


@pytest.mark.long
def test_a_copied_run_directory_resumes_into_a_new_mlflow_run_with_the_copied_history(tmp_path):
    original = tmp_path / "run"
    run(compose_train(_common(tmp_path, 2), original))
    (first,), _ = _mlflow_runs(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)

    result = run(compose_train(_common(tmp_path, 3), copy))
    assert result.last_step == 3 and _steps(copy) == [1, 2, 3] and _steps(original) == [1, 2]
    runs, steps = _mlflow_runs(tmp_path)
    assert len(runs) == 2
    assert steps[first.info.run_id] == [1, 2], "the copy must not log into the original's MLflow run"
    (forked,) = [r for r in runs if r.info.run_id != first.info.run_id]
    assert steps[forked.info.run_id] == [1, 2, 3]  # the copied history, then its own step
    ids = read_identity(original), read_identity(copy)
    assert forked.data.tags["forked_from"] == ids[0].uid == first.data.tags["run_uid"]
    assert forked.data.tags["run_uid"] == ids[1].uid != ids[0].uid
    assert ids[1].path == str(copy.resolve())
    assert json.loads((copy / "tracker_ids.json").read_text())["mlflow"] == forked.info.run_id


@pytest.mark.long
def test_a_moved_run_directory_continues_its_run(tmp_path):
    original = tmp_path / "run"
    run(compose_train(_common(tmp_path, 2), original))
    moved = tmp_path / "moved"
    shutil.move(original, moved)
    run(compose_train(_common(tmp_path, 3), moved))
    runs, steps = _mlflow_runs(tmp_path)
    assert len(runs) == 1 and list(steps.values()) == [[1, 2, 3]]
    ident = read_identity(moved)
    assert ident.path == str(moved.resolve()) and ident.moved_from == str(original.resolve())


def test_identity_rules(tmp_path):
    fresh = claim_identity(tmp_path / "new", resume=True)
    assert not fresh.continues and fresh.forked_from is None
    d = tmp_path / "held"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    adopted = claim_identity(d, resume=True)  # a directory from before run.json: adopted where it is
    assert adopted.continues and adopted.path == str(d.resolve())
    with pytest.raises(ConfigError, match="trainer.resume=false"):
        claim_identity(d, resume=False)
