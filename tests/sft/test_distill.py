"""``rlexp train stage=distill``: GKD through TRL's GKDTrainer in our run (rlexp.sft.distill) — the examples and the
batch layout worked out by hand, the settings' errors, the per-step choice of the outputs with the loss normaliser
counted on the sampled tokens, and a two-step run on the tiny model logging our metric names and saving the model."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import ConfigError, validate
from rlexp.models.loading import load_model
from rlexp.runs.training import run
from rlexp.sft.distill import (
    DistillMethod,
    DistillRun,
    PromptCompletionCollator,
    check_node,
    gkd_trainer_class,
    tokenized_examples,
    translate,
)

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=8"]


class Letters:
    """A tokenizer stub: a → 1, b → 2, ...; end of sequence 0."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) - 96 for c in text]}


def test_tokenized_examples_by_hand():
    rows = [{"prompt": "ab", "completion": "cd"}, {"prompt": "abcd", "completion": "e"}]
    # prompt ids, then the completion and EOS (0), as TRL's SFT appends it
    assert tokenized_examples(rows, Letters(), None) == (
        [{"prompt_ids": [1, 2], "completion_ids": [3, 4, 0]}, {"prompt_ids": [1, 2, 3, 4], "completion_ids": [5, 0]}],
        0,
    )
    # max_length 4 cuts the first completion to 2 tokens; the second prompt fills it: left out and counted
    assert tokenized_examples(rows, Letters(), 4) == ([{"prompt_ids": [1, 2], "completion_ids": [3, 4]}], 1)


def test_collator_left_pads_in_the_gkd_layout():
    batch = PromptCompletionCollator(pad_token_id=9)(
        [{"prompt_ids": [1, 2], "completion_ids": [3, 0]}, {"prompt_ids": [5], "completion_ids": [6, 0]}]
    )
    # sequences 1 2 3 0 (4 tokens) and 5 6 0 (3: one pad on the left); the labels are the completions only
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0], [9, 5, 6, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 0], [-100, -100, 6, 0]]
    assert batch["prompts"].tolist() == [[1, 2], [9, 5]]
    assert batch["prompt_attention_mask"].tolist() == [[1, 1], [0, 1]]


@pytest.mark.parametrize(
    "node,message",
    [
        ({}, "algorithm.teacher=None: GKD needs a teacher"),
        ({"teacher": "t", "lmbda": 1.5}, "algorithm.lmbda=1.5: must be a number in [0, 1]"),
        ({"teacher": "t", "beta": -0.1}, "algorithm.beta=-0.1: must be a number in [0, 1]"),
        ({"teacher": "t", "temperature": 0}, "algorithm.temperature=0: must be > 0"),
        ({"teacher": "t", "data": "gold"}, "algorithm.data='gold': one of ['demonstrations', 'own_samples']"),
        ({"teacher": "t", "max_length": 1}, "algorithm.max_length=1: a number of tokens >= 2"),
        ({"teacher": "t", "options": {"lmbda": 1.0}}, "algorithm.options.lmbda: set by rlexp"),
        ({"teacher": "t", "loss_type": "nll"}, "algorithm.loss_type is not a setting of the distillation stage"),
    ],
)
def test_bad_settings_name_the_key(node, message):
    with pytest.raises(ConfigError) as e:
        check_node(node)
    assert str(e.value).startswith(message)
    if "loss_type" not in node:  # the node's builder checks it too
        with pytest.raises(ConfigError):
            DistillMethod(**node)


def test_stage_distill_composes_and_requires_a_teacher(tiny_cfg):
    cfg = tiny_cfg("stage=distill", "algorithm.teacher=tiny")
    assert cfg.algorithm.name == "gkd" and cfg.algorithm.backend == "sft" and "advantage" not in cfg.algorithm
    assert (cfg.algorithm.lmbda, cfg.algorithm.beta) == (0.5, 0.5) and cfg.run_name.startswith("gkd-")
    validate(cfg)
    with pytest.raises(ConfigError, match=r"^algorithm\.teacher=None: GKD needs a teacher"):
        validate(tiny_cfg("stage=distill"))
    assert tiny_cfg().algorithm.name == "grpo"  # the default run is untouched


def test_translate_by_hand():
    logs = {"loss": 0.5, "on_policy": 1.0, "token_agreement": 0.25, "learning_rate": 1e-5, "extra": 2.0, "s": "x"}
    assert translate(logs) == {
        "distill/loss": 0.5,
        "loss/total": 0.5,
        "distill/on_policy": 1.0,
        "distill/token_agreement": 0.25,
        "lr": 1e-5,
        "trl/extra": 2.0,
    }
    assert translate({"train_runtime": 1.0, "train_loss": 2.0}) == {}


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A teacher unlike the student: the tiny model initialised with another seed, saved as a model directory."""
    node = OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml")
    node.seed = 1
    loaded = load_model(node, torch.device("cpu"))
    path = tmp_path_factory.mktemp("tiny_teacher")
    loaded.model.save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    return path


def test_teacher_by_model_config_name(tiny):
    """``algorithm.teacher=tiny`` loads conf/model/tiny.yaml, frozen; its tokenizer is the student's."""
    holder = SimpleNamespace(teacher_model=None, device=torch.device("cpu"), tok=tiny.tokenizer, model=tiny.model)
    holder.cfg = SimpleNamespace(model=SimpleNamespace(name="tiny-smollm2"))
    teacher = DistillRun.load_teacher(holder, "tiny")
    assert teacher is not tiny.model and not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    assert DistillRun.load_teacher(holder, "tiny") is teacher  # loaded once


def test_one_draw_per_step_and_the_sampled_tokens_normalise(tiny, teacher_dir):
    """λ = 1: both micro-batches of the step are the student's samples (4 tokens each row) and transformers' token
    count is taken on them (4 rows × 4 tokens = 16), not on the dataset's; λ = 0: the dataset's; λ = 0 with seq_kd:
    the teacher's samples."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl.experimental.gkd import GKDConfig

    tok = tiny.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+1?"}], tokenize=False, add_generation_prompt=True
    )
    rows = [{"prompt": prompt, "completion": "The answer is three, as two plus one is three."}] * 4
    examples, _ = tokenized_examples(rows, tok, None)
    collate = PromptCompletionCollator(tok.pad_token_id)
    args = GKDConfig(
        output_dir=str(teacher_dir / "unused"),
        max_steps=1,
        report_to=[],
        use_cpu=True,
        lmbda=1.0,
        max_new_tokens=4,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        gradient_checkpointing=False,
    )
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    trainer = gkd_trainer_class()(
        model=tiny.model,
        teacher_model=teacher,
        args=args,
        data_collator=collate,
        train_dataset=Dataset.from_list(examples),
        processing_class=tok,
    )
    batches = [collate(examples[:2]), collate(examples[2:])]
    dataset_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    assert dataset_tokens == 4 * len(examples[0]["completion_ids"])
    sampled, n = trainer.get_batch_samples(iter(batches), 2, torch.device("cpu"))
    assert trainer.source == "student" and len(sampled) == 2
    assert [int((b["labels"][:, 1:] != -100).sum()) for b in sampled] == [8, 8] and int(n) == 16
    assert all((b["labels"][:, : b["prompts"].shape[1]] == -100).all() for b in sampled)  # prompts out of the loss
    trainer.lmbda = 0.0
    same, n = trainer.get_batch_samples(iter(batches), 2, torch.device("cpu"))
    assert trainer.source == "dataset" and same[0] is batches[0] and int(n) == dataset_tokens
    trainer.seq_kd = True  # the off-policy steps sample from the teacher (sequence-level KD)
    taught, n = trainer.get_batch_samples(iter(batches), 2, torch.device("cpu"))
    assert trainer.source == "teacher" and int(n) == 16 and trainer.generate_s > 0
    assert trainer._metrics["train"]["on_policy"] == [1.0, 0.0, 0.0]
    assert trainer._metrics["train"]["teacher_sampled"] == [0.0, 0.0, 1.0]


@pytest.mark.long  # a tiny training run: the default suite keeps to ten minutes
def test_gkd_two_steps_logs_our_metrics_and_saves_the_model(tiny_cfg, tiny, teacher_dir):
    """λ = 0.8 with seed 0: Python's generator draws 0.84 (> λ: the demonstrations) then 0.76 (≤ λ: the student's
    own samples, at most trainer.max_new_tokens = 8 tokens)."""
    cfg = tiny_cfg(*FAST, "stage=distill", f"algorithm.teacher={teacher_dir}", "algorithm.lmbda=0.8", "eval.size=4")
    result = run(cfg)
    run_dir = Path(cfg.trainer.run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert result.last_step == 2 and [r["step"] for r in rows] == [0, 1, 2]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2]
    first, second = rows[1], rows[2]
    assert (first["distill/on_policy"], second["distill/on_policy"]) == (0.0, 1.0)
    assert second["distill/completion_tokens"] <= 8 < first["distill/completion_tokens"]
    assert second["distill/generate_s"] > 0 == first["distill/generate_s"]
    for r in (first, second):
        assert math.isfinite(r["distill/loss"]) and r["distill/loss"] > 0 and r["loss/total"] == r["distill/loss"]
        assert 0 <= r["distill/token_agreement"] <= 1 and r["distill/teacher_nll"] > 0 and r["grad_norm"] > 0
    assert first["distill/examples"] == 64 and first["distill/skipped"] == 0 and first["distill/too_long"] == 0
    assert json.loads((run_dir / "provenance.json").read_text())["status"] == "FINISHED"
    saved = run_dir / "model"
    assert (saved / "config.json").exists() and (saved / "tokenizer.json").exists()
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(saved)
    before = dict(tiny.model.named_parameters())
    assert any(not torch.equal(p, before[n]) for n, p in trained.named_parameters()), "the student did not move"
