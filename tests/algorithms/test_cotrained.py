"""Co-trained second models (rlexp.algorithms.group_stages.cotrained): Cooper's reward model and RL Tango's verifier.

Hand-computed parts (the contrastive loss, the pairs, the verification's parse, format score and reward, the step
rewards, α's decay, the class weights), the stages on hand-made batches with the tiny model (the second model
changes, its state round-trips), and two training steps of each method on the tiny model (long)."""

from __future__ import annotations

import copy
import math
import random
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages import cotrained
from rlexp.algorithms.group_stages.cotrained import (
    CooperRewardModel,
    CoTrained,
    TangoVerifier,
    alpha_at,
    class_coefficients,
    clip_middle,
    contrastive_loss,
    cooper_pairs,
    parse_verification,
    step_rewards,
    verifier_format_score,
    verifier_reward,
)
from rlexp.core.masks import TOKEN_REWARDS
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING

# ---------------------------------------------------------------- Cooper, by hand


def test_contrastive_loss_of_two_pairs():
    """s⁺ = (2, 0), s⁻ = (1, 1): differences 1 and −1; −log σ(1) = log(1 + e⁻¹) = 0.313262,
    −log σ(−1) = log(1 + e) = 1.313262; the mean 0.813262."""
    loss = contrastive_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert loss.item() == pytest.approx(0.813262, abs=1e-6)
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.e)) / 2)


def test_cooper_pairs_per_group():
    # group 0: row 0 correct, rows 1-2 wrong (row 2 scored higher); group 1: no correct; group 2: no wrong;
    # group 3: two correct, one wrong: one pair (pairs_per_group 1), then two with 2 (only one wrong: one pair)
    groups = [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    correct = [True, False, False, False, False, True, True, False, True, True]
    scores = [0.0, 0.1, 0.9, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0]
    assert cooper_pairs(groups, correct, scores, "hardest") == [(0, 2), (8, 7)]
    assert cooper_pairs(groups, correct, scores, "first") == [(0, 1), (8, 7)]
    assert cooper_pairs(groups, correct, scores, "first", per_group=2) == [(0, 1), (8, 7)]
    rand = cooper_pairs(groups, correct, scores, "random", rng=random.Random(0))
    assert rand[0][0] == 0 and rand[0][1] in (1, 2) and rand[1] == (8, 7)
    with pytest.raises(ValueError, match="negative"):
        cooper_pairs(groups, correct, scores, "easiest")


def test_clip_middle_keeps_the_release_head_and_tail():
    text = "a" * 500 + "b" * 600 + "c" * 1000
    assert clip_middle(text) == "a" * 500 + "c" * 1000  # 2100 > 1500: first 500 + last 1000
    assert clip_middle("short") == "short" and clip_middle(text, 0) == text


def test_cooper_settings_are_checked():
    with pytest.raises(ValueError, match="negative"):
        CooperRewardModel(negative="easiest")
    with pytest.raises(ValueError, match="template lacks"):
        CooperRewardModel(template="{question} {completion}")
    with pytest.raises(ValueError, match="lr"):
        CooperRewardModel(lr=0.0)


# ---------------------------------------------------------------- RL Tango, by hand

GOOD = (
    "<step_verification>\n<step>Step 1: 2 + 3 = 5 holds. \\boxed{CORRECT}</step>\n"
    "<step>Step 2: 5 * 2 is not 12. \\boxed{INCORRECT}</step>\n</step_verification>\n"
    "<final_verification>\\boxed{INCORRECT}</final_verification>"
)


def test_parse_verification_reads_steps_and_final():
    assert parse_verification(GOOD) == (0.0, [1.0, 0.0])
    # a step block without a verdict is None; no final section: None
    final, steps = parse_verification("<step_verification><step>hmm</step></step_verification>")
    assert final is None and steps == [None]
    assert parse_verification("random text") == (None, [])


def test_verifier_format_score_by_hand():
    assert verifier_format_score(GOOD, 2) == 1.0
    assert verifier_format_score(GOOD, 3) == pytest.approx(0.2)  # 2 judged steps for 3: −0.8
    extra = GOOD.replace("<step_verification>\n", "<step_verification>\nnote ")
    assert verifier_format_score(extra, 2) == pytest.approx(0.6)  # text outside the step blocks: −0.4
    no_box = GOOD.replace("<final_verification>\\boxed{INCORRECT}", "<final_verification>wrong")
    assert verifier_format_score(no_box, 2) == pytest.approx(0.2)  # no boxed final verdict: −0.8
    assert verifier_format_score("Step 1 is fine. \\boxed{CORRECT}", 1) == 0.0  # not the two sections


def test_verifier_reward_by_hand():
    """1 × (final verdict agrees with the rule) + 0.8 × format."""
    assert verifier_reward(0.0, False, 1.0) == pytest.approx(1.8)  # INCORRECT for a wrong solution
    assert verifier_reward(0.0, True, 1.0) == pytest.approx(0.8)  # INCORRECT for a correct one
    assert verifier_reward(1.0, True, 0.2) == pytest.approx(1.16)
    assert verifier_reward(None, False, 0.0) == 0.0  # no verdict: never right


def test_step_rewards_need_the_solutions_step_count():
    assert step_rewards([1.0, 0.0], 2) == [0.5, -0.5]
    assert step_rewards([1.0, 1.0, 1.0, 0.0], 4) == [0.25, 0.25, 0.25, -0.25]
    assert step_rewards([1.0], 2) is None and step_rewards([1.0, None], 2) is None and step_rewards([], 0) is None


def test_alpha_decays_exponentially_to_its_minimum():
    """α₀ = 0.5, min 1e-3, 10 steps: k = ln(500)/10; t = 5: 0.5·500^(−1/2) = 0.022361."""
    assert alpha_at(0, 10, 0.5, 1e-3) == pytest.approx(0.5)
    assert alpha_at(5, 10, 0.5, 1e-3) == pytest.approx(0.5 / math.sqrt(500))
    assert alpha_at(10, 10, 0.5, 1e-3) == pytest.approx(1e-3)
    assert alpha_at(30, 10, 0.5, 1e-3) == pytest.approx(1e-3)  # never below the minimum
    assert alpha_at(-1, 10, 0.5, 1e-3) == 0.0  # warm-up: no step rewards
    assert alpha_at(5, 10, 0.5, 0.1, "linear") == pytest.approx(0.3)
    assert alpha_at(5, 10, 0.5, 0.1, "cosine") == pytest.approx(0.3)
    assert alpha_at(7, 10, 0.5, 0.1, "constant") == 0.5


def test_class_coefficients_by_hand():
    """Labels (T, F, F, F): counts (1, 3); 1/√count = (1, 0.57735); sum 1 + 3·0.57735 = 2.73205, scale 4/2.73205 =
    1.46410: correct 1.46410, wrong 0.84530 (mean 1). Next batch (T, T, F, F), decay 0.8: counts
    (0.8 + 0.4, 2.4 + 0.4) = (1.2, 2.8)."""
    coefs, counts = class_coefficients([True, False, False, False], None, 0.8, "sqrt_inverse")
    assert counts == (1.0, 3.0)
    assert coefs == pytest.approx([1.46410, 0.84530, 0.84530, 0.84530], abs=1e-5)
    assert sum(coefs) == pytest.approx(4.0)
    coefs, counts = class_coefficients([True, True, False, False], counts, 0.8, "inverse")
    assert counts == pytest.approx((1.2, 2.8))
    # 1/1.2 = 0.83333, 1/2.8 = 0.35714; scale 4 / (2·0.83333 + 2·0.35714) = 1.68
    assert coefs == pytest.approx([1.4, 1.4, 0.6, 0.6], abs=1e-5)
    assert class_coefficients([True, False], (1.0, 1.0), 0.8, "none") == ([1.0, 1.0], (1.0, 1.0))


def test_tango_settings_are_checked():
    with pytest.raises(ValueError, match="alpha_min"):
        TangoVerifier(alpha_start=0.1, alpha_min=0.5)
    with pytest.raises(ValueError, match="split"):
        TangoVerifier(split="words")
    with pytest.raises(ValueError, match="num_verifications"):
        TangoVerifier(num_verifications=0)
    with pytest.raises(ValueError, match="template"):
        TangoVerifier(template="{problem} {solution}")
    assert TangoVerifier().needs_reference and not TangoVerifier(kl_coef=0.0).needs_reference


# ---------------------------------------------------------------- the stages on the tiny model


def _ctx(tiny, step=1, reference=None, **settings):
    settings = {"max_steps": 4, "max_new_tokens": 4, **settings}
    return SimpleNamespace(
        policy=tiny.model,
        tokenizer=tiny.tokenizer,
        reference=reference,
        step=step,
        settings=SimpleNamespace(**settings),
        autocast_dtype=None,
    )


def _batch(correct, groups, completions):
    b = make_batch(None, groups, terms=[[float(c)] for c in correct])
    b.reward_names = ["accuracy"]
    b.completions = list(completions)
    return b


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_cooper_stage_pays_the_reward_model_and_trains_it(tiny):
    stage = CooperRewardModel(batch_size=4)
    b = _batch([1, 0, 0, 1], [0, 0, 1, 1], ["#### 5", "#### 7", "#### 3", "#### 4"])
    out = stage(b, _ctx(tiny))
    assert out.reward_names == ["accuracy", "cooper_rm"]
    assert out.reward_weights.tolist() == [0.0, 1.0]  # the rule only picks the pairs (rule_weight 0)
    p = out.term("cooper_rm")
    assert torch.all((p > 0) & (p < 1)) and torch.allclose(out.reward, p)
    s = out.stats
    assert s["cooper/rm_pairs"] == 2 and s["cooper/rm_valid_rate"] == 1.0 and s["cooper/rm_updates"] == 1
    assert s["cooper/rm_loss"] > 0 and math.isfinite(s["cooper/rm_grad_norm"]) and s["cooper/rm_grad_norm"] > 0
    # the reward model is a second model: the policy's trunk is untouched, the reward model's moved
    trunk = tiny.model.model.state_dict()
    moved = [k for k, v in stage.model.model.state_dict().items() if not torch.equal(v, trunk[k])]
    assert moved and stage.model is not tiny.model


def test_cooper_state_dict_round_trip(tiny):
    """A resumed stage loads the state before its model exists: built, it holds the saved weights and optimiser
    state, not the policy's initial weights."""
    a = CooperRewardModel(batch_size=4)
    a(_batch([1, 0], [0, 0], ["#### 5", "#### 6"]), _ctx(tiny))
    state = copy.deepcopy(a.state_dict())
    assert set(state) == {"model", "optimizer", "updates"} and state["updates"] == 1
    b = CooperRewardModel(batch_size=4)
    assert b.state_dict() is None
    b.load_state_dict(state)
    assert b.state_dict() is state  # kept until built
    b.build(_ctx(tiny))
    for k, v in a.model.state_dict().items():
        assert torch.equal(b.model.state_dict()[k], v), k
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)
    assert b.updates == 1
    b.load_state_dict(None)  # a checkpoint without the stage's state leaves it as it is
    assert b.updates == 1


def test_tango_stage_pays_step_rewards_and_trains_the_verifier(tiny, monkeypatch):
    """The tiny model's verifications are noise: a stand-in parse reads a verdict from each one's length, so the K
    verifications of a solution disagree (non-zero GRPO advantages) and the one step of each solution is judged."""
    monkeypatch.setattr(cotrained, "parse_verification", lambda t: (float(len(t) % 2), [float(len(t) % 2)]))
    stage = TangoVerifier(num_verifications=3, kl_coef=0.0, entropy_coef=0.0, max_new_tokens=6, split="paragraphs")
    b = _batch([1, 0, 0, 1], [0, 0, 1, 1], ["2 + 3 = 5", "2 + 3 = 6", "7 - 4 = 2", "7 - 4 = 3"])
    before = _weights(tiny.model)
    out = stage(b, _ctx(tiny))
    s = out.stats
    assert s["tango/verifications"] == 2 * 3 + 2 * 1  # a training solution per group × K, one for the others
    assert s["tango/alpha"] == pytest.approx(0.5) and s["tango/verifier_updates"] == 1
    assert 0.0 <= s["tango/verifier_accuracy"] <= 1.0 and s["tango/verdict_parse_failures"] == 0
    assert s["tango/step_alignment"] == 1.0 and s["tango/rows_with_step_rewards"] > 0
    assert s["tango/verifier_adv_abs_mean"] > 0 and s["tango/verifier_grad_norm"] > 0
    # each paid row: α × (mean of ±1 over its verifications) at its one step's last token
    tr = out.extras[TOKEN_REWARDS]
    col = out.term("tango_process")
    for i in range(4):
        last = int(out.completion_mask[i].sum()) - 1
        assert tr[i, last].item() == pytest.approx(0.5 * col[i].item())
        assert tr[i, :last].abs().sum() == 0
    assert out.reward_weights.tolist() == [1.0, 0.0]  # the log column does not enter the outcome
    for k, v in tiny.model.state_dict().items():  # the policy is untouched
        assert torch.equal(v, before[k])
    moved = [k for k, v in stage.model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved  # the verifier took its step
    state = copy.deepcopy(stage.state_dict())  # the class counts are over the verifications (3 per solution)
    assert state["label_counts"] == (3.0, 3.0) and state["updates"] == 1
    again = TangoVerifier(num_verifications=3, kl_coef=0.0)
    again.load_state_dict(state)
    again.build(_ctx(tiny))
    assert again.label_counts == (3.0, 3.0) and again.updates == 1
    assert all(torch.equal(again.model.state_dict()[k], v) for k, v in stage.model.state_dict().items())


def test_tango_reply_prefix_is_read_as_the_start_of_the_reply(tiny):
    stage = TangoVerifier(reply_prefix="<step_verification>\n<step>", max_new_tokens=3)
    stage.build(_ctx(tiny))
    prompt = stage.prompt("What is 2 + 3?", ["2 + 3 = 5"])
    assert prompt.endswith("<|im_start|>assistant\n<step_verification>\n<step>") and "1 numbered steps" in prompt
    (sample,) = stage.sample([prompt], [1], _ctx(tiny), step=1)
    assert sample["text"].startswith("<step_verification>\n<step>") and 1 <= len(sample["completion"]) <= 3
    assert tiny.tokenizer.decode(sample["prompt"]) == prompt  # the prefix is prompt, not sampled


def test_tango_kl_needs_the_frozen_reference(tiny, monkeypatch):
    monkeypatch.setattr(cotrained, "parse_verification", lambda t: (float(len(t) % 2), [1.0]))
    stage = TangoVerifier(num_verifications=2, max_new_tokens=4, split="paragraphs")
    b = _batch([1, 0], [0, 0], ["2 + 3 = 5", "2 + 3 = 6"])
    with pytest.raises(ValueError, match="reference"):
        stage(b, _ctx(tiny, reference=SimpleNamespace(model=tiny.model, kind="ema")))
    ref = SimpleNamespace(model=copy.deepcopy(tiny.model).requires_grad_(False), kind="frozen")
    out = TangoVerifier(num_verifications=2, max_new_tokens=4, split="paragraphs")(b, _ctx(tiny, reference=ref))
    assert out.stats["tango/verifier_kl"] == pytest.approx(0.0, abs=1e-6)  # the first step starts at the anchor
    assert out.stats["tango/verifier_entropy"] > 0


# ---------------------------------------------------------------- two training steps on the tiny model (long)


@pytest.fixture
def spy_models(monkeypatch):
    """The second models the run builds, with their weights when built."""
    made = []
    build = CoTrained.build

    def spy(self, ctx):
        fresh = self.model is None
        build(self, ctx)
        if fresh:
            made.append((self, _weights(self.model)))

    monkeypatch.setattr(CoTrained, "build", spy)
    return made


@pytest.mark.long
def test_cooper_trains_two_steps_and_resumes(tiny_cfg, spy_models, tmp_path):
    # the test reward (vowel share) counts as correct from 0.4: groups of 4 hold correct and wrong rollouts
    overrides = [*VARYING, "algorithm=cooper", "algorithm.group_stages.0.correct_min=0.4", "trainer.checkpoint_every=1"]
    result = run(tiny_cfg(*overrides))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert m["cooper/rm_updates"] >= 1 and m["cooper/rm_pairs"] >= 1 and m["cooper/rm_loss"] > 0
    assert 0.0 <= m["cooper/rm_pair_acc"] <= 1.0 and "reward/cooper_rm/mean" in m
    stage, initial = spy_models[0]
    moved = [k for k, v in stage.model.state_dict().items() if not torch.equal(v, initial[k])]
    assert moved, "the reward model did not change"
    # the checkpoint holds the reward model's weights and optimiser state
    blob = torch.load(next((tmp_path / "run" / "checkpoints").glob("*/state.pt")), weights_only=False)
    saved = blob["group_stages"][0]
    assert {"model", "optimizer", "updates"} <= set(saved) and saved["updates"] == m["cooper/rm_updates"]
    # resumed to step 3, the run continues the reward model: built, it holds the checkpoint's weights and count
    again = run(tiny_cfg(*overrides, "trainer.max_steps=3", "trainer.resume=true"))
    assert again.last_step == 3 and again.metrics["cooper/rm_updates"] >= saved["updates"]
    resumed, at_build = spy_models[1]
    assert all(torch.equal(at_build[k], v.to(at_build[k].device)) for k, v in saved["model"].items())
    assert resumed.updates == again.metrics["cooper/rm_updates"]


@pytest.mark.long
def test_rl_tango_trains_two_steps(tiny_cfg, spy_models, monkeypatch):
    """The tiny model writes no verdicts: a stand-in parse reads them from the verifications' lengths (the run's
    plumbing is what is tested: step rewards paid to the policy, the verifier trained by GRPO)."""
    monkeypatch.setattr(cotrained, "parse_verification", lambda t: (float(len(t) % 2), [float(len(t) % 3 > 0)]))
    monkeypatch.setattr(TangoVerifier, "spans", lambda self, c: [(0, len(c))] if c.strip() else [])
    result = run(tiny_cfg(*VARYING, "algorithm=rl_tango", "algorithm.group_stages.0.correct_min=0.4"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert m["tango/verifier_updates"] == 2 and m["tango/verifications"] > 0
    assert 0.0 <= m["tango/verifier_accuracy"] <= 1.0 and "tango/verdict_parse_failures" in m
    assert m["tango/rows_with_step_rewards"] > 0 and 0 < m["tango/alpha"] < 0.5  # step 2: α decayed
    assert math.isfinite(m["tango/verifier_loss"]) and "reward/tango_process/mean" in m
    stage, initial = spy_models[0]
    moved = [k for k, v in stage.model.state_dict().items() if not torch.equal(v, initial[k])]
    assert moved, "the verifier did not change"
