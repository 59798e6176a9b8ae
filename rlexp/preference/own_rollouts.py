"""Preference pairs from our own scored rollouts (``dataset=own_rollouts``, the default data of the offline
preference methods: no hub needed). Before training, the policy samples ``num_generations`` completions for each of
``num_prompts`` prompts of the prompt dataset (``dataset.prompts``, the default task ``arithmetic_add_sub``) with our
rollout (``rollout=``) and our prompt format, our reward terms (``reward=``) score them, and
``rlexp.preference.pairs.build_pairs`` turns each group into pairs (``mode``, ``pairs_per_group``,
``prefer_shorter``, ``shorter_min_reward``).

The pairs are cached in ``<run dir>/preference_pairs.jsonl`` (with ``preference_pairs.json``: the settings and
the counts), so a resumed run trains on the same pairs instead of sampling new ones. A prompt dataset given to a
preference method directly (``algorithm=dpo dataset=gsm8k``) is wrapped here with the default settings."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlexp.data.sources import DatasetSplits
from rlexp.preference.data import PreferenceData
from rlexp.preference.pairs import MODES, Candidate, PairStats, build_pairs

log = logging.getLogger(__name__)

PAIRS_FILE = "preference_pairs.jsonl"
META_FILE = "preference_pairs.json"


@dataclass
class PairSettings:
    num_prompts: int = 64
    num_generations: int = 4
    mode: str = "all"
    pairs_per_group: int = 2
    prefer_shorter: bool = True
    shorter_min_reward: float | None = None
    seed: int = 0
    prompts_per_call: int = 8  # prompts per rollout call (× num_generations completions)

    def check(self) -> None:
        from rlexp.config.schema import ConfigError

        if self.mode not in MODES:
            raise ConfigError(f"dataset.mode={self.mode!r}: one of {list(MODES)}")
        for key in ("num_prompts", "num_generations", "pairs_per_group", "prompts_per_call"):
            if int(getattr(self, key)) < (2 if key == "num_generations" else 1):
                raise ConfigError(
                    f"dataset.{key}={getattr(self, key)}: must be >= {2 if key == 'num_generations' else 1}"
                )


@dataclass
class OwnRollouts:
    """The prompt dataset and how to make pairs from it; ``build`` samples, scores and pairs (or reads the cache)."""

    prompts: DatasetSplits
    settings: PairSettings = field(default_factory=PairSettings)
    name: str = "own_rollouts"

    @property
    def train(self) -> list[dict]:
        return self.prompts.train

    @property
    def eval(self) -> list[dict]:
        return self.prompts.eval

    def build(
        self, model, tokenizer, prompt_format, rollout, reward_terms, run_dir: Path
    ) -> tuple[PreferenceData, dict]:
        """The pairs (train: built here or read from the run directory's cache; eval: none) and their counts."""
        run_dir = Path(run_dir)
        cached = read_cache(run_dir)
        if cached is not None:
            rows, meta = cached
            if meta.get("settings") != asdict(self.settings):
                log.warning(
                    "%s: built with other settings %s; reused as they are", run_dir / META_FILE, meta.get("settings")
                )
            log.info("preference pairs: %d read from %s", len(rows), run_dir / PAIRS_FILE)
            return PreferenceData(self.name, "paired", rows, []), meta["counts"]
        rows, stats = self.sample_pairs(model, tokenizer, prompt_format, rollout, reward_terms)
        counts = {**stats.metrics(), "pref/groups": float(stats.groups)}
        write_cache(run_dir, rows, {"settings": asdict(self.settings), "counts": counts})
        log.info(
            "preference pairs: %d built from %d groups (%d tied pairs dropped, %d groups with one distinct answer, "
            "%d groups without a pair) -> %s",
            stats.pairs,
            stats.groups,
            stats.tied_pairs,
            stats.single_answer_groups,
            stats.no_pair_groups,
            run_dir / PAIRS_FILE,
        )
        if not rows:
            from rlexp.config.schema import ConfigError

            raise ConfigError(
                f"dataset={self.name}: no preference pair from {stats.groups} groups (every group tied or had one "
                "distinct answer); raise dataset.num_prompts or dataset.num_generations, or set "
                "dataset.prefer_shorter=true"
            )
        return PreferenceData(self.name, "paired", rows, []), counts

    def sample_pairs(self, model, tokenizer, prompt_format, rollout, reward_terms) -> tuple[list[dict], PairStats]:
        import torch

        from rlexp.core.batch import RolloutBatch
        from rlexp.rewards.scoring import score

        s = self.settings
        records = self.prompts.train[: s.num_prompts]
        G = s.num_generations
        groups: list[list[Candidate]] = []
        texts: list[tuple[dict, str, list[float]]] = []  # per group: record, prompt, rewards
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(records), s.prompts_per_call):
                part = records[start : start + s.prompts_per_call]
                prompts = [prompt_format.render(tokenizer, r["question"]) for r in part]
                with torch.no_grad():
                    out = rollout.generate(model, tokenizer, prompts, num_generations=G)
                n = len(part)
                group_ids = torch.arange(len(groups), len(groups) + n).repeat_interleave(G)
                row_prompts = [p for p in prompts for _ in range(G)]
                batch = RolloutBatch.from_generation(out, group_ids, row_prompts, [r for r in part for _ in range(G)])
                score(batch, reward_terms)
                lengths = batch.lengths.tolist()
                reward = batch.reward.tolist()
                for k in range(n):
                    rows = range(k * G, (k + 1) * G)
                    groups.append([Candidate(out.texts[i], float(reward[i]), int(lengths[i])) for i in rows])
                    texts.append((part[k], prompts[k], [float(reward[i]) for i in rows]))
        finally:
            model.train(was_training)
        pairs, stats = build_pairs(
            groups, s.mode, s.pairs_per_group, s.prefer_shorter, s.shorter_min_reward, seed=s.seed
        )
        rows = []
        for p in pairs:
            record, prompt, _ = texts[p.group]
            c, r = groups[p.group][p.chosen], groups[p.group][p.rejected]
            rows.append(
                {
                    "prompt": prompt,
                    "chosen": c.text,
                    "rejected": r.text,
                    "chosen_reward": c.reward,
                    "rejected_reward": r.reward,
                    "chosen_length": c.length,
                    "rejected_length": r.length,
                    "group": p.group,
                    "record_id": record.get("id"),
                }
            )
        mean = sum(sum(t[2]) for t in texts) / max(1, sum(len(t[2]) for t in texts))
        stats.extra["reward_mean"] = mean if math.isfinite(mean) else 0.0
        return rows, stats


def own_rollouts(
    prompts: DatasetSplits,
    name: str = "own_rollouts",
    num_prompts: int = 64,
    num_generations: int = 4,
    mode: str = "all",
    pairs_per_group: int = 2,
    prefer_shorter: bool = True,
    shorter_min_reward: float | None = None,
    seed: int = 0,
    prompts_per_call: int = 8,
    train_size: int | None = None,  # passed on to the prompt dataset by the config (dataset.prompts.train_size)
    eval_size: int | None = None,
) -> OwnRollouts:
    """``dataset=own_rollouts`` (module docstring)."""
    settings = PairSettings(
        int(num_prompts),
        int(num_generations),
        mode,
        int(pairs_per_group),
        bool(prefer_shorter),
        shorter_min_reward,
        int(seed),
        int(prompts_per_call),
    )
    settings.check()
    return OwnRollouts(prompts, settings, name)


def wrap_prompts(data: DatasetSplits, num_generations: int, seed: int) -> OwnRollouts:
    """A prompt dataset given to an offline preference method: pairs from own rollouts, default settings."""
    return OwnRollouts(data, PairSettings(num_generations=max(2, num_generations), seed=seed), data.name)


def read_cache(run_dir: Path) -> tuple[list[dict], dict] | None:
    meta, rows = Path(run_dir) / META_FILE, Path(run_dir) / PAIRS_FILE
    if not meta.exists() or not rows.exists():
        return None
    from rlexp.tracking.base import read_jsonl

    info = json.loads(meta.read_text())
    data = read_jsonl(rows)
    if len(data) != info.get("rows"):
        log.warning("%s holds %d rows, %s says %s: building the pairs again", rows, len(data), meta, info.get("rows"))
        return None
    return data, info


def write_cache(run_dir: Path, rows: list[dict], meta: dict) -> None:
    """The rows first, then the meta file (renamed into place): a kill between them leaves no meta, so a
    resume builds the pairs again instead of reading a half-written file."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / PAIRS_FILE).open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tmp = run_dir / (META_FILE + ".tmp")
    tmp.write_text(json.dumps({**meta, "rows": len(rows)}, indent=1))
    tmp.replace(run_dir / META_FILE)
