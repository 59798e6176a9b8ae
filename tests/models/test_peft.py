"""LoRA through peft (model/peft=lora): only the adapters train, the reference is the base with the adapters off
(no copy), the merged weights equal peft's own merge, checkpoints hold the adapters and resume."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from rlexp.algorithms.regularisers.reference import ReferenceModel
from rlexp.config.schema import ConfigError, validate
from rlexp.models.peft import AdaptersOff, apply_lora, merged_state_dict, saved_adapter_names
from rlexp.runs.training import run

LORA = {"method": "lora", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


@pytest.fixture
def lora_model(tiny):
    return apply_lora(copy.deepcopy(tiny.model), LORA)


def ids(tok):
    return tok(["2 + 3 = 5", "7 - 4 = 3"], return_tensors="pt", padding=True)


def randomise_adapters(model, scale=0.5):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(scale * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model/peft=lora", "model.peft.r=0"], r"^model\.peft\.r=0 must be an integer >= 1"),
        (["model/peft=lora", "model.peft.lora_dropout=1.5"], r"^model\.peft\.lora_dropout=1\.5 must be in \[0, 1\)"),
        (["model/peft=lora", "model.peft.target_modules=[]"], r"^model\.peft\.target_modules=\[\]"),
        (["model/peft=lora", "+model.peft.rank=8"], r"^model\.peft\.rank: unknown key"),
        (["model/peft=lora", "model.peft.method=dora"], r"^model\.peft\.method='dora' is not one of"),
    ],
)
def test_bad_lora_settings_name_their_key(tiny_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny_cfg(*overrides))


def test_only_adapters_train_and_the_wrapped_model_starts_as_the_base(tiny, lora_model):
    trainable = [n for n, p in lora_model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 2 * 2  # 2 layers x (q_proj, v_proj) x (A, B)
    x = ids(tiny.tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(lora_model(**x).logits, tiny.model(**x).logits)  # B = 0 at the start
    base_before = {n: p.detach().clone() for n, p in lora_model.named_parameters() if not p.requires_grad}
    opt = torch.optim.SGD([p for p in lora_model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(2):  # B moves on the first step, A on the second (its gradient is B^T ...)
        lora_model(**x).logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    for n, p in lora_model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base_before[n]), n
    with torch.no_grad():
        assert not torch.allclose(lora_model(**x).logits, tiny.model(**x).logits)


def test_the_frozen_reference_is_the_base_with_adapters_off_not_a_copy(tiny, lora_model):
    ref = ReferenceModel(lora_model, "frozen")
    assert isinstance(ref.model, AdaptersOff)
    assert ref.model.state_dict() == {} and ref.state_dict() is None  # holds no weights of its own
    randomise_adapters(lora_model)
    x = ids(tiny.tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(ref.model(**x).logits, tiny.model(**x).logits)
        assert not torch.allclose(lora_model(**x).logits, tiny.model(**x).logits)


def test_the_consistency_judge_under_lora_is_a_copy_of_the_initial_policy(tiny, lora_model):
    from rlexp.evaluation.consistency import ConsistencyMeter

    meter = ConsistencyMeter(judge="reference")
    meter.bind(lora_model, ReferenceModel(lora_model, "frozen"))
    assert not isinstance(meter.reference_model, AdaptersOff)  # the judge generates: a real model, not a view
    randomise_adapters(lora_model)
    x = ids(tiny.tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(meter.reference_model(**x).logits, tiny.model(**x).logits)


def test_saved_adapter_names_are_the_keys_save_pretrained_writes(lora_model, tmp_path):
    """Each trainable parameter's checkpoint key is its name less the adapter's: what a sharded model loads by."""
    from safetensors.torch import load_file

    names = saved_adapter_names(lora_model)
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    assert names[f"{q}.lora_A.weight"] == f"{q}.lora_A.default.weight"
    assert names[f"{q}.lora_B.weight"] == f"{q}.lora_B.default.weight"
    assert all(".default" not in k for k in names)
    lora_model.save_pretrained(tmp_path)
    assert set(load_file(str(tmp_path / "adapter_model.safetensors"))) == set(names)


def test_merged_weights_equal_peft_merge_and_unload(tiny, lora_model):
    randomise_adapters(lora_model)
    merged = merged_state_dict(lora_model)
    reference = copy.deepcopy(lora_model).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys() == tiny.model.state_dict().keys()
    for k in merged:
        torch.testing.assert_close(merged[k], reference[k])
    q = "model.layers.0.self_attn.q_proj.weight"
    layer = lora_model.get_base_model().model.layers[0].self_attn.q_proj
    by_hand = tiny.model.state_dict()[q] + (8 / 4) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    torch.testing.assert_close(merged[q], by_hand)


@pytest.mark.long  # ~10 s: kept out of the default suite (its 10-minute budget)
def test_two_lora_steps_checkpoint_the_adapters_and_resume(tiny_cfg, tmp_path):
    small = [
        "model/peft=lora",
        "model.peft.r=4",
        "algorithm=aspo",
        "trainer.autocast=off",
        "trainer.checkpoint_every=1",
    ]
    cfg = tiny_cfg(*small, "trainer.max_steps=2")
    first = run(cfg)
    run_dir = Path(cfg.trainer.run_dir)
    model_dir = run_dir / "checkpoints" / "last" / "model"
    assert sorted(p.name for p in model_dir.iterdir() if p.suffix in (".json", ".safetensors")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert json.loads((model_dir / "adapter_config.json").read_text())["r"] == 4
    assert "kl/mean" in first.metrics  # aspo's KL to the reference (the base with the adapters off)
    run(tiny_cfg(*small, "trainer.max_steps=3"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/total" in r] == [1, 2, 3]
