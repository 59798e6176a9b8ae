"""The self-knowledge view of a dataset (``view=self_knowledge``; KnowRL, arXiv 2510.11407).

Each record becomes a question about the model itself — could it solve this task? — answered ``feasible`` or
``infeasible`` in the prompt's answer format (``#### feasible`` under ``prompt=hash``); the model is told not to
solve the task:

    {"question": "Here is a task:\\n\\n<task>\\n\\n<instruction>", "answer": "infeasible", "scorer": "exact",
     "metadata": {"feasibility": "infeasible", "task": "<task>", "removed": ["12", "7"], "source": {...}}}

The hidden label (``metadata.feasibility``, also the record's ``answer``) is for the log only — KnowRL trains on the
agreement of the model's own judgments (``rlexp.rewards.self_knowledge``). Our choice of label: a task is
``feasible`` when it is the record's question as given (solvable: the dataset has its answer) and ``infeasible``
when the information it needs was taken out — every number of the question replaced by ``placeholder`` (a question
without a number loses its second half instead). A share ``infeasible_share`` of the records, drawn
deterministically from ``seed`` and the record's id, is made infeasible. The label says whether the task can be
solved at all, not whether this model would solve it; it fits datasets whose answers follow from the numbers in
the question (arithmetic, GSM-style word problems).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlexp.data.multiple_choice import _rng
from rlexp.data.sources import DatasetSplits

FEASIBLE, INFEASIBLE = "feasible", "infeasible"
LABELS = (FEASIBLE, INFEASIBLE)
INSTRUCTION = (
    "Do not solve it. Could you solve this task correctly? "
    "Answer feasible if you could, or infeasible if you could not."
)
MISSING = "[the rest of this task is missing]"
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def remove_information(question: str, placeholder: str) -> tuple[str, list[str]]:
    """``question`` made unsolvable, and what was taken out: every number replaced by ``placeholder``; without a
    number, the second half of its words replaced by a note that the rest is missing."""
    numbers = _NUMBER.findall(question)
    if numbers:
        return _NUMBER.sub(placeholder, question), numbers
    words = question.split()
    keep = len(words) // 2
    return " ".join([*words[:keep], MISSING]), [" ".join(words[keep:])]


def render(task: str, instruction: str) -> str:
    return f"Here is a task:\n\n{task}\n\n{instruction}"


@dataclass
class SelfKnowledgeView:
    """``view=self_knowledge``: ``SelfKnowledgeView(...)(splits)`` turns every record into a feasible/infeasible
    self-knowledge question (see the module docstring). ``infeasible_share`` of the records, drawn from ``seed`` and
    the record's id, have their information removed; ``instruction`` follows the task."""

    infeasible_share: float = 0.5
    seed: int = 0
    placeholder: str = "[hidden number]"
    instruction: str = INSTRUCTION

    def __post_init__(self):
        if not 0.0 <= self.infeasible_share <= 1.0:
            raise ValueError(f"view.infeasible_share={self.infeasible_share} must be in [0, 1]")
        if not str(self.placeholder).strip() or _NUMBER.search(str(self.placeholder)):
            raise ValueError(f"view.placeholder={self.placeholder!r} must be non-empty text without digits")
        if not str(self.instruction).strip():
            raise ValueError("view.instruction is empty: the model must be asked for feasible or infeasible")

    def __call__(self, splits: DatasetSplits) -> DatasetSplits:
        return DatasetSplits(
            f"{splits.name}:self_knowledge",
            [self.record(r) for r in splits.train],
            [self.record(r) for r in splits.eval],
        )

    def record(self, r: dict) -> dict:
        infeasible = _rng(self.seed, f"self_knowledge:{r['id']}").random() < self.infeasible_share
        task, removed = remove_information(r["question"], self.placeholder) if infeasible else (r["question"], [])
        label = INFEASIBLE if infeasible else FEASIBLE
        return {
            "id": r["id"],
            "question": render(task, self.instruction),
            "answer": label,
            "scorer": "exact",
            "metadata": {
                "feasibility": label,
                "task": task,
                "removed": removed,
                "source": {"answer": r["answer"], "scorer": r.get("scorer"), "metadata": r.get("metadata")},
            },
        }
