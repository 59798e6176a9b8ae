"""Paraphrase sets: a group's G completions are sampled over K equivalent wordings of its question, G/K each — the
question itself (variant 0) and K − 1 paraphrases from a source (``rlexp.data.paraphrases``). The variant index of
each row goes to ``batch.extras["condition"]``.

* Co-Reward ("Co-Reward: Self-Supervised Reinforcement Learning for Large Language Model Reasoning via Contrastive
  Agreement", 2025; arXiv 2508.00410): K = 2, the original question and its rephrased analogue.
* PS-GRPO (Con-RAG, "Consistency in RAG with Group Similarity Rewards", 2025): rollouts over a paraphrased set.
* Information-consistent GRPO ("Information-Consistent LM Recommendations through GRPO", 2025): a group is a set of
  semantically equivalent prompt variants.
"""

from __future__ import annotations

from rlexp.core.registry import PROMPT_CONDITIONS
from rlexp.data.paraphrases import paraphrase_source


@PROMPT_CONDITIONS.register
class ParaphraseSet:
    """K wordings of each question (variant 0: the question), G/K completions each. ``source``: ``template``
    (offline rule-based rewordings, seeded), ``record`` (the dataset's ``field`` of paraphrases) or ``model`` (an
    LLM's rewrites, Co-Reward's recipe: ``model`` a model config such as ``${model}``, ``cache`` a jsonl path; more
    settings of ``rlexp.data.paraphrases.ModelParaphrases`` under ``rewrite``)."""

    position = "user"  # the variant replaces the question inside the user's turn

    def __init__(
        self,
        k: int = 2,
        source: str = "template",
        seed: int = 0,
        field: str = "paraphrases",
        model=None,
        cache: str | None = None,
        rewrite: dict | None = None,
    ):
        if int(k) < 2:
            raise ValueError(f"algorithm.prompt_condition.k={k} must be >= 2 (the question and a paraphrase)")
        self.k = int(k)
        extra = {"model": model, "cache": cache, **dict(rewrite or {})} if source == "model" else {}
        self.source = paraphrase_source(source, seed=seed, field=field, **extra)

    def prepare(self, records: list[dict], values: list[float]) -> None:
        """Before a batch's prompts are rendered: a model source rewrites the batch's questions in one call."""
        prepare = getattr(self.source, "prepare", None)
        if prepare is not None:
            prepare(records, [int(v) for v in values])

    def values(self, num_generations: int) -> list[float]:
        """The K variant indices (0: the question), G/K completions each."""
        if num_generations % self.k:
            raise ValueError(
                f"algorithm.prompt_condition.k={self.k} does not divide trainer.num_generations={num_generations}: "
                "each wording takes G/K completions"
            )
        return [float(i) for i in range(self.k)]

    def question(self, question: str, value: float, record: dict | None = None) -> str:
        """The ``value``-th wording of the record's question."""
        rec = dict(record or {}, question=question)
        return self.source(rec, int(value))
