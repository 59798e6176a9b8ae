"""Shared test helpers: compose the train app's config the way the CLI does, on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from rlexp.config.paths import CONF_DIR
from rlexp.models.loading import load_model

TINY = [
    "model=tiny",
    "trainer.max_steps=2",
    "trainer.prompts_per_step=2",
    "trainer.num_generations=4",
    "trainer.max_new_tokens=12",
    "trainer.micro_batch_size=4",
    "tracker=none",
    "trainer.progress=false",
    "dataset.train_size=64",
    "dataset.eval_size=8",
    "trainer.checkpoint_every=0",
    "eval.size=0",  # the default run evaluates 100 held-out prompts at steps 0, 18, 36; tests that evaluate say so
]


def compose_train(overrides: list[str], run_dir: Path, config_name: str = "config"):
    """The composed, hydra-free config (``trainer.run_dir`` set to ``run_dir``)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    OmegaConf.set_readonly(cfg.hydra, False)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
        cfg.hydra.runtime.cwd = str(run_dir)
    HydraConfig.instance().set_config(cfg)  # resolves ${hydra:...} interpolations like the CLI does
    with open_dict(cfg):
        cfg.trainer.run_dir = str(run_dir)
        del cfg["hydra"]
    return cfg


@pytest.fixture
def tiny_cfg(tmp_path):
    def make(*overrides: str, config_name: str = "config"):
        return compose_train([*TINY, *overrides], tmp_path / "run", config_name)

    return make


@pytest.fixture(scope="module")
def tiny():
    """The tiny random model with SmolLM2's tokenizer, loaded once per test module."""
    return load_model(OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml"), torch.device("cpu"))


@pytest.fixture(scope="module")
def prm_path(tiny, tmp_path_factory):
    """The tiny random model (SmolLM2's tokenizer) saved as a causal-LM checkpoint: a random PRM for the process
    reward's tests."""
    path = tmp_path_factory.mktemp("tiny_prm")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return str(path)


def chat_prompts(tok, n=3):
    """Chat-templated prompts of different lengths (left padding and position ids are exercised)."""
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {i} + {7 * i + 3}?" * (i + 1)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(n)
    ]


def decode_state(lm, sampling, step: int = 1):
    """The ``StaticDecodeState`` of a captured-decode rollout (2 × 3 chat prompts, 8 tokens, blocks of 4)
    on ``lm``, rewound to token ``step`` so that more steps fit in its buffers."""
    from rlexp.rollout.decode import DecodeLoop

    tok = lm.tokenizer
    enc = tok(chat_prompts(tok), return_tensors="pt", padding=True, add_special_tokens=False, pad_to_multiple_of=64)
    loop = DecodeLoop(static=True, graph="capture", stop_check_every=4)
    loop.run(lm.model, enc["input_ids"], enc["attention_mask"], 2, 8, [-1], tok.pad_token_id, sampling)
    ((state, _, _),) = loop._states.values()
    state.t.fill_(step)
    return state
