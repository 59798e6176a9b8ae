"""Dictionary-tool GRPO (+experiment=dictionary_grpo) trains two steps on the tiny model with the real dictionary:
the first turn of each episode is a scripted lookup (tests/tools/dictionary_call_engine.py: the random model never
writes one), the dictionary answers from the shipped sample as a tool message masked out of the loss, the second
turn is a scripted translation in half the episodes and sampled in the others, and the BLEU reward scores them."""

from __future__ import annotations

import math

import pytest

from rlexp.runs.training import run

pytest.importorskip("sacrebleu")

# the overrides the experiment needs on the tiny model
DICTIONARY = [
    "+experiment=dictionary_grpo",
    "rollout.engine._target_=tests.tools.dictionary_call_engine.DictionaryCallEngine",
    "trainer.max_new_tokens=48",
    "rollout.max_turn_tokens=12",
    "rollout.max_turns=2",
    "dataset.eval_size=4",
]


def test_the_experiment_composes_the_parts(tiny_cfg):
    from rlexp.config.schema import validate

    cfg = tiny_cfg(*DICTIONARY)
    validate(cfg)
    assert cfg.rollout._target_.endswith("MultiTurnRollout") and cfg.environment.call_format == "tags"
    assert list(cfg.tools) == ["dictionary"] and cfg.trainer.accuracy_term == "bleu"
    assert cfg.reward.terms.bleu.answer_format == "tag" and cfg.algorithm.name == "grpo"


@pytest.mark.long  # ~15 s quiet: two steps of eight 2-turn episodes with dictionary lookups
def test_dictionary_grpo_trains_two_steps_with_the_dictionary(tiny_cfg):
    result = run(tiny_cfg(*DICTIONARY, "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert m["episode/tool_calls"] >= 1.0 and m["episode/tool_errors"] == 0.0  # the lookups ran, without error
    assert m["episode/turns"] >= 2.0 and m["episode/policy_tokens"] < m["episode/length"]  # the matches are masked
    for key in ("reward/bleu/mean", "reward/bleu/answered", "reward/bleu/score100"):
        assert math.isfinite(m[key]) and 0.0 <= m[key] <= 100.0, key
    assert 0.0 < m["reward/bleu/answered"] < 1.0  # the scripted translations, not the sampled turns
    assert m["reward/bleu/mean"] > 0.0 and m["advantage/abs_mean"] > 0.0  # BLEU varies within the groups
