"""ReasonFlux-PRM's trajectory-aware reward (rlexp.rewards.trajectory_prm): the trajectory/response split, the
signal fusion and the three step signals by hand, the term's r = (1 − β)·r_out + β·(mean step + α·trajectory) by hand
with a stand-in step scorer and a generate= judge for the trajectory level (failures, cache, the response-only
input), the unset-PRM config error, and two training steps of reward=accuracy_reasonflux with a tiny random PRM."""

import math

import pytest
import torch

from rlexp.rewards.judges import GenerativeJudge
from rlexp.rewards.terms import Sample
from rlexp.rewards.trajectory_prm import TrajectoryPRMReward, TrajectorySignals, fuse_signals, split_trajectory
from rlexp.runs.training import run


def test_split_trajectory_modes():
    assert split_trajectory("<think>a\n\nb</think>\n#### 5") == ("a\n\nb", "#### 5")
    assert split_trajectory("a\n\nb</think>answer") == ("a\n\nb", "answer")  # R1 templates open the tag in the prompt
    assert split_trajectory("<think>a, cut at the limit") == ("a, cut at the limit", "")
    assert split_trajectory("Add 2 and 2.\n\nSo 4.\n\n#### 4") == ("Add 2 and 2.\n\nSo 4.", "#### 4")  # last paragraph
    assert split_trajectory("Add 2 and 2.\n#### 4") == ("Add 2 and 2.", "#### 4")  # one paragraph: the last line
    assert split_trajectory("#### 4") == ("", "#### 4")
    assert split_trajectory("Add.\n\n#### 4", mode="think") == ("", "Add.\n\n#### 4")  # no tag: no trajectory
    with pytest.raises(ValueError, match="trajectory_split='tags'"):
        split_trajectory("x", mode="tags")


def test_fuse_signals_by_hand():
    # softmax(0, 1) = (1, e) / (1 + e): 0·1/(1+e) + 1·e/(1+e) = 0.731059
    assert fuse_signals([0.0, 1.0]) == pytest.approx(math.e / (1 + math.e))
    assert fuse_signals([0.4, 0.4, 0.4]) == pytest.approx(0.4)  # equal signals: equal weights
    # (0.5, 1, 0): weights e^.5, e, 1 over 5.36700 → 0.5·0.30720 + 1·0.50648 = 0.66008
    assert fuse_signals([0.5, 1.0, 0.0]) == pytest.approx(0.66008, abs=1e-5)


class TableScorer:
    """Step score from a table; a step saying "boom" fails the row; counts the rows it scored."""

    TABLE = {"Add 2 and 3.": 0.8, "That is 5.": 0.6, "Add 2 and 2.": 0.2}

    def __init__(self):
        self.rows = []

    def score_batch(self, questions, steps_lists):
        self.rows += [list(s) for s in steps_lists]
        return [None if any("boom" in s for s in steps) else [self.TABLE.get(s, 0.5) for s in steps]
                for steps in steps_lists]  # fmt: skip


def _sample(completion, answer="5", prompt="p"):
    return Sample(prompt, completion, {"question": "What is 2 + 3?", "answer": answer}, 0, 3, False)


A = "<think>Add 2 and 3.\n\nThat is 5.</think>\n#### 5"
B = "Add 2 and 2.\n\n#### 4"
C = "<think>boom</think>\n#### 5"


def test_term_combines_outcome_steps_and_trajectory_by_hand():
    asked = []

    def judge(prompts):
        asked.extend(prompts)
        return [" 7"] * len(prompts)  # "Score: 7" → (7 − 1)/9 = 2/3

    scorer = TableScorer()
    term = TrajectoryPRMReward(step_scorer=scorer, trajectory_scorer=GenerativeJudge(generate=judge))
    res = term([_sample(A), _sample(B), _sample(C), _sample(A)])
    # A: correct → r_out = +1; steps (0.8, 0.6) → 0.7; r̂ = 0.7 + 2/3 = 1.36667; r = 0.25 + 0.75·1.36667 = 1.275
    # B: "#### 4" ≠ 5 → r_out = −1; trajectory "Add 2 and 2." → 0.2; r̂ = 0.86667; r = −0.25 + 0.65 = 0.4
    # C: the step scorer fails the row → a failure scored by its outcome alone, 0.25·(+1)
    assert res.scores == pytest.approx([1.275, 0.4, 0.25, 1.275])
    assert res.failures == [False, False, True, False]
    assert len(scorer.rows) == 3 and scorer.rows[1] == ["Add 2 and 2."]  # the repeated A was scored once
    m = res.metrics
    assert m["cache_hits"] == 1 and m["prm_scored_frac"] == 0.75 and m["thinking_frac"] == 1.0
    assert m["prm_mean"] == pytest.approx((1.366667 * 2 + 0.866667) / 3, abs=1e-5)
    assert m["step_mean"] == pytest.approx((0.7 * 2 + 0.2) / 3) and m["trajectory_mean"] == pytest.approx(2 / 3)
    assert m["outcome_mean"] == pytest.approx(0.5) and m["steps_mean"] == pytest.approx(5 / 3)
    assert "<think>Add 2 and 3." in asked[0]  # the trajectory judge saw the whole completion
    again = term([_sample(A), _sample(B)])
    assert again.scores == pytest.approx([1.275, 0.4]) and again.metrics["cache_hits"] == 2 and len(scorer.rows) == 3
    # unit outcome and β, α: B with r_out = 0, β = 0.5, α = 0 → 0.5·0 + 0.5·0.2 = 0.1
    plain = TrajectoryPRMReward(step_scorer=TableScorer(), trajectory_scorer=GenerativeJudge(generate=judge),
                                beta=0.5, alpha=0.0, outcome_scale="unit")  # fmt: skip
    assert plain([_sample(B)]).scores == pytest.approx([0.1])


def test_default_trajectory_level_is_the_step_scorer_on_the_whole_completion():
    scorer = TableScorer()
    res = TrajectoryPRMReward(step_scorer=scorer)([_sample(B)])
    # steps: ["Add 2 and 2."] → 0.2; the whole completion as one step (not in the table) → 0.5
    assert scorer.rows == [["Add 2 and 2."], [B]]
    assert res.scores == pytest.approx([-0.25 + 0.75 * (0.2 + 0.5)])
    resp = TrajectoryPRMReward(step_scorer=TableScorer(), trajectory_input="response")
    resp([_sample(B)])
    assert resp.step_scorer.rows[1] == ["#### 4"]  # the response alone


def test_response_only_trajectory_input_and_a_blank_completion():
    asked = []
    judge = GenerativeJudge(generate=lambda ps: asked.extend(ps) or [" 10"] * len(ps))
    term = TrajectoryPRMReward(step_scorer=TableScorer(), trajectory_scorer=judge, trajectory_input="response")
    res = term([_sample(A), _sample("   ")])
    assert "Add 2 and 3." not in asked[0] and "#### 5" in asked[0]
    # blank: no step, the PRM does not apply (missing, not a failure): (1 − β)·r_out = 0.25·(−1)
    assert res.scores[1] == pytest.approx(-0.25) and res.missing == [False, True] and res.failures == [False, False]
    assert res.scores[0] == pytest.approx(0.25 + 0.75 * (0.7 + 1.0))


def test_bad_settings_and_the_unset_prm_name_the_key(tiny_cfg):
    from rlexp.config.schema import ConfigError
    from rlexp.runs.setup import build_reward_term

    with pytest.raises(ValueError, match="prm_model is null"):
        TrajectoryPRMReward()
    for kwargs, match in (
        ({"beta": 1.5}, "beta=1.5"),
        ({"alpha": -1}, "alpha=-1"),
        ({"outcome_scale": "pm"}, "outcome_scale='pm'"),
        ({"split": "words"}, "split='words'"),
        ({"trajectory_input": "steps"}, "trajectory_input='steps'"),
    ):
        with pytest.raises(ValueError, match=match):
            TrajectoryPRMReward(step_scorer=TableScorer(), **kwargs)
    cfg = tiny_cfg("reward=accuracy_reasonflux")
    with pytest.raises(ConfigError, match=r"reward\.terms\.reasonflux: prm_model is null.*reward\.terms\.<name>"):
        build_reward_term(cfg.reward.terms.reasonflux, "reward.terms.reasonflux")


def test_trajectory_signals_by_hand():
    vectors = {
        "q1": (1.0, 0.0), "s1a": (1.0, 0.0), "s1b": (0.0, 1.0), "r1": (1.0, 0.0),
        "q2": (0.0, 1.0), "s2a": (0.0, 1.0), "r2": (0.0, 1.0),
    }  # fmt: skip

    class Quality:
        def score_batch(self, questions, steps_lists):
            return [[{"s1a": 1.0, "s1b": 0.0, "s2a": 0.5}[s] for s in steps] for steps in steps_lists]

    sig = TrajectorySignals(quality=Quality(), embed=lambda texts: torch.tensor([vectors[t] for t in texts]), tau=1.0)
    got = sig.score_trajectories(["q1", "q2"], [["s1a", "s1b"], ["s2a"]], ["r1", "r2"])
    # alignment: cos(s1a, r1) = 1, cos(s1b, r1) = 0, cos(s2a, r2) = 1
    # coherence (τ = 1; negatives: the other row's steps): s1a after q1: log(e / (e + e^0)) = 1 − log(e + 1) = −0.31326
    #   s1b after s1a: sims (0 | s2a: 0) → log(1/2) = −0.69315; s2a after q2: sims (1 | s1a: 0, s1b: 1)
    #   → 1 − log(2e + 1) = −0.86201
    want = [
        [fuse_signals([1.0, 1.0, -0.31326]), fuse_signals([0.0, 0.0, -0.69315])],
        [fuse_signals([1.0, 0.5, -0.86201])],
    ]
    assert got[0] == pytest.approx(want[0], abs=1e-4) and got[1] == pytest.approx(want[1], abs=1e-4)
    # without the responses (score_batch): alignment leaves the fusion
    alone = sig.score_batch(["q1"], [["s1a"]])  # no other row: no negatives, coherence log(1) = 0
    assert alone == [pytest.approx([fuse_signals([1.0, 0.0])])]
    # as the term's step scorer, the response reaches the alignment signal
    term = TrajectoryPRMReward(step_scorer=sig, trajectory_scorer=GenerativeJudge(generate=lambda ps: [" 1"] * len(ps)))
    res = term([Sample("p", "<think>s1a\n\ns1b</think>r1", {"question": "q1", "answer": "9"}, 0, 3, False)])
    # one row: no negatives, coherence 0 → s1a: fuse(1, 1, 0) = 2e/(2e + 1) = 0.84464; s1b: fuse(0, 0, 0) = 0
    assert res.metrics["step_mean"] == pytest.approx(0.84464 / 2, abs=1e-5)
    with pytest.raises(ValueError, match="quality is not set"):
        TrajectorySignals(embed=lambda t: torch.zeros(len(t), 2))
    with pytest.raises(ValueError, match="need an encoder"):
        TrajectorySignals(quality=Quality())


def test_trajectory_signals_embed_with_the_initial_policy(tiny):
    class Half:
        def score_steps(self, question, steps):
            return [0.5] * len(steps)

    sig = TrajectorySignals(quality=Half(), encoder_model="initial", device="cpu")
    with pytest.raises(RuntimeError, match="has not been given"):
        sig.embed(["a"])
    sig.bind(tiny.model, tiny.tokenizer)
    vecs = sig.embed(["Add 2 and 3.", "That is 5.", "Add 2 and 3."])
    assert vecs.shape[0] == 3 and torch.allclose(vecs.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert torch.allclose(vecs[0], vecs[2], atol=1e-5)  # padding does not change a text's embedding
    got = sig.score_trajectories(["q", "r"], [["Add 2 and 3.", "That is 5."], ["Hello."]], ["#### 5", "#### 1"])
    assert [len(g) for g in got] == [2, 1] and all(math.isfinite(v) for g in got for v in g)


@pytest.mark.long  # a two-step run (default suite budget)
def test_accuracy_reasonflux_trains_two_steps_with_a_tiny_prm(tiny_cfg, prm_path):
    result = run(
        tiny_cfg(
            "reward=accuracy_reasonflux",
            "reward.terms.reasonflux.verifier._target_=tests.algorithms.varying_reward.VowelShare",
            f"reward.terms.reasonflux.prm_model={prm_path}",
            "reward.terms.reasonflux.prm_style=math_shepherd",
            "reward.terms.reasonflux.split=lines",
            "trainer.autocast=off",
            "trainer.max_new_tokens=8",
            "trainer.device=cpu",
        )
    )
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert m["reward/reasonflux/prm_scored_frac"] == 1.0 and m["reward/reasonflux/failures"] == 0.0
    # r̂ = mean step probability + the whole completion's probability: in (0, 2)
    assert 0.0 < m["reward/reasonflux/prm_mean"] < 2.0 and 0.0 < m["reward/reasonflux/trajectory_mean"] < 1.0
    assert m["reward/reasonflux/steps_mean"] >= 1.0
