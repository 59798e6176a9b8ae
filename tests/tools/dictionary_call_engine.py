"""A test double for dictionary-tool runs on the tiny random model, which never writes a lookup nor a translation:
the first turn of every episode is the scripted lookup below (tag format, as if sampled, log-prob 0), so the
dictionary really answers; after its result, every other row of the call writes the scripted translation (so the
BLEU reward has translations to score and varies within each group of four) and the others are sampled by the real
engine."""

from __future__ import annotations

from tests.rollout.summary_engine import PlannedEngine

CALL = "<dictionary>perro</dictionary>"
ANSWER = "<answer>The dog eats bread.</answer>"


class DictionaryCallEngine(PlannedEngine):
    def plan(self, contexts: list[str]) -> list[str | None]:
        # the prompt's worked example holds one tool message: a second is this episode's lookup result
        return [
            CALL if c.count("<|im_start|>tool") < 2 else (ANSWER if k % 2 == 0 else None)
            for k, c in enumerate(contexts)
        ]
