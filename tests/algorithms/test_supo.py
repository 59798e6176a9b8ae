"""SUPO (conf/algorithm/supo.yaml with rollout=supo): the config checks, the trainer's rows of a segmented rollout,
and two training steps on the tiny model in which episodes really summarise (tests/rollout/summary_engine.py scripts
the random model's first call and its answers; the summaries are sampled), their segments train as rows and
unfinished episodes are masked. The advantage's hand-worked tests: tests/algorithms/advantages/test_segments.py."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.rewards.terms import RewardTerm
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

SUPO = [
    "algorithm=supo",
    "rollout=supo",
    "environment=tool_use",
    "tools=[python]",
    "prompt=python_tool",
    "rollout.engine._target_=tests.rollout.summary_engine.SummaryEngine",
    "trainer.max_new_tokens=48",  # the working context L: a call and its result (~43 tokens) leave 5 for a turn
    "rollout.max_turn_tokens=40",  # room for the scripted call (32 tokens); the room left binds after its result
    "rollout.max_summary_tokens=8",
    "rollout.max_summaries=1",
    "rollout.max_turns=3",
]


class TextLength(RewardTerm):
    def score(self, sample) -> float:
        return float(len(sample.completion))


def test_supo_is_refused_without_its_rollout_at_config_time(tiny_cfg):
    from rlexp.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match=r"algorithm.advantage \(supo\) reads SUPO's summarised segments"):
        validate(tiny_cfg("algorithm=supo", "rollout=multi_turn", "environment=tool_use", "tools=[python]"))
    with pytest.raises(ConfigError, match="rollout=supo needs an environment"):
        validate(tiny_cfg("algorithm=supo", "rollout=supo"))
    validate(tiny_cfg(*SUPO))


@pytest.mark.long  # ~20 s quiet: two steps of eight episodes, sandboxed Python, sampled summaries, segment rows
def test_supo_trains_two_steps_on_summarised_segments(tiny_cfg):
    result = run(tiny_cfg(*SUPO, *VARYING, "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["episode/tool_calls"] >= 1.0  # the tool ran
    assert m["supo/summaries"] > 0.0 and m["supo/segments"] > 1.0  # contexts filled, summarised and restarted
    assert m["supo/rows"] > m["supo/episodes"] == 8.0  # more rows than episodes: one per segment
    assert m["supo/rows_per_episode"] == m["supo/segments"]
    assert 0.0 <= m["overlong/masked_frac"] < 1.0 and 0.0 <= m["supo/overlong_frac"] < 1.0
    assert m["supo/adv_abs_mean"] > 0.0  # the episodes' rewards (vowel shares of their text) differ
    assert m["supo/working_context_max"] <= 48 + 60  # a segment: at most L, the instruction and a summary


def test_the_trainer_gives_each_segment_row_its_episodes_group_and_record(tiny_cfg):
    """The trainer's batch of a segmented output: rows mapped to their episode's group, prompt and record."""
    from rlexp.rollout.summarizing import SegmentedOutput
    from rlexp.trainer.loop import Trainer

    trainer = Trainer.__new__(Trainer)  # only scored_batch's state
    trainer.num_generations, trainer._next_group = 2, 5
    trainer.reward_terms = {"text": TextLength()}

    class Algo:
        prompt_condition = None

    trainer.algo = Algo()
    n = 4  # rows: episode 0 (two segments), episode 1, episode 2 (of the second prompt)
    out = SegmentedOutput(
        torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 3, dtype=torch.long),
        torch.ones(n, 3, dtype=torch.long),
        torch.zeros(n, 3),
        torch.zeros(n, dtype=torch.bool),
        ["t0", "t0", "t1", "t2"],
        policy_tokens=torch.ones(n, 3),
        episodes=[{"segment": 0}, {"segment": 1}, {"segment": 0}, {"segment": 0}],
        row_episodes=[0, 0, 1, 2],
    )
    batch = trainer.scored_batch([{"question": "a"}, {"question": "b"}], ["A", "B"], out)
    assert batch.group_ids.tolist() == [5, 5, 5, 6] and batch.prompts == ["A", "A", "A", "B"]
    assert [r["question"] for r in batch.records] == ["a", "a", "a", "b"]
    assert [r["episode"]["segment"] for r in batch.records] == [0, 1, 0, 0]
    assert batch.term("text").tolist() == [2.0, 2.0, 2.0, 2.0]  # each row scored on its episode's text
