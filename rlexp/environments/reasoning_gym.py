"""Single-turn tasks as an environment (issue 28): a reasoning-gym task (``dataset=reasoning_gym`` or any dataset of
reasoning-gym records) played as a one-turn episode, so single-turn tasks and multi-turn games share the episode
machinery (``rlexp.rollout.multi_turn``: its turn records, per-turn rewards, ``episode/*`` metrics, the step groups
and turn-level advantages that read them).

The prompt is the task's question (``reset`` adds nothing); the policy's one turn is its answer: the final answer
is read as the accuracy reward reads it (``rlexp.rewards.answers.extract_answer`` in ``answer_format``, the last
number standing in with ``fallback_last_number``) and scored by the record's own scorer
(``rlexp.rewards.terms.check_answer``: the task's reasoning-gym scorer; math, exact, choice records work the same).
That score is the turn's reward, and the episode is done after it (no observation).

Counters per episode: ``answered`` (a final answer was found), ``correct`` (the score is 1). The outcome reward of
a run stays the reward terms' (``reward=accuracy`` scores the same answer with the same scorer); the environment's
own shows as ``episode/env_reward``."""

from __future__ import annotations

from rlexp.core.registry import ENVIRONMENTS
from rlexp.environments import EnvStep
from rlexp.rewards.answers import ANSWER_FORMATS, extract_answer
from rlexp.rewards.terms import check_answer


@ENVIRONMENTS.register
class SingleTurnTask:
    """Factory of one-turn episodes scored by the record's scorer (see module doc); ``answer_format`` as the
    prompt's (``hash``, ``tag``, ``boxed``, ``auto``)."""

    role = "user"  # never used: the episode ends after the one turn

    def __init__(self, answer_format: str = "hash", fallback_last_number: bool = True):
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"environment.answer_format={answer_format!r} is not one of {list(ANSWER_FORMATS)}")
        self.answer_format, self.fallback = answer_format, bool(fallback_last_number)

    def __call__(self, record: dict) -> SingleTurnEpisode:
        if not record.get("question") or "answer" not in record:
            raise ValueError(
                f"environment=reasoning_gym: record {record.get('id')!r} has no question and answer: use a task "
                "dataset such as dataset=reasoning_gym"
            )
        return SingleTurnEpisode(self, record)


class SingleTurnEpisode:
    def __init__(self, env: SingleTurnTask, record: dict):
        self.env, self.record, self.done = env, record, False

    def reset(self) -> str | None:
        self.done = False
        return None  # the prompt is the question

    def step(self, action: str) -> EnvStep:
        if self.done:
            raise RuntimeError("SingleTurnEpisode.step after its answer")
        self.done = True
        answer = extract_answer(action or "", self.env.answer_format, fallback_last_number=self.env.fallback)
        score = float(check_answer(answer, self.record))
        return EnvStep(
            None, reward=score, done=True, info={"answered": int(answer is not None), "correct": int(score == 1.0)}
        )
