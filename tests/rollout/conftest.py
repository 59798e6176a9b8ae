import pytest
import torch
from omegaconf import OmegaConf

from rlexp.models.loading import load_model
from rlexp.train import CONF_DIR


@pytest.fixture(scope="module")
def tiny():
    return load_model(OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml"), torch.device("cpu"))


def chat_prompts(tok, n=3):
    """Chat-templated prompts of different lengths (left padding and position ids are exercised)."""
    return [tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {7 * i + 3}?" * (i + 1)}],
                                    tokenize=False, add_generation_prompt=True) for i in range(n)]
