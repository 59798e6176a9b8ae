"""Sharded training (``distributed=fsdp``, rlexp/trainer/sharding.py; PyTorch FSDP2).

Default suite: the settings are checked naming the key; the FSDP units are the decoder layers; optimiser states move
between the numbered (single-process) and named (sharded) forms; what FSDP cannot carry is named; and on a world of one
process (a real gloo group) the sharded tiny model's gathered forward, idle pass, weights copy and full-state
round trip.

Long: ``torchrun`` with 2 CPU processes (gloo) on ``model=tiny`` against one process on the same data and seed — the
logged loss, reward and gradient norm equal the single-process run's within 1e-5 relative, one MLflow run is created,
and the FSDP checkpoint resumes under FSDP and on one process to the uninterrupted run's next step; the same with a KL
reference (a full copy of the sharded policy on each process); LoRA under FSDP (the same, and its adapter checkpoint
resumes both ways). Default: LoRA over a sharded model trains only the adapters and round-trips them by name.
"""

from __future__ import annotations

import shutil
import sys
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.config.schema import ConfigError
from rlexp.models.copies import is_sharded, weights_copy
from rlexp.trainer.sharding import (
    FSDPSettings,
    full_model_state,
    gathered,
    idle_pass,
    keyed_by_name,
    load_model_state,
    load_optimizer_state,
    named_optimizer_state,
    shard_model,
    sharded_blocks,
    unsupported,
)
from tests.algorithms.batches import tiny_policy
from tests.trainer.test_distributed import VENV_BIN, _assert_equal_steps, _launch, _mlflow_runs
from tests.trainer.test_zero import _assert_ema_reads_the_full_weights, assert_ema_reference_runs_as_one_process


def _tiny():
    return tiny_policy(layers=2, tied=True)  # two FSDP units and the root, a tied head


def test_settings_name_an_unknown_key():
    assert FSDPSettings.from_dict(None).reshard_after_forward is True
    assert FSDPSettings.from_dict({"reshard_after_forward": False}).reshard_after_forward is False
    with pytest.raises(ConfigError, match="distributed.fsdp.offload is not a setting"):
        FSDPSettings.from_dict({"offload": True})


def test_units_are_the_decoder_layers():
    model = _tiny()
    assert [type(b).__name__ for b in sharded_blocks(model)] == ["LlamaDecoderLayer", "LlamaDecoderLayer"]
    with pytest.raises(ValueError, match="names no blocks to shard"):
        sharded_blocks(torch.nn.Linear(2, 2))


def test_optimiser_states_move_between_numbered_and_named():
    """A single-process checkpoint numbers the trainable parameters in order; the sharded form names them."""
    m = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 1))
    m[0].weight.requires_grad_(False)  # frozen: not in the optimiser, so index 0 is 1.weight
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=0.1)
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    numbered = opt.state_dict()
    named = named_optimizer_state(m, numbered)
    assert not keyed_by_name(numbered) and keyed_by_name(named)
    assert named["param_groups"][0]["params"] == ["1.weight", "1.bias"]
    assert torch.equal(named["state"]["1.bias"]["exp_avg"], numbered["state"][1]["exp_avg"])
    # the bias's gradient is 1, so AdamW's first moment after one step is (1 - 0.9) * 1
    assert named["state"]["1.bias"]["exp_avg"].item() == pytest.approx(0.1)
    m2 = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 1))
    m2[0].weight.requires_grad_(False)
    opt2 = torch.optim.AdamW([p for p in m2.parameters() if p.requires_grad], lr=0.5)
    load_optimizer_state(m2, opt2, named)  # a named state into a plain optimiser (an FSDP checkpoint on one process)
    assert opt2.param_groups[0]["lr"] == 0.1
    assert torch.equal(opt2.state_dict()["state"][1]["exp_avg"], numbered["state"][1]["exp_avg"])


def _algorithm(**kw):
    base = dict(
        reference=SimpleNamespace(model=None, kind="frozen"),
        needs_reference=False,
        reincarnate_at=None,
        action_mask=None,
        extragradient=False,
        slow_fast=SimpleNamespace(fast_steps=0),
    )
    return SimpleNamespace(**{**base, **kw})


def test_what_fsdp_cannot_carry_is_named():
    cfg = OmegaConf.create({"model": {"peft": None}, "trainer": {"compile": False}})
    assert unsupported(cfg, _algorithm(needs_reference=True)) == []  # a frozen reference is copied
    cfg = OmegaConf.create({"model": {"peft": {"r": 8}}, "trainer": {"compile": True}})  # LoRA is carried
    # LoRA, an EMA reference and ReMix's reincarnation are carried; a compiled forward is not
    ema = _algorithm(needs_reference=True, reference=SimpleNamespace(model=None, kind="ema"), reincarnate_at=3)
    assert unsupported(cfg, ema) == ["trainer.compile=true (a compiled forward over FSDP units is not tested here)"]
    egpo = _algorithm(extragradient=True, slow_fast=SimpleNamespace(fast_steps=3), critic=object())  # SFPO is carried
    reasons = [r.split(" (")[0] for r in unsupported(cfg, egpo)]
    assert reasons == ["trainer.compile=true", "an algorithm with a critic", "algorithm.extragradient"]


@pytest.fixture
def world_of_one(tmp_path):
    """A real gloo process group of one process (FSDP2 over a mesh of one), destroyed afterwards."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_sharded_model_gathers_idles_copies_and_round_trips(world_of_one):
    from torch.distributed.tensor import DTensor

    plain = _tiny()
    model = _tiny()
    units = shard_model(model, FSDPSettings())
    assert len(units) == 3 and is_sharded(model) and not is_sharded(plain)  # two layers and the root
    assert isinstance(model.model.layers[0].mlp.up_proj.weight, DTensor)
    ids = torch.tensor([[1, 2, 3, 4]])
    want = plain(input_ids=ids).logits
    with torch.no_grad(), gathered(model):  # full parameters, plain tensors, until the block ends
        assert not isinstance(model.model.layers[0].mlp.up_proj.weight, DTensor)
        for _ in range(3):
            got = model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-6)
    assert isinstance(model.model.layers[0].mlp.up_proj.weight, DTensor)  # resharded

    copy = weights_copy(model)  # FSDP refuses deepcopy: rebuilt from the config and the gathered weights
    assert not is_sharded(copy) and torch.allclose(copy(input_ids=ids).logits, want, atol=1e-6)
    _assert_ema_reads_the_full_weights(model, plain)

    idle_pass(model)  # a forward and backward that changes nothing
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(float(g.full_tensor().abs().max()) == 0.0 for g in grads)

    state = full_model_state(model)
    assert torch.equal(state["model.norm.weight"], plain.model.norm.weight.detach())
    with torch.no_grad():
        plain.model.norm.weight.add_(1.0)
    missing, unexpected = load_model_state(model, plain.state_dict())
    assert not unexpected and not [m for m in missing if "lm_head" not in m]
    assert torch.equal(full_model_state(model)["model.norm.weight"], plain.model.norm.weight.detach())


def test_the_distance_of_a_sharded_parameter_is_over_its_full_tensor(world_of_one):
    """SFPO's fast displacement and EGPO's look-ahead distance sum ‖θ − θ_0‖² over every process's shard (a plain
    tensor as is): (3, 4) against 0 is 25 either way. Two processes: test_sfpo_under_fsdp."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    from rlexp.trainer.slow_fast import squared_distance

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    p = DTensor.from_local(torch.tensor([3.0, 4.0]), mesh, [Shard(0)])
    assert squared_distance(p, torch.zeros_like(p)) == 25.0
    assert squared_distance(torch.tensor([3.0, 4.0]), torch.zeros(2)) == 25.0


LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _lora_tiny():
    from rlexp.models.peft import apply_lora

    torch.manual_seed(0)
    return apply_lora(_tiny(), LORA)


def test_lora_over_a_sharded_model_trains_the_adapters_and_round_trips(world_of_one, tmp_path):
    """model.peft under FSDP: the PeftModel is sharded (frozen base included); only the adapters get gradients; the
    reference (adapters off) is the base; the adapters saved from the gathered full state load back into a fresh
    sharded model by name, and a mismatched checkpoint is named."""
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor

    from rlexp.models.peft import AdaptersOff
    from rlexp.trainer.sharding import load_adapters

    base = _tiny()
    model = _lora_tiny()
    shard_model(model, FSDPSettings())
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(q.base_layer.weight, DTensor) and isinstance(q.lora_A["default"].weight, DTensor)
    ids = torch.tensor([[1, 2, 3, 4]])
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all(".lora_" in n for n in trained)
    assert trained == {n for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():  # adapters visibly on: B away from its zero start
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
        with gathered(model):
            on = model(input_ids=ids).logits
            off = AdaptersOff(model)(input_ids=ids).logits
    assert torch.allclose(off, base(input_ids=ids).logits, atol=1e-6) and not torch.allclose(on, off, atol=1e-3)

    model.save_pretrained(tmp_path / "ck", state_dict=full_model_state(model))
    saved = load_file(str(tmp_path / "ck" / "adapter_model.safetensors"))
    assert saved and all(".lora_" in k and ".default" not in k for k in saved)
    fresh = _lora_tiny()
    shard_model(fresh, FSDPSettings())
    load_adapters(fresh, saved, tmp_path / "ck")
    with torch.no_grad(), gathered(fresh):
        assert torch.allclose(fresh(input_ids=ids).logits, on, atol=1e-6)
    with pytest.raises(RuntimeError, match=r"does not match the model's adapters: missing=\['base_model"):
        load_adapters(fresh, {k: v for k, v in saved.items() if "layers.0." not in k}, "ck")
    with pytest.raises(RuntimeError, match="holds LoRA adapters but the model has none"):
        load_adapters(base, saved, "ck")


# ---- two processes ----------------------------------------------------------------------------------------------
SINGLE = [sys.executable, "-m", "rlexp.cli"]
FSDP = ["distributed=fsdp", "trainer.share_prompt_forward=false"]


def _torchrun() -> list[str]:
    return [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "rlexp.cli"]


@pytest.mark.long
def test_fsdp_logs_the_single_process_run_and_resumes_anywhere(tmp_path):
    """torchrun with 2 CPU processes under distributed=fsdp gives one process's steps (shared-prompt forwards off in
    both: FSDP runs one forward per micro-batch), in one MLflow run; its full-state checkpoint resumes under FSDP and
    on a single process to the uninterrupted run's step 3."""
    plain = ["trainer.share_prompt_forward=false"]
    single = _launch(SINGLE, ["trainer.max_steps=3", *plain], tmp_path / "one", tmp_path / "one.db")
    assert single[0]["reward/std"] > 0 and single[0]["grad_norm"] > 0  # a real update

    run_dir, db = tmp_path / "fsdp", tmp_path / "fsdp.db"
    two = _launch(_torchrun(), ["trainer.max_steps=2", *FSDP], run_dir, db)
    _assert_equal_steps(single, two)
    assert all("train/idle_micro_batches" in r for r in two)
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1, "only the main process creates a tracker run"
    ckpt = run_dir / "checkpoints" / "last"
    assert sorted(p.name for p in (ckpt / "model").glob("*.safetensors")) == ["model.safetensors"]  # full weights

    copy_dir = tmp_path / "fsdp-on-one"
    shutil.copytree(run_dir, copy_dir, ignore=shutil.ignore_patterns(".run.lock"))
    resumed = _launch(_torchrun(), ["trainer.max_steps=3", *FSDP], run_dir, db)
    _assert_equal_steps(single, resumed)
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", "the resume continues the same tracker run"

    one = _launch(SINGLE, ["trainer.max_steps=3", *plain], copy_dir, tmp_path / "copy.db")  # FSDP state, 1 process
    _assert_equal_steps(single, one)


@pytest.mark.long
def test_fsdp_with_a_kl_reference(tmp_path):
    """A frozen KL reference under FSDP is a full copy of the sharded policy on each process (weights_copy)."""
    kl = ["trainer.max_steps=2", "trainer.checkpoint_every=0", "algorithm.kl.coef=0.05"]
    single = _launch(SINGLE, [*kl, "trainer.share_prompt_forward=false"], tmp_path / "one", tmp_path / "one.db")
    two = _launch(_torchrun(), [*kl, *FSDP], tmp_path / "two", tmp_path / "two.db")
    _assert_equal_steps(single, two)
    assert [r["kl/mean"] for r in two] == pytest.approx([r["kl/mean"] for r in single], rel=1e-5)
    assert two[1]["kl/mean"] > 0  # the policy moved away from its reference


@pytest.mark.long
def test_fsdp_with_an_ema_reference(tmp_path):
    """An EMA KL reference under FSDP (a full copy on each process, updated after every optimiser step from the
    sharded policy's full parameters) gives the single-process run's steps, its KL included."""
    assert_ema_reference_runs_as_one_process(tmp_path, _torchrun(), "distributed=fsdp")


@pytest.mark.long
def test_an_action_mask_under_fsdp(tmp_path):
    """NLPO's learned action mask on GRPO (NLPO itself has a critic, which distributed training refuses) under FSDP:
    the masking model is a full copy on each process, synced every step from the sharded policy's full parameters;
    the run logs the single-process run's steps and allowed-token counts."""
    masked = [
        "+algorithm.action_mask={top_p: 0.9, sync_every: 1}",
        "trainer.max_steps=3",
        "trainer.checkpoint_every=0",
        "trainer.share_prompt_forward=false",
    ]
    single = _launch(SINGLE, masked, tmp_path / "one", tmp_path / "one.db")
    two = _launch(_torchrun(), [*masked, "distributed=fsdp"], tmp_path / "two", tmp_path / "two.db")
    _assert_equal_steps(single, two)
    assert all(r["action_mask/synced"] == 1.0 for r in two)
    assert [r["action_mask/allowed"] for r in two] == pytest.approx(
        [r["action_mask/allowed"] for r in single], rel=1e-5
    )


@pytest.mark.long
def test_sfpo_under_fsdp(tmp_path):
    """SFPO (algorithm=sfpo: K fast passes, the reposition θ_0 + α(θ_K − θ_0), the slow pass) under FSDP: the slow
    weights are snapshots of each process's shards and the reposition moves the shards; the fast trajectory's length
    is reduced over the shards, so the run logs the single-process run's steps and displacement."""
    sfpo = ["algorithm=sfpo", "trainer.max_steps=2", "trainer.checkpoint_every=0", "trainer.share_prompt_forward=false"]
    single = _launch(SINGLE, sfpo, tmp_path / "one", tmp_path / "one.db")
    two = _launch(_torchrun(), [*sfpo, "distributed=fsdp"], tmp_path / "two", tmp_path / "two.db")
    _assert_equal_steps(single, two)
    assert two[0]["sfpo/fast_displacement"] > 0
    assert [r["sfpo/fast_displacement"] for r in two] == pytest.approx(
        [r["sfpo/fast_displacement"] for r in single], rel=1e-5
    )


@pytest.mark.long
def test_lora_under_fsdp(tmp_path):
    """model/peft=lora under FSDP on 2 processes: the sharded base, adapters trained, logs the single-process LoRA
    run's steps with a KL reference (the base with adapters off); its checkpoint holds the adapters only and resumes
    under FSDP and on one process to that run's step 3."""
    lora = ["model/peft=lora", "optimizer.lr=1e-3", "algorithm.kl.coef=0.05", "trainer.share_prompt_forward=false"]
    single = _launch(SINGLE, ["trainer.max_steps=3", *lora], tmp_path / "one", tmp_path / "one.db")
    run_dir, db = tmp_path / "fsdp", tmp_path / "fsdp.db"
    two = _launch(_torchrun(), ["trainer.max_steps=2", "distributed=fsdp", *lora], run_dir, db)
    _assert_equal_steps(single, two)
    assert two[1]["kl/mean"] > 0  # the adapters moved the policy away from the base
    model_files = sorted(p.name for p in (run_dir / "checkpoints" / "last" / "model").iterdir())
    assert "adapter_model.safetensors" in model_files and "model.safetensors" not in model_files

    copy_dir = tmp_path / "fsdp-on-one"
    shutil.copytree(run_dir, copy_dir, ignore=shutil.ignore_patterns(".run.lock"))
    resumed = _launch(_torchrun(), ["trainer.max_steps=3", "distributed=fsdp", *lora], run_dir, db)
    _assert_equal_steps(single, resumed)
    one = _launch(SINGLE, ["trainer.max_steps=3", *lora], copy_dir, tmp_path / "copy.db")  # FSDP state, 1 process
    _assert_equal_steps(single, one)
