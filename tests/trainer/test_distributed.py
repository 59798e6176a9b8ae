"""Data-parallel training (``distributed=ddp``, rlexp/trainer/distributed.py).

Unit tests (default suite): the config group and accelerate's config files load; bad settings are refused naming the
key; the collectives' logic on two simulated processes (threads exchanging objects) gives the single-process
shard union, mini-batch split, loss normalisers, update sums and batch metrics.

Long tests: ``accelerate launch`` / ``torchrun`` with 2 CPU processes (gloo) on ``model=tiny`` against one process on
the same data and seed — the logged loss, reward and gradient norm equal the single-process run's, one MLflow run is
created, and a resume with torchrun continues it to the uninterrupted run's next step.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import ConfigError
from rlexp.core.batch import RolloutBatch
from rlexp.core.micro_batches import group_mini_batches
from rlexp.trainer.distributed import Distributed, DistributedSettings, fold_means, setup
from rlexp.trainer.metrics import batch_metrics

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


# ---- configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["none", "ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"])
def test_config_group_entries_parse(entry):
    s = DistributedSettings.from_config(OmegaConf.load(Path(CONF_DIR) / "distributed" / f"{entry}.yaml"))
    assert s.strategy == {"none": "none", "ddp": "ddp", "fsdp": "fsdp"}.get(entry, "deepspeed")
    if s.strategy == "deepspeed":  # DeepSpeed's own config, read by rlexp.trainer.zero
        from rlexp.trainer.zero import check_settings

        assert check_settings(s.deepspeed) == int(entry[-1])
    if s.strategy == "fsdp":  # FSDP2's settings, read by rlexp.trainer.sharding
        from rlexp.trainer.sharding import FSDPSettings

        assert FSDPSettings.from_dict(s.fsdp).reshard_after_forward is True


def test_accelerate_config_files_load():
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {}
    for path in sorted((Path(CONF_DIR) / "accelerate").glob("*.yaml")):
        kinds[path.stem] = load_config_from_file(str(path))
    assert {k: c.distributed_type.value for k, c in kinds.items()} == {
        "ddp": "MULTI_GPU",
        "multi_node": "MULTI_GPU",
        "fsdp": "FSDP",
    }
    assert kinds["multi_node"].num_machines == 2


def test_default_config_has_the_group(tiny_cfg):
    cfg = tiny_cfg()
    assert cfg.distributed.strategy == "none"
    assert tiny_cfg("distributed=ddp").distributed.sampling_seed == "process"


@pytest.mark.parametrize(
    "node, match",
    [
        ({"strategy": "ddp", "samplng_seed": "group"}, "distributed.samplng_seed is not a setting"),
        ({"strategy": "horovod"}, "distributed.strategy='horovod'"),
        ({"strategy": "ddp", "sampling_seed": "rank"}, "distributed.sampling_seed='rank'"),
        ({"strategy": "ddp", "timeout_s": 0}, "distributed.timeout_s=0"),
    ],
)
def test_bad_settings_name_the_key(node, match):
    with pytest.raises(ConfigError, match=match):
        DistributedSettings.from_config(OmegaConf.create(node))


def _cfg(strategy="ddp", prompts=4, **extra):
    return OmegaConf.create(
        {"distributed": {"strategy": strategy, **extra}, "trainer": {"seed": 0, "prompts_per_step": prompts}}
    )


@pytest.mark.parametrize(
    "cfg, env, match",
    [
        (_cfg("none"), {"WORLD_SIZE": "2"}, "add distributed=ddp"),
        (_cfg("fsdp", fsdp={"reshard": True}), {}, "distributed.fsdp.reshard is not a setting"),
        (_cfg("ddp", fsdp={}), {}, "distributed.fsdp is set, but distributed.strategy=ddp"),
        (_cfg("deepspeed"), {}, r"distributed.deepspeed.zero_optimization.stage=None"),
        (_cfg("ddp", deepspeed={}), {}, "distributed.deepspeed is set, but distributed.strategy=ddp"),
        (_cfg("ddp"), {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"}, "launched this process for FSDP"),
        (_cfg("fsdp"), {"WORLD_SIZE": "2", "ACCELERATE_USE_DEEPSPEED": "true"}, "launched this process for DEEPSPEED"),
        (_cfg("ddp", prompts=1), {"WORLD_SIZE": "2"}, "trainer.prompts_per_step=1 is less than the 2 processes"),
    ],
)
def test_setup_refuses_with_the_reason(monkeypatch, cfg, env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=match):
        setup(cfg, torch.device("cpu"))


def test_one_process_needs_no_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert setup(_cfg("none"), torch.device("cpu")) == (None, torch.device("cpu"))
    dist, device = setup(_cfg("ddp"), torch.device("cpu"))
    assert not dist.active and dist.is_main and dist.world_size == 1
    assert dist.shard(["a", "b"], ["pa", "pb"]) == (["a", "b"], ["pa", "pb"], 0, 2)
    assert dist.reduce_sums({"loss/total": 1.5}) == {"loss/total": 1.5}
    assert dist.any_true(False) is False and dist.sum_floats([1, 2]) == [1.0, 2.0]


# ---- two simulated processes ------------------------------------------------------------------


class ThreadPair(Distributed):
    """Process ``rank`` of a world of two whose collectives are threads exchanging objects."""

    def __init__(self, rank: int, slots: list, barrier: threading.Barrier):
        super().__init__(DistributedSettings(strategy="ddp"), 0, 2, rank, rank, "cpu")
        self.slots, self.sync = slots, barrier

    def all_gather_object(self, obj) -> list:
        self.slots[self.rank] = obj
        self.sync.wait()
        out = list(self.slots)
        self.sync.wait()
        return out

    def gather_floats(self, values):
        return torch.tensor(self.all_gather_object([float(v) for v in values]), dtype=torch.float64)


def on_two(fn):
    """``fn(dist)`` on both simulated processes; their results by rank."""
    slots, barrier = [None, None], threading.Barrier(2, timeout=20)
    results, errors = [None, None], []

    def body(rank):
        try:
            results[rank] = fn(ThreadPair(rank, slots, barrier))
        except BaseException as e:  # surfaced in the test's thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_shards_cover_the_global_prompts_once():
    records = [{"id": i} for i in range(5)]
    prompts = [f"p{i}" for i in range(5)]
    (r0, p0, f0, n0), (r1, p1, f1, n1) = on_two(lambda d: d.shard(records, prompts))
    assert r0 + r1 == records and p0 + p1 == prompts
    assert (f0, f1, n0, n1) == (0, 2, 5, 5)  # 5 * 1 // 2 = 2 prompts on process 0, 3 on process 1


def test_diverged_samplers_are_caught():
    def draw(d):
        return d.shard([{"id": d.rank}, {"id": 9}], ["a", "b"])

    with pytest.raises(RuntimeError, match="drew different prompts"):
        on_two(draw)


def test_mini_batches_split_the_global_groups_like_one_process():
    # global batch: groups 0..5, two rows each; process 0 holds groups 0-2, process 1 groups 3-5
    everyone = torch.arange(6).repeat_interleave(2)
    local = [everyone[:6], everyone[6:]]
    split = on_two(lambda d: d.mini_batches(local[d.rank], 3, seed=11))
    single = group_mini_batches(everyone, 3, seed=11)
    for j in range(3):  # mini-batch j: process 0's rows then process 1's (offset by 6) are the single-process rows
        union = torch.cat([split[0][j], split[1][j] + 6])
        assert union.tolist() == single[j].tolist()


def test_global_normalisers_make_the_shares_add_up_to_the_single_process_loss():
    # process 0: two rows of width 3 (3 tokens); process 1: one row of width 4 (4 tokens)
    masks = [torch.tensor([[1.0, 1, 0], [1, 0, 0]]), torch.tensor([[1.0, 1, 1, 1]])]
    losses = [torch.tensor([[1.0, 2, 9], [3, 9, 9]]), torch.ones(1, 4)]

    def shares(d):
        norm = Normaliser.from_mask(masks[d.rank])
        ((glob, count),) = d.global_normalisers([norm])
        modes = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
        return glob, count, [float(aggregate(losses[d.rank], masks[d.rank], m, glob)) for m in modes]

    (g0, c0, s0), (g1, c1, s1) = on_two(shares)
    assert (g0.total_tokens, g0.total_rows, g0.norm_length, c0) == (7.0, 3.0, 4.0, 7.0) and g1 == g0 and c1 == 7.0
    # token-mean: (1 + 2 + 3 + 4·1) / 7 = 10/7; seq-mean-token-mean: (1.5 + 3 + 1) / 3 = 5.5/3;
    # seq-mean-token-sum-norm: 10 / (3 rows · width 4) = 10/12
    assert [a + b for a, b in zip(s0, s1)] == pytest.approx([10 / 7, 5.5 / 3, 10 / 12])
    whole_mask = torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    whole = torch.tensor([[1.0, 2, 9, 9], [3, 9, 9, 9], [1, 1, 1, 1]])
    single = Normaliser.from_mask(whole_mask)
    for mode, total in zip(
        ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"), (10 / 7, 5.5 / 3, 10 / 12)
    ):
        assert float(aggregate(whole, whole_mask, mode, single)) == pytest.approx(total)


def test_update_sums_add_and_extremes_fold():
    parts = [
        {"loss/total": 0.25, "entropy/mean": 6.0, "ratio/max": 1.2, "ratio/min": 0.9, "clip/low_seq_min": 0.1},
        {"loss/total": 0.5, "entropy/mean": 4.0, "ratio/max": 1.1, "ratio/min": 0.7},
    ]
    out = on_two(lambda d: d.reduce_sums(parts[d.rank]))
    summed = {"loss/total": 0.75, "entropy/mean": 10.0, "ratio/max": 1.2, "ratio/min": 0.7, "clip/low_seq_min": 0.1}
    assert out[0] == summed and out[1] == summed
    assert fold_means([{"time/step_s": 1.0, "a/max": 2.0}, {"time/step_s": 3.0, "a/max": 5.0}]) == {
        "time/step_s": 2.0,
        "a/max": 5.0,
    }


def _batch(groups: list[int], rewards: list[float], lengths: list[int], width: int) -> RolloutBatch:
    n = len(rewards)
    mask = torch.zeros(n, width)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    r = torch.tensor(rewards)
    return RolloutBatch(
        prompt_ids=torch.zeros(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.zeros(n, width, dtype=torch.long),
        completion_mask=mask,
        sampling_logprobs=torch.zeros(n, width),
        truncated=torch.tensor([length == width for length in lengths]),
        group_ids=torch.tensor(groups),
        prompts=["p"] * n,
        completions=["c"] * n,
        records=[{}] * n,
        rewards=r[:, None],
        reward_names=["accuracy"],
        reward_weights=torch.ones(1),
        reward=r,
        reward_failures=torch.zeros(n, 1, dtype=torch.bool),
        advantages=r - r.mean(),
        stats={"rollout/kv_cache_mb": 3.0},
    )


def test_step_metrics_are_the_single_process_batch_metrics():
    local = [
        _batch([0, 0, 1, 1], [1.0, 0.0, 1.0, 1.0], [3, 2, 4, 1], 4),
        _batch([2, 2], [0.0, 0.0], [5, 6], 6),
    ]

    def step(d):
        batch = local[d.rank]
        m = {**batch_metrics(batch, "accuracy"), "loss/total": 0.5, "time/step_s": 1.0 + d.rank}
        return d.step_metrics(batch, m, {"loss/total"}, "accuracy", ())

    m0, m1 = on_two(step)
    assert m0 == m1
    single = batch_metrics(RolloutBatch.concat(local), "accuracy")
    for k in ("reward/mean", "reward/std", "accuracy", "length/mean", "length/max", "length/min", "batch/completions"):
        assert m0[k] == pytest.approx(single[k]), k
    assert m0["groups/all_correct_frac"] == pytest.approx(1 / 3) and m0["groups/all_wrong_frac"] == pytest.approx(1 / 3)
    assert m0["loss/total"] == 0.5 and m0["time/step_s"] == 1.5  # the update's as it is; timings averaged
    assert m0["throughput/completion_tokens_per_s"] == pytest.approx(21 / 1.5)  # all 21 tokens / mean step time


# ---- launched runs (long) ---------------------------------------------------------------------

RUN = [
    "model=tiny",
    "trainer.prompts_per_step=4",
    "trainer.num_generations=4",
    "trainer.max_new_tokens=12",
    "trainer.micro_batch_size=4",
    "trainer.steps_per_rollout=2",  # two optimiser steps on mini-batches of whole groups, split over global groups
    "trainer.progress=false",
    "trainer.num_threads=1",  # the same matmul reductions in every run
    "trainer.checkpoint_every=1",
    "trainer.device=cpu",
    "dataset.train_size=64",
    "dataset.eval_size=8",
    "eval.size=0",
    # the tiny model is never right: a reward that varies between completions (tests/algorithms/varying_reward.py)
    "reward=accuracy",
    "reward.terms.accuracy._target_=tests.algorithms.varying_reward.VowelShare",
    "distributed=ddp",
    "distributed.sampling_seed=group",  # per-group sampling streams: the same completions with any process count
]
COMPARED = (
    "reward/mean",
    "reward/std",
    "accuracy",
    "loss/total",
    "grad_norm",
    "entropy/mean",
    "advantage/std",
    "length/mean",
    "ratio/mean",
    "ratio/max",
    "ratio/min",
    "batch/completions",
)
# measured on the 2-core CPU: loss, reward, grad norm and the rest equal to the last bit; ratio/mean differs by
# 2e-8 relative (token sums added per process, then over processes)
REL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(prefix: list[str], overrides: list[str], run_dir: Path, db: Path, timeout: int = 420):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    mlflow = [
        "tracker=mlflow",
        f"tracker.backends.mlflow.tracking_uri=sqlite:///{db}",
        f"tracker.backends.mlflow.artifact_location={db.parent}/artifacts",
    ]
    cmd = [*prefix, "train", *RUN, *mlflow, *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _accelerate(n: int) -> list[str]:
    return [
        str(VENV_BIN / "accelerate"),
        "launch",
        "--config_file",
        str(Path(CONF_DIR) / "accelerate" / "ddp.yaml"),  # MULTI_GPU: torchrun underneath, gloo on CPUs
        "--num_processes",
        str(n),
        "--main_process_port",
        str(_free_port()),
        "-m",
        "rlexp.cli",
    ]


def _mlflow_runs(db: Path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    return client, runs


def _assert_equal_steps(single: list[dict], launched: list[dict]) -> None:
    assert [r["step"] for r in launched] == [r["step"] for r in single[: len(launched)]]
    for a, b in zip(single, launched):
        for k in COMPARED:
            assert b[k] == pytest.approx(a[k], rel=REL, abs=1e-7), (a["step"], k)


@pytest.mark.long
def test_two_processes_log_the_single_process_run_and_resume(tmp_path):
    """accelerate launch with 2 CPU processes (gloo) gives the steps of one process on the same data and seed, in one
    MLflow run; torchrun then resumes it (2 processes) to the uninterrupted single-process run's step 3."""
    single = _launch(
        [sys.executable, "-m", "rlexp.cli"], ["trainer.max_steps=3"], tmp_path / "one", tmp_path / "one.db"
    )
    assert [r["step"] for r in single] == [1, 2, 3]
    assert single[0]["reward/std"] > 0 and single[0]["grad_norm"] > 0  # a real update

    run_dir, db = tmp_path / "two", tmp_path / "two.db"
    two = _launch(_accelerate(2), ["trainer.max_steps=2"], run_dir, db)
    _assert_equal_steps(single, two)
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1, "only the main process creates a tracker run"
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "loss/total")) == [1, 2]
    saved = json.loads((run_dir / "checkpoints" / "last" / "trainer.json").read_text())
    assert saved["step"] == 2 and saved["world_size"] == 2

    torchrun = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "rlexp.cli"]
    resumed = _launch(torchrun, ["trainer.max_steps=3"], run_dir, db)
    _assert_equal_steps(single, resumed)  # steps 1-2 as logged before, step 3 recomputed after the resume
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", "the resume continues the same tracker run"
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "reward/mean")) == [1, 2, 3]


@pytest.mark.long
def test_two_processes_with_their_own_sampling_streams(tmp_path):
    """The default distributed.sampling_seed=process: every process samples its shard in one call; the step's
    metrics cover every process's rows."""
    rows = _launch(
        _accelerate(2),
        ["trainer.max_steps=1", "distributed.sampling_seed=process", "trainer.checkpoint_every=0"],
        tmp_path / "run",
        tmp_path / "m.db",
    )
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["batch/completions"] == 16.0  # 4 prompts x 4 completions over the 2 processes
    assert rows[0]["grad_norm"] > 0


@pytest.mark.long
def test_ppo_critic_trains_on_every_process_rows(tmp_path):
    """algorithm=ppo under distributed=ddp: each process's critic (a copy of the trunk and a value head) trains on
    every process's rows as one batch (global token normaliser, summed gradients), so 2 processes log the
    single-process run's steps and critic metrics, and the critic's checkpoint resumes to its step 3."""
    ppo = ["algorithm=ppo", "algorithm.critic.lr=1e-3"]  # the value head moves visibly in a step at this rate
    critic = ("critic/value_loss", "critic/grad_norm", "critic/values_mean", "critic/returns_mean")
    single = _launch(
        [sys.executable, "-m", "rlexp.cli"], ["trainer.max_steps=3", *ppo], tmp_path / "one", tmp_path / "1.db"
    )
    run_dir, db = tmp_path / "two", tmp_path / "two.db"
    two = _launch(_accelerate(2), ["trainer.max_steps=2", *ppo], run_dir, db)
    _assert_equal_steps(single, two)
    for a, b in zip(single, two):
        for k in critic:
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), (a["step"], k)
    assert two[1]["critic/values_mean"] != 0  # the head moved off its zero start after step 1
    resumed = _launch(_accelerate(2), ["trainer.max_steps=3", *ppo], run_dir, db)
    _assert_equal_steps(single, resumed)
    assert resumed[2]["critic/values_mean"] == pytest.approx(single[2]["critic/values_mean"], rel=1e-5)
