"""The option-shuffle re-ask of ACRE ("Answer-Consistent Chain-of-thought Reinforcement Learning for Multi-modal
Large Language Models", Huang et al., 2025; arXiv 2510.10104): a multiple-choice completion's reasoning is kept, the
question is asked again with every option moved to another letter, and the model's second pick is compared, by
option content, with its first. Shared by the consistency meter (``consistency/shuffle_rate``) and the ACRE reward
stage; the caller supplies the generator (a judge model's greedy continuation)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlexp.data.multiple_choice import reshuffle
from rlexp.rewards.answers import answer_span, choice_letter, first_answer


@dataclass
class ShuffleCheck:
    first_option: str | None  # the option content the completion chose (None: no letter stated)
    again_letter: str | None  # the letter picked after the shuffle
    again_option: str | None  # its content
    consistent: bool  # the same option content both times


def shuffle_recheck(
    prompts: list[str],
    completions: list[str],
    records: list[dict],
    answer_format: str,
    extract: Callable[[str], str | None],
    generate: Callable[[list[str]], list[str]],
) -> list[ShuffleCheck | None]:
    """One ``ShuffleCheck`` per multiple-choice row (``metadata.options``), None for other rows. ``extract`` gives the
    answer stated in ``answer_format``; ``generate(texts)`` continues each text (prompt with the shuffled question +
    the completion's reasoning up to its answer marker). An answer may name its option by letter or by content
    (``choice_letter``). A row without a stated letter, or whose prompt does not
    contain its question verbatim, is inconsistent and not re-asked."""
    out: list[ShuffleCheck | None] = [None] * len(completions)
    asks = []  # (row, text to continue, cut, moved options)
    for i, (prompt, completion, record) in enumerate(zip(prompts, completions, records)):
        meta = record.get("metadata") or {}
        if not meta.get("options"):
            continue
        letters = meta.get("letters", "ABCD")
        span = answer_span(completion, answer_format)
        chosen = choice_letter(extract(completion), letters, meta["options"]) if span is not None else None
        first = meta["options"][letters.index(chosen)] if chosen is not None else None
        out[i] = ShuffleCheck(first, None, None, False)
        if first is None or record["question"] not in prompt:
            continue
        question, moved = reshuffle(record)
        cut = completion[: span[0]].rstrip(" \t")  # the model writes its own space after the marker
        asks.append((i, prompt.replace(record["question"], question) + cut, cut, moved))
    texts = generate([a[1] for a in asks]) if asks else []
    for (i, _, cut, moved), text in zip(asks, texts):
        letters = records[i]["metadata"].get("letters", "ABCD")
        again = choice_letter(extract(first_answer(cut, text)), letters, moved)
        picked = moved[letters.index(again)] if again is not None and letters.index(again) < len(moved) else None
        out[i] = ShuffleCheck(out[i].first_option, again, picked, picked == out[i].first_option)
    return out
