"""GEM's games as a dataset (issue 28): one record per game instance — a GEM environment (``env_id``, e.g.
``game:GuessTheNumber-v0-easy``; ``options`` override its registered settings) reset with a per-record seed — played
by ``rlexp.environments.gem`` in multi-turn episodes ("GEM: A Gym for Agentic LLMs", AxonRL; ``gem-llm``, installed
with ``--no-deps``). Made offline at each start (a game resets in milliseconds): nothing is downloaded.

A record::

    {"id": "gem-<env id>-<i>", "question": the game's opening (its rules and first state, as GEM's observation
     wrapper shows them), "answer": "", "scorer": "gem",
     "metadata": {"env_id", "options", "game_seed", "max_score": 1.0 (GEM's win reward), "source_dataset": "gem"}}

Games with a hidden secret (the number of Guess The Number, the code of Mastermind, the mines of Minesweeper) open
with the same rules whatever their secret, so records are told apart by their seed, not their question: train and
held-out games are different seeds (``game_seed(seed, i)``: the first ``train_size`` indices train, the next
``eval_size`` are held out), and two records may share a question. Which GEM games play offline: see
conf/environment/gem.yaml."""

from __future__ import annotations

from rlexp.data.sources import DatasetSplits
from rlexp.data.text_games import game_seed


def gem_games(
    seed: int,
    name: str = "gem",
    env_id: str = "game:GuessTheNumber-v0-easy",
    options: dict | None = None,
    train_size: int = 256,
    eval_size: int = 32,
) -> DatasetSplits:
    """``train_size + eval_size`` instances of the GEM game ``env_id`` (with ``options``), seeds from ``seed``."""
    from rlexp.environments.gem import check_game, start_game

    if train_size < 1 or eval_size < 1:
        raise ValueError(f"dataset.train_size and dataset.eval_size must be >= 1, got {train_size}, {eval_size}")
    options = check_game(env_id, dict(options or {}), key="dataset")
    slug = env_id.replace(":", "-")
    records = []
    for i in range(train_size + eval_size):
        s = game_seed(seed, i)
        _, _, opening = start_game(env_id, options, s)
        records.append(
            {
                "id": f"gem-{slug}-{i}",
                "question": opening,
                "answer": "",
                "scorer": "gem",
                "metadata": {
                    "env_id": env_id,
                    "options": options,
                    "game_seed": s,
                    "max_score": 1.0,
                    "source_dataset": "gem",
                },
            }
        )
    return DatasetSplits(f"{name}/{slug}", records[:train_size], records[train_size:])
