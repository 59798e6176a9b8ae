"""One-step-off-policy rollouts (trainer.async_rollout, rlexp/trainer/async_rollout.py): step t+1's rollout comes
from the weights step t's update starts from, generated in a thread beside that update; a seed gives one run however
the threads interleave; a resume trains on the rollout the checkpoint kept and matches the uninterrupted run."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest
import torch

from rlexp.config.schema import ConfigError, validate
from rlexp.rollout.decode import sample_categorical, sampling_generator
from rlexp.rollout.hf import HFRollout
from rlexp.runs.training import run
from rlexp.trainer.async_rollout import AsyncRollout
from tests.algorithms.varying_reward import VARYING

ASYNC = ["trainer.async_rollout=true", *VARYING, "trainer.max_new_tokens=8", "optimizer.lr=1e-3"]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _untimed(row):
    return {k: v for k, v in row.items() if not k.startswith(("time/", "throughput/")) and k != "time"}


def test_sampling_generator_draws_from_its_generator_in_its_thread_only():
    probs = torch.softmax(torch.randn(6, 300), -1)
    with sampling_generator(torch.Generator().manual_seed(5)):
        torch.manual_seed(1)
        a = sample_categorical(probs)
    with sampling_generator(torch.Generator().manual_seed(5)):
        torch.manual_seed(2)  # the global RNG does not matter
        b = sample_categorical(probs)
    assert torch.equal(a, b)
    from rlexp.rollout import decode

    seen = {}
    with sampling_generator(torch.Generator().manual_seed(5)):
        other = threading.Thread(target=lambda: seen.update(generator=getattr(decode._SAMPLING, "generator", None)))
        other.start()
        other.join()
        assert decode._SAMPLING.generator is not None
    assert seen == {"generator": None}, "another thread keeps the global RNG"
    assert getattr(decode._SAMPLING, "generator", None) is None, "restored on exit"


def test_rollout_of_step_t_plus_1_comes_from_the_weights_before_step_t_update(tiny_cfg, tmp_path, monkeypatch):
    """The rollout thread generates step t+1 from the generation copy refreshed at step t's launch — the weights
    of step t−1's end — and the copy stays so while the trainer thread updates the policy beside it."""
    launches, generated, ends = [], [], []
    launch = AsyncRollout.launch

    def recording_launch(self, model, step, records, prompts, version):
        launches.append((step, version, next(model.parameters()).detach().clone()))
        return launch(self, model, step, records, prompts, version=version)

    generate = HFRollout.generate

    def slow_generate(self, model, *args, **kwargs):
        assert threading.current_thread().name == "rlexp-async-rollout"
        before = next(model.parameters()).detach().float().clone()
        out = generate(self, model, *args, **kwargs)
        time.sleep(0.3)  # the trainer thread's update of the step finishes meanwhile
        generated.append((before, next(model.parameters()).detach().float().clone()))
        return out

    class Weights:  # the policy's weights at the end of every step
        def bind(self, trainer):
            self.model = trainer.model

        def on_step_end(self, step, metrics, eval_metrics):
            ends.append(next(self.model.parameters()).detach().clone())

    monkeypatch.setattr(AsyncRollout, "launch", recording_launch)
    monkeypatch.setattr(HFRollout, "generate", slow_generate)
    cfg = tiny_cfg(*ASYNC, "trainer.max_steps=3", "trainer.autocast=off", "rollout.inference_dtype=null")
    result = run(cfg, callbacks=[Weights()])
    rows = _rows(tmp_path / "run")
    assert [r["async/version_lag"] for r in rows] == [0.0, 1.0, 1.0]
    assert [(s, v) for s, v, _ in launches] == [(1, 0), (2, 0), (3, 1)]  # step 3 from step 1's end: one step stale
    theta = [launches[0][2], *ends]  # θ_0, θ_1, θ_2, θ_3
    assert not torch.equal(theta[1], theta[0]) and not torch.equal(theta[2], theta[1]), "the policy moved"
    for (step, version, at_launch), (start, end) in zip(launches, generated):
        assert torch.equal(at_launch, theta[version]), f"step {step}: launched from the weights of step {version}"
        assert torch.equal(start, theta[version]) and torch.equal(end, theta[version]), (
            f"step {step}: the copy held step {version}'s weights through the rollout, while the policy moved on"
        )
    assert result.metrics["async/version_lag"] == 1.0


@pytest.mark.long
def test_same_seed_same_run_whatever_the_thread_timing(tiny_cfg, tmp_path, monkeypatch):
    """A seed gives one run: a slow rollout thread (the update ends before the rollout starts) and a trainer thread
    that draws from the global RNG beside it change nothing; generating synchronously does (another RNG stream)."""
    import rlexp.trainer.loop as loop
    from tests.conftest import TINY, compose_train

    overrides = [*TINY, *ASYNC, "trainer.max_steps=3"]
    update = loop.policy_update

    def update_drawing_global_rng(*args, **kwargs):
        torch.rand(1000)  # as dropout would, in the trainer thread, while the rollout of the next step runs
        return update(*args, **kwargs)

    monkeypatch.setattr(loop, "policy_update", update_drawing_global_rng)
    run(compose_train(overrides, tmp_path / "fast"))

    generate = HFRollout.generate

    def late_generate(self, *args, **kwargs):
        time.sleep(0.4)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFRollout, "generate", late_generate)
    run(compose_train(overrides, tmp_path / "slow"))
    fast, slow = _rows(tmp_path / "fast"), _rows(tmp_path / "slow")
    assert [_untimed(r) for r in fast] == [_untimed(r) for r in slow]
    assert slow[1]["time/generate_s"] > 0.4 and fast[1]["reward/mean"] == slow[1]["reward/mean"]
    assert len({r["reward/mean"] for r in fast}) > 1, "the reward varies: the comparison says something"


@pytest.mark.long
def test_resume_trains_on_the_kept_rollout_and_matches_the_uninterrupted_run(tiny_cfg, tmp_path):
    """A checkpoint waits for the rollout generated ahead and keeps it (it came from weights the checkpoint no
    longer holds); the run resumed from it equals the uninterrupted one, step for step."""
    from tests.conftest import TINY, compose_train
    from tests.trainer.test_resume import CrashAt

    overrides = [*TINY, *ASYNC, "trainer.max_steps=4", "trainer.checkpoint_every=1"]
    crashed = compose_train(overrides, tmp_path / "run")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(crashed, callbacks=[CrashAt(3)])  # step 3 logged, its checkpoint not written: resume at step 2
    blob = torch.load(tmp_path / "run" / "checkpoints" / "last" / "state.pt", weights_only=False)
    kept = blob["async_rollout"]
    assert kept["step"] == 3 and kept["version"] == 1, "the checkpoint of step 2 keeps step 3's rollout (θ_1's)"
    assert kept["output"]["completion_ids"].shape[0] == 2 * 4 and len(kept["records"]) == 2
    resumed = run(compose_train(overrides, tmp_path / "run"))
    assert resumed.last_step == 4
    run(compose_train(overrides, tmp_path / "ref"))
    rows, ref = _rows(tmp_path / "run"), _rows(tmp_path / "ref")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [_untimed(r) for r in rows] == [_untimed(r) for r in ref]
    assert [r["async/version_lag"] for r in rows] == [0.0, 1.0, 1.0, 1.0], "step 3 after the resume: still one stale"
    final = torch.load(tmp_path / "run" / "checkpoints" / "last" / "state.pt", weights_only=False)
    assert final["async_rollout"] is None, "nothing is generated ahead of the last step"
    from safetensors.torch import load_file

    def weights(run_dir):
        files = sorted((run_dir / "checkpoints" / "last" / "model").glob("*.safetensors"))
        return {k: v for f in files for k, v in load_file(f).items()}

    resumed_w, ref_w = weights(tmp_path / "run"), weights(tmp_path / "ref")
    assert resumed_w.keys() == ref_w.keys() and resumed_w
    assert all(torch.equal(resumed_w[k], ref_w[k]) for k in ref_w), "the resumed run ends on the same weights"


def test_sampler_log_probs_as_old_make_the_ratio_leave_one_at_one_step_per_rollout(tiny_cfg):
    m = run(tiny_cfg(*ASYNC, "trainer.recompute_old_logprobs=false", "trainer.autocast=off")).metrics
    assert m["train/optimizer_steps"] == 1.0 and m["async/version_lag"] == 1.0
    assert m["ratio/max"] > 1.0 and m["ratio/min"] < 1.0  # π_θ1 / π_θ0 on θ_0's tokens (fp32: no precision gap)
    assert m["mismatch/kl"] > 0


def test_one_step_off_policy_experiment_runs_two_steps(tiny_cfg):
    m = run(tiny_cfg(*VARYING, "+experiment=one_step_off_policy")).metrics
    assert m["async/version_lag"] == 1.0 and m["train/optimizer_steps"] == 1.0
    for name in ("time/rollout_overlap_s", "time/rollout_wait_s", "mismatch/kl", "loss/total"):
        assert name in m and math.isfinite(m[name]), name
    assert m["ratio/mean"] == pytest.approx(1.0, abs=1e-3)  # old log-probs recomputed: the paper's choice


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.engine=generate", "rollout.engine"),
        ("rollout=vllm", "rollout=hf"),
        ("trainer.async_rollout_threads=0", "trainer.async_rollout_threads"),
        ("rollout=hf_static", "rollout.decode_graph"),
        ("rollout.speculative_reuse.enabled=true", "rollout.speculative_reuse.enabled"),
    ],
)
def test_async_rollout_refuses_what_it_cannot_run(tiny_cfg, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(tiny_cfg("trainer.async_rollout=true", override))


def test_a_crash_in_the_rollout_thread_is_raised_in_the_trainer_thread(tiny_cfg, tmp_path, monkeypatch):
    """The rollout of step 2 fails in the rollout thread while step 1 trains: the trainer thread raises it when it
    takes that rollout (a clear error naming the step and the cause, not a hang), and the thread is gone after."""
    generate = HFRollout.generate
    calls = []

    def failing_generate(self, *args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise ValueError("boom in the rollout")
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFRollout, "generate", failing_generate)
    with pytest.raises(RuntimeError, match=r"rollout of step 2 failed in the rollout thread: ValueError\('boom") as e:
        run(tiny_cfg(*ASYNC, "trainer.max_steps=3"))
    assert isinstance(e.value.__cause__, ValueError)
    assert calls == ["rlexp-async-rollout"] * 2
    assert [r["step"] for r in _rows(tmp_path / "run")] == [1], "step 1 trained; step 2 never did"
    assert not [t for t in threading.enumerate() if t.name == "rlexp-async-rollout"], "the rollout thread ended"


def test_a_rollout_thread_that_died_is_an_error_not_a_hang():
    from rlexp.trainer.async_rollout import PendingRollout

    ahead = AsyncRollout.__new__(AsyncRollout)
    ahead._thread = threading.Thread(target=lambda: None)
    ahead._thread.start()
    ahead._thread.join()  # ended without setting the job done (as if killed)
    ahead._pending = PendingRollout(step=4, version=2, records=[], prompts=[])
    ahead._reduced = False
    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="rollout thread ended before the rollout of step 4"):
        ahead.take(4)
    assert time.perf_counter() - t < 5


@pytest.mark.parametrize("algorithm", ["gspo", "dapo"])
def test_one_step_off_policy_under_ratio_methods(tiny_cfg, algorithm):
    """Two steps of +experiment=one_step_off_policy under a ratio method with its own schedule (4 optimiser steps
    per rollout); DAPO's dynamic sampling refills in the trainer thread, synchronously, beside the rollout ahead."""
    m = run(
        tiny_cfg(*VARYING, "+experiment=one_step_off_policy", f"algorithm={algorithm}", "trainer.prompts_per_step=4")
    ).metrics  # 4 groups: one per mini-batch
    assert m["async/version_lag"] == 1.0 and m["train/optimizer_steps"] == 4.0
    assert math.isfinite(m["loss/total"]) and "clip/region_frac" in m
    assert m["ratio/max"] > m["ratio/min"], "the ratio moves over the 4 mini-batches"


def test_default_run_has_no_rollout_thread_and_stays_on_policy(tiny_cfg, monkeypatch):
    """trainer.async_rollout=false (the default): no AsyncRollout, no thread, no async metrics, the on-policy path
    (one optimiser step, the sampler's log-probs, no recompute)."""

    def refuse(*args, **kwargs):
        raise AssertionError("AsyncRollout built with trainer.async_rollout=false")

    monkeypatch.setattr(AsyncRollout, "__init__", refuse)
    before = {t.name for t in threading.enumerate()}
    m = run(tiny_cfg(*VARYING)).metrics
    assert {t.name for t in threading.enumerate()} - before == set()
    assert not [k for k in m if k.startswith("async/") or "rollout_wait" in k or "rollout_overlap" in k]
    assert m["train/optimizer_steps"] == 1.0
    assert m.get("ratio/mean", 1.0) == 1.0 and m.get("ratio/max", 1.0) == 1.0


def test_one_step_off_policy_metric_names_are_known():
    from rlexp.sweeping.metric_names import SOMETIMES

    for name in ("async/version_lag", "time/rollout_wait_s", "time/rollout_overlap_s"):
        assert name in SOMETIMES
