"""SALMON's principle-following judge (rlexp.rewards.principles): weighted draws without replacement, deterministic
under a seed, one draw per prompt shared by its group, the rendered prompt (intervention principles first), scores
and failures from the GenerativeJudge parser, config errors, and two training steps of reward=salmon on the tiny
model (long)."""

import math
import random

import pytest

from rlexp.rewards.principles import PrincipleJudge, draw_principles, render_principles
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run

POOL = [
    {"name": "a", "definition": "Be accurate.", "weight": 3},
    {"name": "b", "definition": "Be kind.", "weight": 1},
    {"name": "c", "definition": "Be brief.", "weight": 1},
]


def sample(q, completion, group):
    return Sample("p", completion, {"question": q}, group, 3, False)


def test_draw_without_replacement_deterministic_under_a_seed():
    one = [p["name"] for p in draw_principles(POOL, 2, random.Random(7))]
    two = [p["name"] for p in draw_principles(POOL, 2, random.Random(7))]
    assert one == two and len(set(one)) == 2  # same seed, same draw; no principle twice
    assert [p["name"] for p in draw_principles(POOL, None, random.Random(0))] == ["a", "b", "c"]  # all, in order
    assert [p["name"] for p in draw_principles(POOL, 5, random.Random(0))] == ["a", "b", "c"]
    # by weight: "a" (3 of 5) comes first about 60% of the time
    firsts = [draw_principles(POOL, 1, random.Random(s))[0]["name"] for s in range(2000)]
    assert firsts.count("a") / 2000 == pytest.approx(0.6, abs=0.04)


def test_render_puts_interventions_first():
    assert render_principles(["No self-praise."], POOL[1:]) == "- No self-praise.\n- Be kind.\n- Be brief."


def scripted(replies):
    asked = []

    def generate(texts):
        asked.extend(texts)
        return [replies.pop(0) for _ in texts]

    return generate, asked


def test_one_draw_per_prompt_and_the_rendered_prompt():
    gen, asked = scripted([" 7", " 10", " none", " 1"])
    judge = PrincipleJudge(principles=POOL, always=["No self-praise."], max_principles=1, seed=3, generate=gen)
    rows = [sample("Q1", "x", 0), sample("Q1", "y", 0), sample("Q2", "x", 1), sample("Q2", "z", 1)]
    res = judge(rows)
    # reply_prefix "Score:" + " 7" -> (7 - 1) / 9; " none" does not parse: a failure scored 0
    assert res.scores == pytest.approx([6 / 9, 1.0, 0.0, 0.0]) and res.failures == [False, False, True, False]
    assert res.metrics["principles_per_prompt"] == 2.0 and res.metrics["prompts_drawn"] == 2.0
    # the same seed gives the same two draws, in prompt order: Q1's then Q2's
    rng = random.Random(3)
    want = [render_principles(["No self-praise."], draw_principles(POOL, 1, rng)) for _ in range(2)]
    assert asked[0] == (
        "You are a reviewer judging the quality of an AI assistant's response to an instruction.\n\n"
        "Instruction:\nQ1\n\nResponse:\nx\n\n"
        f"Judge the response against these principles:\n{want[0]}\n\n"
        "A good response meets all of them. Grade it from 1 (violates them) to 10 (meets them all). End your reply "
        "with the line 'Score: N', N your grade."
    )
    assert f"principles:\n{want[0]}\n\n" in asked[1]  # the group shares its principles
    assert f"principles:\n{want[1]}\n\n" in asked[2] and f"principles:\n{want[1]}\n\n" in asked[3]
    # a second call draws again (the term's own stream moves on); the cache keys on the principles too
    gen2, asked2 = scripted([" 5"] * 4)
    judge2 = PrincipleJudge(principles=POOL, always=["No self-praise."], max_principles=1, seed=3, generate=gen2)
    judge2(rows)
    assert asked2 == asked  # deterministic under the seed


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="no \\{principles\\} field"):
        PrincipleJudge(principles=POOL, judge_model="initial", template="{question} {completion}")
    with pytest.raises(ValueError, match="principles\\[0\\] has no definition"):
        PrincipleJudge(principles=[{"name": "x"}], judge_model="initial")
    with pytest.raises(ValueError, match="principles\\[0\\].weight=0"):
        PrincipleJudge(principles=[{"definition": "d", "weight": 0}], judge_model="initial")
    with pytest.raises(ValueError, match="no principles"):
        PrincipleJudge(judge_model="initial")
    with pytest.raises(ValueError, match="max_principles=-1"):
        PrincipleJudge(principles=POOL, max_principles=-1, judge_model="initial")
    with pytest.raises(ValueError, match="judge_model is not set"):
        PrincipleJudge(principles=POOL)


@pytest.mark.long
def test_reward_salmon_trains_two_steps_with_the_tiny_judge(tiny_cfg):
    cfg = tiny_cfg("reward=salmon", "reward.terms.salmon.max_new_tokens=4", "trainer.autocast=off")
    m = run(cfg).metrics
    rows = 2 * 4  # prompts_per_step x num_generations of the tiny run
    assert m["reward/salmon/principles_per_prompt"] == 4 + 3  # 4 interventions + 3 drawn
    assert m["reward/salmon/prompts_drawn"] == 2  # one draw per prompt
    assert m["reward/salmon/judged"] + m["reward/salmon/cache_hits"] == rows
    assert m["reward/salmon/failures"] == pytest.approx((1 - m["reward/salmon/parsed_frac"]) * rows)
    assert math.isfinite(m["loss/total"])
