"""Budget and effort prompts: the length a completion is asked for, written into its prompt.

* ``BudgetPrefill`` (HBPO, "Hierarchical Budget Policy Optimization for Adaptive Reasoning", 2025; arXiv 2507.15844):
  the group splits into subgroups, one per token budget b, each prompted with the released code's assistant-turn
  prefill "I will answer the question with {b} tokens".
* ``EffortPrompt`` (e1, "Learning Adaptive Control of Reasoning Effort", 2025; arXiv 2510.27042): each subgroup is
  asked for a fraction r of the query's usual reasoning length.

``position``: ``assistant`` — the text goes after the chat template's generation prompt, opening the assistant's turn
(HBPO's prefill); ``user`` — it is appended to the question, inside the user's turn (e1: the query with its effort).
"""

from __future__ import annotations

from rlexp.core.registry import PROMPT_CONDITIONS

POSITIONS = ("assistant", "user")


class _Condition:
    template: str

    def __init__(self, values, template: str, position: str = "assistant"):
        if position not in POSITIONS:
            raise ValueError(f"algorithm.prompt_condition.position={position!r} is not one of {list(POSITIONS)}")
        self.position = position
        values = [float(v) for v in values]
        if not values or any(v <= 0 for v in values):
            raise ValueError(f"algorithm.prompt_condition.values must be positive numbers, got {values}")
        if "{value}" not in template:
            raise ValueError(f"algorithm.prompt_condition.template must contain '{{value}}', got {template!r}")
        self.values_, self.template = values, template

    def values(self, num_generations: int) -> list[float]:
        """The K condition values of a group of ``num_generations`` completions (G/K each, in this order)."""
        k = len(self.values_)
        if num_generations % k:
            raise ValueError(
                f"algorithm.prompt_condition has {k} values, which do not divide trainer.num_generations="
                f"{num_generations}: each value takes G/K completions"
            )
        return list(self.values_)

    def text(self, value: float) -> str:
        return self.template.format(value=int(value) if float(value).is_integer() else value)

    def render(self, prompt: str, value: float) -> str:
        """The rendered prompt with the condition opening the assistant's turn (``position: assistant``)."""
        return prompt + self.text(value)

    def question(self, question: str, value: float, record: dict | None = None) -> str:
        """The question with the condition appended (``position: user``; rendered by the prompt format after)."""
        return f"{question}\n{self.text(value)}"


@PROMPT_CONDITIONS.register
class BudgetPrefill(_Condition):
    """HBPO's budget subgroups: one token budget per subgroup, stated at the opening of the answer. ``scale``: the
    budgets are ``values`` × scale tokens, rounded (fractions of the generation limit; 1: ``values`` are tokens)."""

    def __init__(
        self,
        values=(512, 1024, 2048, 2560),
        template: str = "<think> I will answer the question with {value} tokens",
        scale: float = 1.0,
        position: str = "assistant",
    ):
        if scale <= 0 or any(float(v) <= 0 for v in values):
            raise ValueError(
                f"algorithm.prompt_condition: values {list(values)} and scale {scale} must be positive numbers"
            )
        super().__init__([max(1, round(float(v) * scale)) for v in values], template, position)


@PROMPT_CONDITIONS.register
class EffortPrompt(_Condition):
    """e1's effort levels: a fraction r of the query's current average reasoning length."""

    def __init__(
        self,
        values=(0.25, 0.5, 0.75, 1.0),
        template: str = "Use about {value} of your usual reasoning length.",
        position: str = "user",
    ):
        super().__init__(values, template, position)
