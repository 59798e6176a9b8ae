"""GEM's games as an environment (issue 28): "GEM: A Gym for Agentic LLMs" (AxonRL; the ``gem-llm`` package,
installed with ``pip install --no-deps gem-llm==0.1.0``, see pyproject.toml) — single-player language games with a
gym interface, ``env.reset(seed) -> (observation, info)`` and ``env.step(action) -> (observation, reward,
terminated, truncated, info)``, played here through GEM's own game code.

Each episode plays its record's game (``dataset=gem``: ``rlexp.data.gem``; ``metadata``: ``env_id``, ``options``,
``game_seed``): it makes the game with ``gem.make(env_id, **options)`` and resets it with the record's seed, which
deals the same board, secret or puzzle as when the record's question was written (the check: the opening must equal
the question, else a clear error). The question already shows the opening, so ``reset`` adds nothing.

A policy turn goes to the game whole (cut at ``max_action_chars``): GEM's games read the move from the turn
themselves (the last ``\\boxed{...}``). The game's answer is the next observation, a ``user`` message: its feedback,
then — as GEM's own observation wrapper adds it — the state it shows after each move (``info["suffix"]``: the board,
the grid, "Enter your next guess."). The turn's reward is GEM's (shaped: a win pays 1, progress pays a share of it,
an unreadable move -0.1 and ends the game); the episode ends when the game says ``terminated`` or ``truncated``
(its own turn limit), else at the rollout's turn or token limit.

GEM has no win flag: each of its games (0.1.0) opens its winning observation with "Congratulations!", so ``won`` is
a done episode whose last observation starts so. Counters per episode (summed into ``record["episode"]``):
``won``, ``lost`` (the game ended without a win: a mine, an unreadable move, its turn limit) and
``invalid_commands`` (moves the game could not read: GEM's format error). ``reward=text_game``
(``rlexp.rewards.text_games.GameOutcome``) reads them with the record's ``max_score`` (1: GEM's win reward).

GEM seeds Python's and numpy's global generators in ``reset`` (and draws from them in ``step``: 2048's new tiles,
the first reveal of Minesweeper): each episode here runs its game on its own saved state of both generators, swapped
in around each call, so the trainer's random streams are untouched and an episode replays the same from its seed.
Importing ``gem`` calls ``logging.basicConfig``; the root logger's handlers are put back as they were."""

from __future__ import annotations

import inspect
import logging
import random
from contextlib import contextmanager

from rlexp.core.registry import ENVIRONMENTS
from rlexp.data.reasoning_gym_compat import import_reasoning_gym
from rlexp.environments import EnvStep

INSTALL = "pip install --no-deps gem-llm==0.1.0 (its reasoning-gym==0.1.23 pin would downgrade ours)"
WIN_MARK = "Congratulations"  # how every GEM game's winning observation starts (gem-llm 0.1.0)


def import_gem():
    """``gem`` with its game registry loaded; the root logger as it was before (GEM calls basicConfig)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import_reasoning_gym()  # GEM imports reasoning-gym, which imports pycosat (rlexp's stand-in where absent)
        import gem
        from gem.envs.registration import ENV_REGISTRY  # noqa: F401
    except ImportError as e:
        raise ImportError(f"environment=gem / dataset=gem need GEM: {INSTALL}") from e
    finally:
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    return gem


def check_game(env_id: str, options: dict | None, key: str = "environment") -> dict:
    """The game's settings checked against GEM's registry and the game class's own settings (GEM's games swallow
    unknown keywords, so a misspelt option would be silently ignored): the options as a plain dict."""
    import_gem()
    from gem.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        games = sorted(k for k in ENV_REGISTRY if k.startswith("game:"))
        raise ValueError(f"{key}.env_id={env_id!r} is not a GEM environment; its games: {games}")
    options = dict(options or {})
    entry = ENV_REGISTRY[env_id].entry_point
    if isinstance(entry, str):
        module, name = entry.split(":")
        try:
            entry = getattr(__import__(module, fromlist=[name]), name)
        except ImportError as e:  # Hangman, Wordle, WordSearch import nltk
            raise ImportError(f"{key}.env_id={env_id!r}: GEM's game needs {e.name}: {e}") from e
    params = inspect.signature(entry.__init__).parameters
    settings = [p for p, v in params.items() if p != "self" and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)]
    unknown = sorted(set(options) - set(settings))
    if unknown:
        raise ValueError(f"{key}.options: {unknown} not settings of {env_id} ({entry.__name__}: {', '.join(settings)})")
    return options


class OwnRandom:
    """A saved state of Python's and numpy's global generators, seeded once; ``active()`` swaps it in for a call and
    puts the caller's state back after it (keeping what the call drew)."""

    def __init__(self, seed: int):
        import numpy as np

        outer = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.state = random.getstate(), np.random.get_state()
        random.setstate(outer[0])
        np.random.set_state(outer[1])

    @contextmanager
    def active(self):
        import numpy as np

        outer = random.getstate(), np.random.get_state()
        random.setstate(self.state[0])
        np.random.set_state(self.state[1])
        try:
            yield
        finally:
            self.state = random.getstate(), np.random.get_state()
            random.setstate(outer[0])
            np.random.set_state(outer[1])


def observation_text(observation: str, info: dict | None) -> str:
    """GEM's observation with the state it shows after it (``info["prefix"]`` before, ``info["suffix"]`` after, as
    GEM's ObservationWrapper joins them), on a new line."""
    info = info or {}
    text = str(observation or "")
    suffix, prefix = info.get("suffix"), info.get("prefix")
    if suffix:
        text = f"{text}\n{suffix}" if text and not text.endswith("\n") else f"{text}{suffix}"
    if prefix:
        text = f"{prefix}{text}"
    return text.strip()


def start_game(env_id: str, options: dict, game_seed: int) -> tuple[object, OwnRandom, str]:
    """A GEM game made and reset with ``game_seed`` on its own random state: (game, its random state, opening)."""
    gem = import_gem()
    rng = OwnRandom(game_seed)
    with rng.active():
        game = gem.make(env_id, **options)  # its constructor resets once, unseeded: on the episode's own state
        observation, info = game.reset(seed=int(game_seed))
    return game, rng, observation_text(observation, info)


@ENVIRONMENTS.register
class GemGames:
    """Factory of GEM game episodes: each plays its record's game (``dataset=gem``). ``env_id`` and ``options`` are
    the game the dataset makes (``dataset.env_id`` reads them); ``max_action_chars``: a turn is cut there before the
    game reads it; ``max_observation_chars``: the game's answer is cut there."""

    role = "user"  # the game's text is the user's turn of the chat

    def __init__(
        self,
        env_id: str = "game:GuessTheNumber-v0-easy",
        options: dict | None = None,
        max_action_chars: int = 2000,
        max_observation_chars: int = 2000,
    ):
        if max_action_chars < 1 or max_observation_chars < 1:
            raise ValueError(
                "environment.max_action_chars and environment.max_observation_chars must be >= 1, got "
                f"{max_action_chars}, {max_observation_chars}"
            )
        self.env_id, self.options = env_id, check_game(env_id, options)
        self.max_action_chars, self.max_observation_chars = int(max_action_chars), int(max_observation_chars)

    def __call__(self, record: dict) -> GemEpisode:
        meta = record.get("metadata") or {}
        if "env_id" not in meta or "game_seed" not in meta:
            raise ValueError(
                f"environment=gem: record {record.get('id')!r} names no GEM game (metadata.env_id, game_seed): use "
                "dataset=gem, whose records are GEM games"
            )
        return GemEpisode(self, record)


class GemEpisode:
    def __init__(self, env: GemGames, record: dict):
        meta = record["metadata"]
        self.env, self.record = env, record
        self.env_id, self.options, self.seed = meta["env_id"], dict(meta.get("options") or {}), int(meta["game_seed"])
        self.game, self.rng, self.done = None, None, False

    def reset(self) -> str | None:
        self.game, self.rng, opening = start_game(self.env_id, self.options, self.seed)
        if opening != self.record.get("question"):
            raise ValueError(
                f"environment=gem: game {self.env_id} (seed {self.seed}) opens differently from record "
                f"{self.record.get('id')!r}'s question: was the dataset made with another gem-llm version or "
                "options, or the question rewritten (a view, paraphrases)?"
            )
        self.done = False
        return None  # the question shows the opening

    def step(self, action: str) -> EnvStep:
        if self.game is None:
            raise RuntimeError("GemEpisode.step before reset")
        if self.done:
            raise RuntimeError("GemEpisode.step after the game ended")
        from gem.utils.constants import LanguageGameReward

        with self.rng.active():
            observation, reward, terminated, truncated, info = self.game.step(
                (action or "")[: self.env.max_action_chars]
            )
        self.done = bool(terminated or truncated)
        won = int(self.done and str(observation).lstrip().startswith(WIN_MARK))
        invalid = int(bool(terminated) and not won and float(reward) == LanguageGameReward.format_error_reward)
        text = str(observation).strip() if self.done else observation_text(observation, info)
        info = {"won": won, "lost": int(self.done and not won), "invalid_commands": invalid}
        return EnvStep(text[: self.env.max_observation_chars], reward=float(reward), done=self.done, info=info)
