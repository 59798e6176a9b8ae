"""Prompt construction with the model's chat template."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PromptFormat:
    system_prompt: str
    instruction: str = ""
    answer_format: str = "hash"
    # text the reply starts with, appended after the chat template's assistant opening (TFPI's ThinkFree prompt: an
    # empty, closed think block, conf/prompt/think_free.yaml); the completion is what the model writes after it
    reply_prefix: str = ""
    # worked examples shown before the question, as earlier turns of the conversation: a list of chat messages
    # ({role, content}; roles user / assistant / tool ...), e.g. one tool-use exchange for a small model that
    # otherwise never calls its tool (conf/prompt/python_tool.yaml)
    examples: list = field(default_factory=list)
    # the run's prompt-length limit (rlexp.data.lengths.PromptLimit), attached by the trainer at its first step:
    # render() then fits every prompt within it (or refuses it); None: rendered whole
    limit: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        for i, m in enumerate(self.examples):
            if not (isinstance(m, dict) or hasattr(m, "keys")) or not {"role", "content"} <= set(m.keys()):
                raise ValueError(f"prompt.examples[{i}] must be a message {{role, content}}, got {m!r}")
        self.examples = [{"role": str(m["role"]), "content": str(m["content"])} for m in self.examples]

    def messages(self, question: str) -> list[dict]:
        user = f"{question}\n{self.instruction}".strip() if self.instruction else question
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + self.examples + [{"role": "user", "content": user}]

    def render(self, tokenizer, question: str) -> str:
        if self.limit is not None:
            return self.limit.fit(tokenizer, self, question)
        return self.render_full(tokenizer, question)

    def render_full(self, tokenizer, question: str) -> str:
        """The chat-templated prompt of ``question`` (and the ``reply_prefix``), whatever its length."""
        text = tokenizer.apply_chat_template(self.messages(question), add_generation_prompt=True, tokenize=False)
        return text + self.reply_prefix if self.reply_prefix else text
