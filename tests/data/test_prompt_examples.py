"""Worked examples in a prompt (``PromptFormat.examples``): earlier turns of the conversation between the system
prompt and the question, on SmolLM2's chat template by hand; the tool-use and text-game prompts carry theirs."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.data.prompts import PromptFormat


def test_examples_sit_between_the_system_prompt_and_the_question(tiny):
    fmt = PromptFormat(
        system_prompt="S",
        instruction="I",
        examples=[{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "#### 2"}],
    )
    assert fmt.render(tiny.tokenizer, "Q") == (
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\n1+1?<|im_end|>\n"
        "<|im_start|>assistant\n#### 2<|im_end|>\n"
        "<|im_start|>user\nQ\nI<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_prompt_without_examples_renders_as_before():
    fmt = PromptFormat(system_prompt="S", instruction="I")
    assert fmt.messages("Q") == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q\nI"}]


def test_a_malformed_example_names_its_index():
    with pytest.raises(ValueError, match=r"prompt.examples\[1\] must be a message"):
        PromptFormat(system_prompt="S", examples=[{"role": "user", "content": "a"}, {"text": "b"}])


@pytest.mark.parametrize(
    ("name", "roles"),
    [
        ("python_tool", ["user", "assistant", "tool", "assistant"] * 2),
        ("text_game", ["user", "assistant", "user", "assistant", "user"]),
    ],
)
def test_the_agent_prompts_carry_their_worked_examples(name, roles):
    fmt = instantiate(OmegaConf.load(f"{CONF_DIR}/prompt/{name}.yaml"))
    assert [m["role"] for m in fmt.examples] == roles
    msgs = fmt.messages("Q")
    assert msgs[1 : 1 + len(roles)] == fmt.examples and msgs[-1]["content"].startswith("Q")
