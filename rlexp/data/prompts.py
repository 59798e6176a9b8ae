"""Prompt construction with the model's chat template."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PromptFormat:
    system_prompt: str
    instruction: str = ""
    answer_format: str = "hash"

    def messages(self, question: str) -> list[dict]:
        user = f"{question}\n{self.instruction}".strip() if self.instruction else question
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + [{"role": "user", "content": user}]

    def render(self, tokenizer, question: str) -> str:
        return tokenizer.apply_chat_template(self.messages(question), add_generation_prompt=True, tokenize=False)
