"""Per-step batch metrics (names documented in README "Metrics")."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import UNSCORED
from rlexp.core.stats import group_stats


def batch_metrics(batch: RolloutBatch, accuracy_term: str | None, judged_terms=()) -> dict[str, float]:
    """``judged_terms``: reward terms a model scores in [0, 1] (judges, PRMs); each logs ``reward/<term>/
    rule_agreement``, the share of rows it scored where its verdict (score >= 0.5) matches the accuracy term's."""
    m: dict[str, float] = {}
    r = batch.reward.float()
    m["reward/mean"] = float(r.mean())
    m["reward/std"] = float(r.std()) if len(r) > 1 else 0.0
    for j, name in enumerate(batch.reward_names):
        col = batch.rewards[:, j]
        m[f"reward/{name}/mean"] = float(col.mean())
        m[f"reward/{name}/std"] = float(col.std()) if len(col) > 1 else 0.0
        m[f"reward/{name}/failures"] = float(batch.reward_failures[:, j].float().sum())
    if UNSCORED in batch.extras:  # rows no term scored (algorithm.unscored_rows: counted, or left out as TRL)
        m["reward/unscored"] = float(batch.extras[UNSCORED].float().sum())
    _, std, count = group_stats(r, batch.group_ids)
    m["groups/zero_variance_frac"] = float((std[count > 1] <= 1e-8).float().mean()) if (count > 1).any() else 0.0
    if accuracy_term and accuracy_term in batch.reward_names:
        acc = batch.term(accuracy_term)
        m["accuracy"] = float(acc.mean())
        gmean, _, _ = group_stats(acc, batch.group_ids)
        firsts = _group_firsts(batch.group_ids)
        m["groups/all_correct_frac"] = float((gmean[firsts] >= 1.0 - 1e-8).float().mean())
        m["groups/all_wrong_frac"] = float((gmean[firsts] <= 1e-8).float().mean())
        for name in judged_terms:
            if name in batch.reward_names and name != accuracy_term:
                j = batch.reward_names.index(name)
                scored = ~batch.reward_failures[:, j]
                if scored.any():
                    agree = (batch.rewards[:, j] >= 0.5) == (acc >= 0.5)
                    m[f"reward/{name}/rule_agreement"] = float(agree[scored].float().mean())
    if batch.advantages is not None:
        a = batch.advantages.float()
        if a.dim() == 2:  # per-token advantages: their spread within a completion (0 for a sequence advantage)
            cm = batch.completion_mask.float()
            n = cm.sum(-1).clamp(min=1)
            row_mean = (a * cm).sum(-1) / n
            m["advantage/within_row_std"] = float(((((a - row_mean[:, None]) ** 2) * cm).sum(-1) / n).sqrt().mean())
            a = row_mean
        m["advantage/mean"], m["advantage/std"] = float(a.mean()), float(a.std()) if len(a) > 1 else 0.0
        m["advantage/abs_mean"] = float(a.abs().mean())
    lengths = batch.lengths.float()
    m["length/mean"], m["length/max"], m["length/min"] = (
        float(lengths.mean()),
        float(lengths.max()),
        float(lengths.min()),
    )
    m["length/truncated_frac"] = float(batch.truncated.float().mean())
    if accuracy_term and accuracy_term in batch.reward_names:  # Dr. GRPO's length bias shows on wrong answers
        acc = batch.term(accuracy_term)
        for name, rows in (("correct", acc >= 1.0 - 1e-8), ("wrong", acc <= 1e-8)):
            if rows.any():  # logged only when the step has such completions (partial credit is neither)
                m[f"length/{name}_mean"] = float(lengths[rows].mean())
    m["batch/completions"] = float(len(batch))
    m.update({k: float(v) for k, v in batch.stats.items()})
    return m


def _group_firsts(group_ids: torch.Tensor) -> torch.Tensor:
    first = torch.ones_like(group_ids, dtype=torch.bool)
    first[1:] = group_ids[1:] != group_ids[:-1]
    return first.nonzero().squeeze(-1)


def with_accuracy_gain(metrics: dict, jsonl_path) -> dict:
    """``metrics`` plus ``eval/accuracy_gain``: held-out accuracy now minus at step 0, when the run evaluated there
    (read back from the run's metrics.jsonl, so a resumed run keeps it)."""
    if "eval/accuracy" in metrics:
        from rlexp.tracking.base import read_jsonl

        start = next((r for r in read_jsonl(jsonl_path) if r["step"] == 0), {}).get("eval/accuracy")
        if isinstance(start, (int, float)):
            metrics = {**metrics, "eval/accuracy_gain": metrics["eval/accuracy"] - start}
    return metrics
