"""The SFT stage's training examples in TRL's prompt-completion format: ``{"prompt": <our rendered prompt>,
"completion": <text>}``. The prompt is the chat-templated text our prompt format renders (the one the policy sees in
RL and evaluation), the completion what follows it; TRL's SFTTrainer appends the end-of-sequence token and puts the
loss on the completion's tokens only.

* ``demonstration_examples``: each training record's demonstration (``rlexp.data.demonstrations``); records
  without one are skipped and counted; none at all is an error naming the dataset.
* ``sampled_examples``: re-distillation's data, completions a model samples with our rollout, kept where the
  accuracy term scores them correct (``own_samples``). Cached in ``<run dir>/sft_examples.jsonl`` (with
  ``sft_examples.json``: the settings and the counts) so that a resumed run trains on the same examples."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from rlexp.data.demonstrations import demonstration

log = logging.getLogger(__name__)

EXAMPLES_FILE = "sft_examples.jsonl"
META_FILE = "sft_examples.json"


def demonstration_examples(records: list[dict], render, answer_format: str, dataset: str) -> tuple[list[dict], dict]:
    """The examples of the records that have a demonstration, and the counts (``sft/examples``, ``sft/skipped``:
    records without one). ``render(question)`` is the prompt text."""
    examples, skipped = [], 0
    for r in records:
        text = demonstration(r, answer_format)
        if text is None:
            skipped += 1
            continue
        examples.append({"prompt": render(r["question"]), "completion": text, "record_id": str(r.get("id", ""))})
    if not examples:
        from rlexp.config.schema import ConfigError

        raise ConfigError(
            f"dataset={dataset}: none of its {len(records)} training records has a demonstration (a worked solution: "
            "a `demonstration` column with dataset=local dataset.demonstration_column=<column>, reasoning-gym's "
            "answer_cot or expression, GSM8K/MATH's solution); stage=sft needs them, or set "
            "algorithm.data=own_samples to train on a model's own correct completions"
        )
    if skipped:
        log.info("SFT: %d of %d records have no demonstration and are skipped", skipped, len(records))
    return examples, {"sft/examples": float(len(examples)), "sft/skipped": float(skipped)}


def keep_correct(
    groups: list[list[tuple[str, float]]], min_score: float, per_prompt: int, max_examples: int | None, seed: int
) -> list[tuple[int, int]]:
    """(group, sample) indices kept: the first ``per_prompt`` samples of each group scoring at least ``min_score``,
    then, past ``max_examples``, a seeded random subset of that many (in group order)."""
    kept = []
    for g, samples in enumerate(groups):
        good = [i for i, (_, score) in enumerate(samples) if score >= min_score]
        kept += [(g, i) for i in good[:per_prompt]]
    if max_examples is not None and len(kept) > max_examples:
        chosen = sorted(random.Random(seed).sample(range(len(kept)), max_examples))
        kept = [kept[i] for i in chosen]
    return kept


def sampled_examples(model, tokenizer, records, prompt_format, rollout, accuracy_term, method, seed: int):
    """Re-distillation's examples: ``method.samples_per_prompt`` completions of each of the first
    ``method.num_prompts`` records, sampled from ``model``, the correct ones kept (``keep_correct``). Returns the
    examples and the counts (``sft/sampled``, ``sft/correct_frac``, ``sft/prompts_with_correct``,
    ``sft/examples``)."""
    import torch

    from rlexp.rewards.terms import Sample

    records = records[: method.num_prompts]
    G = method.samples_per_prompt
    groups: list[list[tuple[str, float]]] = []
    prompts_of: list[tuple[str, dict]] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(records), method.prompts_per_call):
            part = records[start : start + method.prompts_per_call]
            prompts = [prompt_format.render(tokenizer, r["question"]) for r in part]
            with torch.no_grad():
                out = rollout.generate(model, tokenizer, prompts, num_generations=G, greedy=method.greedy)
            lengths = out.completion_mask.sum(-1).tolist()
            truncated = out.truncated.tolist()
            samples = [
                Sample(prompts[i // G], out.texts[i], part[i // G], i // G, int(lengths[i]), bool(truncated[i]))
                for i in range(len(out.texts))
            ]
            scores = accuracy_term(samples).scores
            for k in range(len(part)):
                groups.append([(out.texts[k * G + j], float(scores[k * G + j])) for j in range(G)])
                prompts_of.append((prompts[k], part[k]))
    finally:
        model.train(was_training)
    kept = keep_correct(groups, method.min_score, method.per_prompt, method.max_examples, seed)
    examples = [
        {
            "prompt": prompts_of[g][0],
            "completion": groups[g][i][0],
            "record_id": str(prompts_of[g][1].get("id", "")),
            "score": groups[g][i][1],
        }
        for g, i in kept
    ]
    sampled = sum(len(g) for g in groups)
    correct = sum(1 for g in groups for _, s in g if s >= method.min_score)
    counts = {
        "sft/sampled": float(sampled),
        "sft/correct_frac": correct / max(1, sampled),
        "sft/prompts_with_correct": float(sum(1 for g in groups if any(s >= method.min_score for _, s in g))),
        "sft/examples": float(len(examples)),
    }
    return examples, counts


def read_cache(run_dir: Path) -> tuple[list[dict], dict] | None:
    meta, rows = Path(run_dir) / META_FILE, Path(run_dir) / EXAMPLES_FILE
    if not meta.exists() or not rows.exists():
        return None
    from rlexp.tracking.base import read_jsonl

    info = json.loads(meta.read_text())
    data = read_jsonl(rows)
    if len(data) != info.get("rows"):
        log.warning("%s holds %d rows, %s says %s: sampling again", rows, len(data), meta, info.get("rows"))
        return None
    return data, info


def write_cache(run_dir: Path, rows: list[dict], meta: dict) -> None:
    """The rows first, then the meta file (renamed into place): a kill between them leaves no meta, so a resume
    samples again instead of reading a half-written file."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / EXAMPLES_FILE).open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tmp = run_dir / (META_FILE + ".tmp")
    tmp.write_text(json.dumps({**meta, "rows": len(rows)}, indent=1))
    tmp.replace(run_dir / META_FILE)
