"""CoMAS's discussion (rlexp/algorithms/group_stages/discussion.py): the quote fitting by hand, the rows built per role
on a hand-made discussion (scripted replies: every reward worked out by hand), the settings' errors, then two training
steps on the tiny model with a scripted scorer (tests/algorithms/comas_engine.py; conf/algorithm/comas.yaml)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.discussion import (
    SCORER_TEMPLATE,
    Discussion,
    fit_quotes,
    quote_cap,
    render_discussion,
)
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import UNSCORED
from rlexp.data.prompts import PromptFormat
from rlexp.rewards.scoring import score
from rlexp.rewards.terms import RewardTerm
from rlexp.runs.training import run
from tests.algorithms.comas_engine import SCORER_MARK, scripted_output

# ---------------------------------------------------------------- the quotes, by hand


def test_the_quote_cap_cuts_the_longest_quotes_first():
    # lengths 10, 4, 2 in a budget of 10: c = 4 keeps 4 + 4 + 2 = 10 (c = 5 would take 11)
    assert quote_cap([10, 4, 2], 10) == 4
    assert quote_cap([10, 4, 2], 16) == 10  # everything fits: no cut
    assert quote_cap([10, 4, 2], 5) == 1  # 1 + 1 + 1 = 3 ≤ 5, c = 2 would take 2 + 2 + 2 = 6
    assert quote_cap([10, 4, 2], 0) == 0
    assert quote_cap([], 5) == 0


def test_a_quote_over_the_limit_keeps_its_end(tiny):
    tok = tiny.tokenizer
    solution = "We add the numbers one at a time and carry the tens. " * 8 + "#### 42"
    evaluation = "Fine."

    def compose(q):
        return f"Problem: 40 + 2\nSolution: {q[0]}\nEvaluation: {q[1]}"

    def render(m):
        return tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False)

    full = compose([solution, evaluation])
    n = len(tok(render(full), add_special_tokens=False)["input_ids"])
    assert fit_quotes(tok, compose, render, [solution, evaluation], n) == (full, False)
    assert fit_quotes(tok, compose, render, [solution, evaluation], None) == (full, False)
    text, cut = fit_quotes(tok, compose, render, [solution, evaluation], n - 20)
    assert cut and len(tok(render(text), add_special_tokens=False)["input_ids"]) <= n - 20
    # the long solution lost its start (its answer stays), the short evaluation is whole
    assert "Solution: ..." in text and text.endswith("#### 42\nEvaluation: Fine.")


def test_the_discussion_shown_numbers_each_solution_and_its_evaluation():
    assert render_discussion([(" s1 ", "e1"), ("s2", " e2\n")]) == (
        "--- Discussion 1 ---\nSolution: s1\nEvaluation: e1\n\n--- Discussion 2 ---\nSolution: s2\nEvaluation: e2"
    )


# ---------------------------------------------------------------- a hand-made discussion

# round 1: problem A's solutions S-three and S-one, problem B's S-none and S-big; the scorer's verdict on each is
# scripted: 3, 1, no score (missing), 5 (out of range). Round 2: every solver writes S-two, scored 2.
VERDICTS = {
    "S-three": "The review is wrong. <score>3</score>",
    "S-one": "Fatal. <score>1</score>",
    "S-none": "No verdict.",
    "S-big": "<score>5</score>",
    "S-two": "Minor slips. <score>2</score>",
}
RECORDS = [
    {"id": "a", "question": "Problem A: 1 + 2?", "answer": "3"},
    {"id": "b", "question": "Problem B: 2 + 2?", "answer": "4"},
]


class Scripted:
    """A rollout engine whose replies depend on the prompt: a round-2 solver writes S-two, an evaluator E(<the
    solution>), a scorer the verdict on the solution it is shown; ``calls`` logs (prompts, num_generations)."""

    def __init__(self):
        self.calls = []

    def generate(self, model, tokenizer, prompts, num_generations=1, **_):
        self.calls.append((list(prompts), num_generations))
        replies = []
        for p in prompts:
            if SCORER_MARK in p:
                replies.append(next(v for k, v in VERDICTS.items() if f"A proposed solution:\n{k}\n" in p))
            elif "Review the solution critically" in p:
                replies.append(next(f"E({k})" for k in VERDICTS if f"A proposed solution:\n{k}\n" in p))
            else:
                replies += ["S-two"] * num_generations
        expanded = [p for p in prompts for _ in range(len(replies) // len(prompts))]
        return scripted_output(tokenizer, expanded, replies)


class Three(RewardTerm):
    """A test verifier (weight 0, logged only): 1 for a solution named S-three."""

    def score(self, sample) -> float:
        return float(sample.completion.strip() == "S-three")


@pytest.fixture
def discussion(tiny):
    fmt = PromptFormat(system_prompt="Solve it.", answer_format="hash", instruction="End with '#### <answer>'.")
    terms = {"accuracy": Three(weight=0.0)}
    engine = Scripted()
    ctx = SimpleNamespace(
        policy=torch.nn.Linear(1, 1),
        tokenizer=tiny.tokenizer,
        rollout=engine,
        reward_terms=terms,
        prompt_format=fmt,
        answer_format="hash",
        autocast_dtype=None,
        step=1,
    )
    prompts = [fmt.render(tiny.tokenizer, r["question"]) for r in RECORDS]
    rows = [p for p in prompts for _ in range(2)]
    out = scripted_output(tiny.tokenizer, rows, ["S-three", "S-one", "S-none", "S-big"])
    batch = RolloutBatch.from_generation(out, torch.tensor([0, 0, 1, 1]), rows, [r for r in RECORDS for _ in range(2)])
    score(batch, terms)
    batch.stats["time/reward_s"] = 0.0
    return batch, ctx, engine


def test_every_reply_is_a_row_rewarded_by_its_role(discussion):
    batch, ctx, engine = discussion
    out = Discussion(rounds=2, references=1, seed=3)(batch, ctx)
    s = out.stats
    # 2 rounds x (4 solutions, 4 evaluations, 4 scorings); each (round, role, problem) block a group of its own
    assert len(out) == 24 and s["comas/rows_by_role/solution"] == 8.0
    assert s["comas/rows_by_role/evaluation"] == 8.0 and s["comas/rows_by_role/scoring"] == 8.0
    assert out.group_ids.tolist() == [g for g in range(12) for _ in range(2)]
    assert out.completions[:12] == [
        *["S-three", "S-one", "S-none", "S-big"],
        *["E(S-three)", "E(S-one)", "E(S-none)", "E(S-big)"],
        *[VERDICTS[k] for k in ("S-three", "S-one", "S-none", "S-big")],
    ]
    assert out.completions[12:16] == ["S-two"] * 4
    # round 1: scores 3, 1, none, none (5 is out of range) -> solutions (3−1)/2 = 1, 0, 0, 0; evaluations 0, 1, 0, 0;
    # scorings 0, 0, −1, −1. Round 2: 2 everywhere -> 1/2, 1/2, 0.
    expected = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, -1, -1] + [0.5] * 8 + [0.0] * 4
    assert out.term("interaction").tolist() == pytest.approx(expected)
    # the run's verifier is at weight 0: the reward is the interaction reward; role rows have 0 in its column
    assert out.reward.tolist() == pytest.approx(expected)
    assert out.reward_names == ["accuracy", "interaction"] and out.reward_weights.tolist() == [0.0, 1.0]
    assert out.term("accuracy").tolist() == [1, 0, 0, 0] + [0.0] * 20
    assert not bool(out.reward_failures.any()) and out.extras[UNSCORED].tolist() == [False] * 24
    # each row under the prompt it was sampled from: the evaluator sees the solution, the scorer also its evaluation
    assert "A proposed solution:\nS-one\n" in out.prompts[5] and "Problem A: 1 + 2?" in out.prompts[5]
    assert "A review of the solution:\nE(S-big)" in out.prompts[11] and "Problem B: 2 + 2?" in out.prompts[11]
    ids = out.prompt_ids[11][out.prompt_mask[11].bool()].tolist()
    assert ids == ctx.tokenizer(out.prompts[11], add_special_tokens=False)["input_ids"]
    # round 2's solvers (G = 2 replies per problem, in the run's prompt format) see one discussion of their problem
    solver_prompts, g = engine.calls[2]
    assert g == 2 and len(solver_prompts) == 2
    a, b = solver_prompts
    assert "Problem A: 1 + 2?" in a and "--- Discussion 1 ---" in a and "--- Discussion 2 ---" not in a
    assert any(f"Solution: {k}\nEvaluation: E({k})" in a for k in ("S-three", "S-one"))
    assert any(f"Solution: {k}\nEvaluation: E({k})" in b for k in ("S-none", "S-big"))
    assert "Solve it." in a and "End with '#### <answer>'." in a  # the run's system prompt and answer instruction
    assert out.prompts[12] == a and out.prompts[14] == b
    # the stats, by hand: parsed 3, 1, 2, 2, 2, 2 -> normalised 1, 0, 1/2 x 4: mean 1/2; raw mean 12/6 = 2
    assert s["comas/score_parsed"] == 6.0 and s["comas/score_parse_failures"] == 2.0
    assert s["comas/score_missing"] == 1.0 and s["comas/score_out_of_range"] == 1.0 and s["comas/score_malformed"] == 0
    assert s["comas/solution_score_mean"] == pytest.approx(0.5) and s["comas/score_mean"] == pytest.approx(2.0)
    assert s["comas/solution_score_round1"] == pytest.approx(0.5) and s["comas/solution_score_round2"] == 0.5
    assert s["comas/solution_reward_mean"] == pytest.approx(3 / 8)  # (1 + 0 + 0 + 0 + 4 x 1/2) / 8
    assert s["comas/evaluation_reward_mean"] == pytest.approx(3 / 8)  # (0 + 1 + 0 + 0 + 4 x 1/2) / 8
    assert s["comas/scoring_reward_mean"] == pytest.approx(-0.25)  # −2 / 8
    assert s["comas/accuracy_round1"] == 0.25 and s["comas/accuracy_round2"] == 0.0
    assert s["comas/solution_accuracy"] == pytest.approx(1 / 8) and s["comas/clipped_prompts"] == 0.0
    assert s["time/comas_generate_s"] >= 0.0 and "time/reward_s" in s


def test_one_round_of_scorings_only(discussion):
    batch, ctx, engine = discussion
    out = Discussion(rounds=1, train_roles=["scoring"])(batch, ctx)
    assert len(out) == 4 and out.completions == [VERDICTS[k] for k in ("S-three", "S-one", "S-none", "S-big")]
    assert out.term("interaction").tolist() == [0.0, 0.0, -1.0, -1.0]
    assert out.stats["comas/rows_by_role/solution"] == 0.0 and out.stats["comas/rows_by_role/scoring"] == 4.0
    # the solutions' rewards are still reported (their rows do not train)
    assert out.stats["comas/solution_reward_mean"] == pytest.approx(0.25)
    assert len(engine.calls) == 2  # evaluations, scorings: no second round


def test_refuses_a_trained_verifier_a_late_place_and_a_multi_turn_rollout(discussion):
    batch, ctx, _ = discussion
    ctx.reward_terms["accuracy"].weight = 1.0
    batch.reward_weights = torch.ones(1)
    with pytest.raises(ValueError, match="trains without labels"):
        Discussion()(batch, ctx)
    Discussion(label_term=None, rounds=1)(batch.select([0, 1, 2, 3]), ctx)  # no check: it runs
    extra = batch.select([0, 1, 2, 3])
    extra.reward_names = ["accuracy", "bonus"]
    with pytest.raises(ValueError, match="put it first among the group stages"):
        Discussion(label_term=None)(extra, ctx)
    ctx.rollout.needs_records = True
    with pytest.raises(ValueError, match="single-turn rollout"):
        Discussion(label_term=None)(batch, ctx)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rounds": 0}, "rounds"),
        ({"references": 0}, "references"),
        ({"name": ""}, "name"),
        ({"solver_template": "{problem}"}, "solver_template lacks {discussion}"),
        ({"evaluator_template": "{problem} {solution} {score}"}, "evaluator_template"),
        ({"scorer_template": SCORER_TEMPLATE.replace("{evaluation}", "")}, "scorer_template lacks"),
        ({"discussion_template": "{solution}"}, "discussion_template"),
        ({"score_pattern": "<score>"}, "score_pattern"),
        ({"scale": [3, 1]}, "scale"),
        ({"failure_rewards": [0.0, -1.0]}, "failure_rewards"),
        ({"train_roles": ["judging"]}, "train_roles"),
        ({"train_roles": []}, "train_roles"),
    ],
)
def test_bad_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Discussion(**kwargs)


# ---------------------------------------------------------------- two steps on the tiny model

# the overrides a tiny run of algorithm=comas needs: the run's verifier logged only, a scripted scorer
COMAS = ["algorithm=comas", "reward=label_free", "rollout._target_=tests.algorithms.comas_engine.ScriptedScorer"]


@pytest.mark.long  # two steps of 2 prompts x 4 agents x 2 rounds x 3 roles = 48 rows (~30 s CPU; 2 min loaded)
def test_comas_trains_two_steps_and_counts_its_scores(tiny_cfg):
    result = run(tiny_cfg(*COMAS, "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # 8 solutions a round, 2 rounds: 16 rows per role; the scripted verdicts per round 3, 1, none, 2, 3, 1, none, 2
    assert m["batch/completions"] == 48.0
    for role in ("solution", "evaluation", "scoring"):
        assert m[f"comas/rows_by_role/{role}"] == 16.0
    assert m["comas/score_parse_failures"] == 4.0 and m["comas/score_missing"] == 4.0 and m["comas/score_parsed"] == 12
    # normalised 1, 0, 1/2 twice a round: mean 1/2; raw mean 2
    assert m["comas/solution_score_mean"] == pytest.approx(0.5) and m["comas/score_mean"] == pytest.approx(2.0)
    assert m["comas/scoring_reward_mean"] == pytest.approx(-4 / 16)
    assert m["reward/interaction/std"] > 0 and m["reward/accuracy/failures"] == 0.0
    # the tiny model's replies hit the token limit and leave the loss (the release's mask_truncated_completions);
    # the scripted verdicts end with EOS and train
    assert 0.0 < m["overlong/masked_frac"] < 1.0
    assert m["advantage/abs_mean"] > 0 and m["grad_norm"] > 0
