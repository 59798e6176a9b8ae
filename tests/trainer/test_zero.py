"""DeepSpeed ZeRO-2 / ZeRO-3 (``distributed=deepspeed_zero2|3``, rlexp/trainer/zero.py).

Default suite: DeepSpeed's config is checked naming the key (rlexp's own keys refused, the stage 2 or 3); the
engine's config carries rlexp's accumulation, clipping and precision; and on a world of one process (a real gloo
group) the engine around a tiny Llama: its step equals torch's AdamW step with clipping, the full weights and AdamW
state read back equal torch's (named form), a checkpoint's state loads into a fresh engine, ZeRO-3 gathers its
partitioned weights for uneven forwards, and ``weights_copy`` copies a ZeRO policy.

Long: ``torchrun`` with 2 CPU processes (gloo) on ``model=tiny`` against one process on the same data and seed. ZeRO-2:
the logged loss, reward and gradient norm equal the single-process run's within 1e-5 relative, one MLflow run is
created, and the checkpoint resumes under ZeRO-2 (DeepSpeed's own launcher) and on one process to the uninterrupted
run's step 3. ZeRO-3: the
first step equals the single-process one (with and without a KL reference, a full copy of the partitioned policy on
each process); a resume under ZeRO-3 equals the uninterrupted ZeRO-3 run, and its checkpoint resumed on one process
samples the same next step (why later steps are not compared with one process: the ZeRO-3 test's docstring). LoRA
under ZeRO-2 logs the single-process LoRA run and resumes on one process; under ZeRO-3 it samples the same first step.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest
import torch

from rlexp.config.schema import ConfigError
from rlexp.trainer.zero import check_settings, engine_config
from tests.algorithms.batches import tiny_policy
from tests.trainer.test_distributed import VENV_BIN, _assert_equal_steps, _launch, _mlflow_runs


def test_settings_refuse_what_rlexp_owns_and_name_the_stage():
    assert check_settings({"zero_optimization": {"stage": 2}}) == 2
    assert check_settings({"zero_optimization": {"stage": 3, "overlap_comm": True}}) == 3
    with pytest.raises(ConfigError, match="distributed.deepspeed.gradient_accumulation_steps is set by rlexp"):
        check_settings({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 4})
    with pytest.raises(ConfigError, match="distributed.deepspeed.optimizer is set by rlexp"):
        check_settings({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}})
    with pytest.raises(ConfigError, match=r"zero_optimization.stage=1: rlexp runs ZeRO stage 2 or 3"):
        check_settings({"zero_optimization": {"stage": 1}})
    with pytest.raises(ConfigError, match=r"zero_optimization.stage=None"):
        check_settings({})


def test_what_zero_cannot_carry_is_named():
    """Checked at start, before DeepSpeed's engine exists: what FSDP refuses plus DeepSpeed's own refusals, each named
    (no process group is needed for the check)."""
    from pathlib import Path
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    import rlexp
    from rlexp.trainer.distributed import Distributed, DistributedSettings

    node = OmegaConf.load(Path(rlexp.__file__).parent / "conf" / "distributed" / "deepspeed_zero2.yaml")
    two = Distributed(DistributedSettings.from_config(node), 0, world_size=2, rank=0, local_rank=0, device="cpu")
    cfg = OmegaConf.create({"model": {"peft": None}, "trainer": {"compile": False}})
    algorithm = SimpleNamespace(
        reference=SimpleNamespace(model=None, kind="ema"),  # carried
        needs_reference=True,
        reincarnate_at=None,
        action_mask=None,
        extragradient=False,
        slow_fast=SimpleNamespace(fast_steps=3),
        curvature_mask=object(),
        top_entropy_quantile=0.2,
        top_entropy_normaliser="selected",
    )
    with pytest.raises(ConfigError) as refused:
        two.prepare_sharded(cfg, algorithm, None)
    message = str(refused.value)
    assert message.startswith("distributed=deepspeed_zero2 with 2 processes is not available with: ")
    named = [part.split(" ")[0] for part in message.split(": ", 1)[1].split("; ")]
    assert named == ["algorithm.curvature_mask", "algorithm.top_entropy_normaliser=selected", "algorithm.slow_fast"]


def test_engine_config_carries_the_step_rlexp_owns():
    user = {"zero_optimization": {"stage": 3}}
    c = engine_config(user, 1.0, torch.float32)
    assert c["zero_optimization"] == {"stage": 3}
    assert c["managed_gradient_accumulation"] is False and c["gradient_accumulation_steps"] == 1
    assert c["gradient_clipping"] == 1.0 and "bf16" not in c
    assert engine_config(user, 0.0, torch.bfloat16)["bf16"] == {"enabled": True}
    assert engine_config(user, None, torch.float32)["gradient_clipping"] == 0.0  # no clipping


@pytest.fixture(scope="module")
def deepspeed_world_of_one(tmp_path_factory):
    """A real gloo process group of one process (DeepSpeed's engine over a data-parallel world of one), one for the
    module: DeepSpeed caches its process groups, as a run (one group per process) may."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra (.ci/run installs it)")
    import torch.distributed as dist

    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    assert not dist.is_initialized()
    store = dist.FileStore(str(tmp_path_factory.mktemp("zero") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        import deepspeed.utils.groups as groups

        groups._WORLD_GROUP = groups._DATA_PARALLEL_GROUP = None  # cached over the destroyed group
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loss(model, ids):
    return model(input_ids=ids).logits.float().logsumexp(-1).mean()


@pytest.mark.parametrize("stage", [2, 3])
def test_engine_steps_like_adamw_and_round_trips_its_state(deepspeed_world_of_one, stage):
    from rlexp.models.copies import weights_copy, zero_stage
    from rlexp.trainer.zero import ZeRO

    ids = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6, 7]])]
    plain = tiny_policy(layers=2, tied=True)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.1)
    for x in ids:  # two micro-batches, one optimiser step, clipped to 0.5
        _loss(plain, x).backward()
    want_norm = float(torch.nn.utils.clip_grad_norm_(list(plain.parameters()), 0.5))
    opt.step()

    model = tiny_policy(layers=2, tied=True)
    z = ZeRO(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), _settings(stage), 0.5, 1)
    assert zero_stage(model) == stage
    for x in ids:  # the update's forwards go through the engine (rlexp.trainer.loop: train_model)
        z.backward(_loss(z.engine, x))
    assert z.step() == pytest.approx(want_norm, rel=1e-5)  # the global norm before clipping

    weights = z.full_model_state(model)
    for k, v in plain.state_dict().items():
        assert torch.allclose(weights[k], v, atol=1e-5), (k, float((weights[k] - v).abs().max()))
    state = z.full_optimizer_state(model)
    names = [n for n, _ in plain.named_parameters()]
    assert state["param_groups"][0]["params"] == names and state["param_groups"][0]["weight_decay"] == 0.1
    for n, p in plain.named_parameters():
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(state["state"][n][k], opt.state[p][k].view_as(state["state"][n][k]), atol=1e-7)
        assert float(state["state"][n]["step"]) == 1.0

    with z.gathered(model), torch.no_grad():  # ZeRO-3: the full weights for uneven forwards (a rollout)
        for x in ids:
            assert torch.allclose(model(input_ids=x).logits, plain(input_ids=x).logits, atol=1e-5)
    copy = weights_copy(model)  # a plain module again: rebuilt from the config and the (gathered) weights
    assert zero_stage(copy) == 0 and torch.allclose(copy(input_ids=ids[0]).logits, plain(input_ids=ids[0]).logits)
    _assert_ema_reads_the_full_weights(model, plain)

    # a single-process checkpoint (numbered AdamW state) into a fresh engine, then one more step on each side
    fresh = tiny_policy(layers=2, tied=True, seed=1)
    z2 = ZeRO(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=0.1), _settings(stage), 0.5, 1)
    missing, unexpected = z2.load_model_state(fresh, plain.state_dict())
    assert not unexpected and not [m for m in missing if "lm_head" not in m]
    z2.load_optimizer_state(fresh, None, opt.state_dict())
    opt.zero_grad()
    _loss(plain, ids[0]).backward()
    torch.nn.utils.clip_grad_norm_(list(plain.parameters()), 0.5)
    opt.step()
    z2.backward(_loss(z2.engine, ids[0]))
    z2.step()
    for k, v in plain.state_dict().items():
        assert torch.allclose(z2.full_model_state(fresh)[k], v, atol=1e-5), k


def _assert_ema_reads_the_full_weights(model, plain):
    """An EMA reference's update (and ReMix's reset, decay 0) from the sharded policy, outside any gathering, is the
    one from the plain policy with the same weights."""
    from rlexp.algorithms.regularisers.reference import ema_update

    for decay in (0.9, 0.0):
        got, want = tiny_policy(layers=2, tied=True, seed=1), tiny_policy(layers=2, tied=True, seed=1)
        ema_update(got, model, decay)
        ema_update(want, plain, decay)
        for (n, a), b in zip(got.named_parameters(), want.parameters(), strict=True):
            assert torch.allclose(a, b, atol=1e-5), (decay, n)
        start = tiny_policy(layers=2, tied=True, seed=1).model.embed_tokens.weight
        assert not torch.allclose(got.model.embed_tokens.weight, start, atol=1e-3)  # it moved toward the policy


def _settings(stage: int) -> dict:
    return {"zero_optimization": {"stage": stage}}


def test_deepspeed_refuses_other_optimizers(deepspeed_world_of_one):
    from rlexp.trainer.zero import ZeRO

    model = tiny_policy()
    with pytest.raises(ConfigError, match="optimizer=SGD"):
        ZeRO(model, torch.optim.SGD(model.parameters(), lr=0.1), _settings(2), 1.0, 1)


# ---- two processes ----------------------------------------------------------------------------------------------
SINGLE = [sys.executable, "-m", "rlexp.cli"]
PLAIN = ["trainer.share_prompt_forward=false"]  # ZeRO runs one forward per micro-batch: the same in both


def _torchrun() -> list[str]:
    return [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "rlexp.cli"]


def _deepspeed_launcher() -> list[str]:
    """DeepSpeed's own launcher (2 local processes; on a CPU machine its --num_gpus is the process count), without
    the --local_rank argument it would otherwise append (Hydra takes overrides only)."""
    port = str(_free_port())
    return [str(VENV_BIN / "deepspeed"), "--num_gpus", "2", "--master_port", port, "--no_local_rank", "--module"]


@pytest.mark.long
def test_zero2_logs_the_single_process_run_and_resumes_anywhere(tmp_path):
    """torchrun with 2 CPU processes under distributed=deepspeed_zero2 gives one process's steps, in one MLflow run; its
    full-state checkpoint resumes under ZeRO-2 (launched by DeepSpeed's own launcher) and on a single process to the
    uninterrupted run's step 3."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra (.ci/run installs it)")
    zero = ["distributed=deepspeed_zero2", *PLAIN]
    single = _launch(SINGLE, ["trainer.max_steps=3", *PLAIN], tmp_path / "one", tmp_path / "one.db")
    assert single[0]["reward/std"] > 0 and single[0]["grad_norm"] > 0  # a real update

    run_dir, db = tmp_path / "zero", tmp_path / "zero.db"
    two = _launch(_torchrun(), ["trainer.max_steps=2", *zero], run_dir, db)
    _assert_equal_steps(single, two)
    assert all("train/idle_micro_batches" in r for r in two)
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1, "only the main process creates a tracker run"

    copy_dir = tmp_path / "zero-on-one"
    shutil.copytree(run_dir, copy_dir, ignore=shutil.ignore_patterns(".run.lock"))
    resumed = _launch(_deepspeed_launcher() + ["rlexp.cli"], ["trainer.max_steps=3", *zero], run_dir, db)
    _assert_equal_steps(single, resumed)  # resumed under DeepSpeed's own launcher
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", "the resume continues the same tracker run"

    one = _launch(SINGLE, ["trainer.max_steps=3", *PLAIN], copy_dir, tmp_path / "copy.db")  # ZeRO state, 1 process
    _assert_equal_steps(single, one)


@pytest.mark.long
def test_zero3_logs_the_single_process_step_and_resumes_anywhere(tmp_path):
    """distributed=deepspeed_zero3 on 2 CPU processes: its first step is the single-process one; later steps are not
    compared with one process, because ZeRO-3's gradients differ from plain torch's in the last bits (measured: up to
    2e-8 absolute on a world of one; on 2 processes the full gradient is the single-process one within 2.3e-7
    relative) and AdamW's first steps scale each update by its gradient's own size, so entries with near-zero
    gradients move differently and the next rollouts differ. What a resume must give is compared
    exactly instead: ZeRO-3 resumed to step 3 is the uninterrupted ZeRO-3 run, and its checkpoint resumed on one
    process samples the same step 3 (same weights, same per-group sampling streams)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra (.ci/run installs it)")
    zero = ["distributed=deepspeed_zero3", *PLAIN]
    single = _launch(SINGLE, ["trainer.max_steps=1", *PLAIN], tmp_path / "one", tmp_path / "one.db")
    full = _launch(_torchrun(), ["trainer.max_steps=3", *zero], tmp_path / "full", tmp_path / "full.db")
    _assert_equal_steps(single, full[:1])
    assert all("train/idle_micro_batches" in r for r in full)

    run_dir, db = tmp_path / "zero", tmp_path / "zero.db"
    _launch(_torchrun(), ["trainer.max_steps=2", *zero], run_dir, db)
    copy_dir = tmp_path / "zero-on-one"
    shutil.copytree(run_dir, copy_dir, ignore=shutil.ignore_patterns(".run.lock"))
    resumed = _launch(_torchrun(), ["trainer.max_steps=3", *zero], run_dir, db)
    _assert_equal_steps(full, resumed)
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", "one MLflow run, continued by the resume"

    one = _launch(SINGLE, ["trainer.max_steps=3", *PLAIN], copy_dir, tmp_path / "copy.db")  # ZeRO-3 state, 1 process
    _assert_equal_steps(full[2:], one[2:])


EMA_REFERENCE = [
    "trainer.max_steps=3",
    "trainer.checkpoint_every=0",
    "algorithm.kl.coef=0.05",
    "algorithm.reference.kind=ema",
    "algorithm.reference.ema_interval=1",
    "algorithm.reference.ema_decay=0.5",
    *PLAIN,
]


def assert_ema_reference_runs_as_one_process(tmp_path, launcher: list[str], strategy: str) -> None:
    """An EMA KL reference (updated every step, decay 0.5) on 2 processes under ``strategy`` logs the single-process
    run's steps and KL, and updates every step."""
    single = _launch(SINGLE, EMA_REFERENCE, tmp_path / "one", tmp_path / "one.db")
    two = _launch(launcher, [*EMA_REFERENCE, strategy], tmp_path / "two", tmp_path / "two.db")
    _assert_equal_steps(single, two)
    assert [r["kl/mean"] for r in two] == pytest.approx([r["kl/mean"] for r in single], rel=1e-5)
    assert all(r["reference/ema_updates"] == 1.0 for r in two) and two[2]["kl/mean"] > 0


@pytest.mark.long
def test_zero2_with_an_ema_reference(tmp_path):
    """An EMA KL reference under ZeRO-2 (a full copy on each process, updated after every optimiser step from the
    policy's weights) gives the single-process run's steps, its KL included."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra (.ci/run installs it)")
    assert_ema_reference_runs_as_one_process(tmp_path, _torchrun(), "distributed=deepspeed_zero2")


@pytest.mark.long
def test_zero3_with_a_kl_reference(tmp_path):
    """A frozen KL reference under ZeRO-3 is a full copy of the partitioned policy on each process (weights_copy). The
    first step's rollout is the single-process one; its update metrics average two optimiser steps, the second of
    which starts from weights that differ in AdamW's near-zero-gradient entries (see the test above), so they are
    compared within a few percent, and the KL is positive: the policy moved away from its reference."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra (.ci/run installs it)")
    kl = ["trainer.max_steps=1", "trainer.checkpoint_every=0", "algorithm.kl.coef=0.05", *PLAIN]
    single = _launch(SINGLE, kl, tmp_path / "one", tmp_path / "one.db")[0]
    two = _launch(_torchrun(), [*kl, "distributed=deepspeed_zero3"], tmp_path / "two", tmp_path / "two.db")[0]
    for k in ("reward/mean", "reward/std", "length/mean", "batch/completions", "ratio/max"):
        assert two[k] == pytest.approx(single[k], rel=1e-6), k
    assert two["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    for k in ("loss/total", "kl/mean"):
        assert two[k] == pytest.approx(single[k], rel=0.05), k
    assert two["kl/mean"] > 0


@pytest.mark.long
def test_lora_under_zero(tmp_path):
    """model/peft=lora under DeepSpeed: ZeRO partitions the adapters' gradients and AdamW state (the frozen base is
    replicated under ZeRO-2, partitioned under ZeRO-3). ZeRO-2 on 2 processes logs the single-process LoRA run's steps,
    its checkpoint holds the adapters only and resumes on one process to that run's step 3; ZeRO-3 samples the same
    first rollout (its update parts in the last bits, as above) and checkpoints the adapters."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra (.ci/run installs it)")
    lora = ["model/peft=lora", "optimizer.lr=1e-3", *PLAIN]  # adapters move visibly in a step at this rate
    single = _launch(SINGLE, ["trainer.max_steps=3", *lora], tmp_path / "one", tmp_path / "one.db")
    run_dir = tmp_path / "zero2"
    two = _launch(
        _torchrun(), ["trainer.max_steps=2", "distributed=deepspeed_zero2", *lora], run_dir, tmp_path / "z2.db"
    )
    _assert_equal_steps(single, two)
    model_files = sorted(p.name for p in (run_dir / "checkpoints" / "last" / "model").iterdir())
    assert "adapter_model.safetensors" in model_files and "model.safetensors" not in model_files
    one = _launch(SINGLE, ["trainer.max_steps=3", *lora], run_dir, tmp_path / "z2.db")  # ZeRO-2 state, 1 process
    _assert_equal_steps(single, one)

    run3 = tmp_path / "zero3"
    three = _launch(
        _torchrun(), ["trainer.max_steps=1", "distributed=deepspeed_zero3", *lora], run3, tmp_path / "z3.db"
    )
    for k in ("reward/mean", "reward/std", "length/mean", "batch/completions"):
        assert three[0][k] == pytest.approx(single[0][k], rel=1e-6), k
    assert (run3 / "checkpoints" / "last" / "model" / "adapter_model.safetensors").exists()
