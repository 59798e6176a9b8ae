"""Sweep retention: only the best trial's (or the Pareto front's) checkpoints stay once trials finish."""

import optuna
import pytest

from rlexp.sweeping.retention import kept_weights, prune_weights


def _study(tmp_path, values, directions=("maximize",), running=()):
    study = optuna.create_study(directions=list(directions))
    for i, v in enumerate(values):
        job = tmp_path / f"{i}-job"
        (job / "checkpoints" / "last").mkdir(parents=True)
        (job / "checkpoints" / "last" / "w.bin").write_bytes(b"x" * 100)
        t = study.ask()
        t.set_user_attr("job_dir", str(job))
        if i in running:
            continue
        if v is None:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(t, v)
    return study


def test_best_keeps_one_trials_weights_and_leaves_running_ones(tmp_path):
    study = _study(tmp_path, [0.2, 0.7, None, 0.5, 0.1], running=(4,))
    freed = prune_weights(study, "best")
    assert sorted(p.parent.name for p, _ in freed) == ["0-job", "2-job", "3-job"]
    assert all(b == 100 for _, b in freed)
    assert [n for n, _, _ in kept_weights(study)] == [1, 4]  # the best (0.7) and the running trial
    assert (tmp_path / "1-job" / "checkpoints").exists() and (tmp_path / "0-job").exists()  # job folders stay


def test_pareto_front_is_kept_with_several_objectives(tmp_path):
    study = _study(tmp_path, [(1.0, 5.0), (2.0, 4.0), (0.5, 3.0)], directions=("maximize", "maximize"))
    prune_weights(study, "best")
    assert [n for n, _, _ in kept_weights(study)] == [0, 1]  # (0.5, 3) is dominated by both


def test_all_and_none(tmp_path):
    study = _study(tmp_path, [0.1, 0.2])
    assert prune_weights(study, "all") == [] and len(kept_weights(study)) == 2
    prune_weights(study, "none")
    assert kept_weights(study) == []
    with pytest.raises(ValueError, match="keep_weights='some'"):
        prune_weights(study, "some")
