"""Monte-Carlo segment values (VinePPO, SPO-chain): the boundaries (step starts, low-probability cutpoints), the
segment advantages on worked examples, the stage's values from K scored continuations, the continuations' prefixes on
the tiny model, and two training steps of each method."""

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.algorithms.advantages.segment_values import segment_advantages, segment_values
from rlexp.algorithms.group_stages.monte_carlo import (
    MC_BOUNDARIES,
    MC_OUTCOME,
    MC_VALUES,
    MonteCarloValues,
    cutpoint_boundaries,
    sample_continuations,
    step_boundaries,
)
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import KL_PENALTY, TOKEN_LOSS_MASK
from rlexp.rewards.scoring import score
from rlexp.rewards.terms import RewardTerm
from rlexp.rollout.hf import HFRollout, RolloutOutput
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING, VowelShare
from tests.conftest import chat_prompts

# ---------------------------------------------------------------- boundaries


def test_cutpoints_are_every_interval_th_low_probability_token():
    p = [0.95, 0.5, 0.99, 0.3, 0.8, 0.2, 0.95, 0.1]  # p < 0.9 at tokens 1, 3, 4, 5, 7
    lp = [math.log(x) for x in p]
    assert cutpoint_boundaries(lp, 0.9, 1) == [1, 3, 4, 5, 7]
    assert cutpoint_boundaries(lp, 0.9, 2) == [1, 4, 7]  # the released cutpoints[::2], from the first
    assert cutpoint_boundaries(lp, 0.9, 5) == [1]
    assert cutpoint_boundaries(lp, 0.25, 1) == [5, 7]
    assert cutpoint_boundaries([0.0, 0.0], 0.9, 1) == []  # every token sampled with p = 1: no segment


def test_step_boundaries_start_each_step_after_the_previous_steps_last_token(tiny):
    tok = tiny.tokenizer
    text = "Add 2 and 3.\nThat gives 5.\n#### 5"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    # three lines; the "#### 5" line joins the step before it (the release's answer merge): steps 0 and 1
    b = step_boundaries(tok, ids, text)
    assert len(b) == 2 and b[0] == 0
    assert tok.decode(ids[: b[1]]) == "Add 2 and 3."  # the line break opens the next step
    assert tok.decode(ids[b[1] :], skip_special_tokens=True) == "\nThat gives 5.\n#### 5"
    three = step_boundaries(tok, ids, text, answer_marker=None)
    assert len(three) == 3 and tok.decode(ids[three[1] : three[2]]) == "\nThat gives 5."
    assert step_boundaries(tok, [tok.eos_token_id], "") == [0]  # no text: the prompt's state only
    assert step_boundaries(tok, [], "") == []


# ---------------------------------------------------------------- advantages


def test_segment_advantages_worked_example():
    # VinePPO: states at 0 (prompt), 3, 5 of a 7-token completion; V̂ = 0.5, 0.75, 0.25; outcome 1
    # steps: tokens 0–2: 0.75 − 0.5 = 0.25; tokens 3–4: 0.25 − 0.75 = −0.5; tokens 5–6: 1 − 0.25 = 0.75
    adv, seg = segment_advantages([0, 3, 5], [0.5, 0.75, 0.25], 1.0, 7)
    assert adv == pytest.approx([0.25] * 3 + [-0.5] * 2 + [0.75] * 2) and seg == pytest.approx([0.25, -0.5, 0.75])
    # SPO-chain: first cutpoint at 2 → tokens 0–1 get 0; tokens 2–3: 0.6 − 0.4 = 0.2; tokens 4–5: 0 − 0.6 = −0.6
    adv, _ = segment_advantages([2, 4], [0.4, 0.6], 0.0, 6)
    assert adv == pytest.approx([0.0, 0.0, 0.2, 0.2, -0.6, -0.6])
    assert segment_advantages([], [], 1.0, 3)[0] == [0.0, 0.0, 0.0]  # no boundary: no signal


def _valued_batch():
    batch = make_batch([1.0, 0.0], [0, 0], lengths=[4, 3], width=4)
    batch.extras[MC_BOUNDARIES] = torch.tensor([[0, 2], [0, -1]])
    batch.extras[MC_VALUES] = torch.tensor([[0.5, 0.25], [0.5, float("nan")]])
    batch.extras[MC_OUTCOME] = torch.tensor([1.0, 0.0])
    return batch


def test_segment_values_on_a_batch():
    # row 0: tokens 0–1: 0.25 − 0.5 = −0.25, tokens 2–3: 1 − 0.25 = 0.75; row 1 (3 tokens): 0 − 0.5 = −0.5, padding 0
    adv = segment_values(_valued_batch(), whiten=False)
    assert torch.allclose(adv, torch.tensor([[-0.25, -0.25, 0.75, 0.75], [-0.5, -0.5, -0.5, 0.0]]))
    batch = _valued_batch()
    w = segment_values(batch)
    m = batch.completion_mask.bool()
    assert abs(float(w[m].mean())) < 1e-6 and float(w[m].std()) == pytest.approx(1.0, abs=1e-4)  # Bessel, as gae's
    assert batch.stats["advantage/segment_abs_mean"] == pytest.approx((0.25 + 0.75 + 0.5) / 3)


def test_segment_values_whiten_over_the_probability_mask_and_zero_outside():
    batch = _valued_batch()
    batch.extras[TOKEN_LOSS_MASK] = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv = segment_values(batch)
    # the loss tokens hold −0.25, 0.75, −0.5: mean 0, whitened over those three only
    kept = torch.tensor([[True, False, True, False], [True, False, False, False]])
    raw = torch.tensor([-0.25, 0.75, -0.5])
    expected = (raw - raw.mean()) / raw.std()
    assert torch.allclose(adv[kept], expected, atol=1e-4) and torch.all(adv[~kept] == 0)


def test_segment_values_refuse_missing_values_and_a_kl_in_the_reward():
    with pytest.raises(ValueError, match="MonteCarloValues"):
        segment_values(make_batch([1.0, 0.0], [0, 0]))
    batch = _valued_batch()
    batch.extras[KL_PENALTY] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="kl.mode=loss"):
        segment_values(batch)


# ---------------------------------------------------------------- the stage (a scripted rollout)


class _Tok:
    pad_token_id = 0
    eos_token_id = 2

    def batch_decode(self, rows, **_):
        return ["x" * len(r) for r in rows]  # one character per token


class _Rollout:
    """Continues each context with 1 token (its first copy) or 2 tokens (its second), never truncated; records the
    contexts and budgets it is given."""

    def __init__(self, max_new_tokens=8):
        self.max_new_tokens = max_new_tokens
        self.contexts, self.budgets = [], []

    def generate_from_ids(self, model, tok, ids, mask, max_new_tokens):
        n = ids.shape[0]
        self.contexts += [ids[r][mask[r].bool()].tolist() for r in range(n)]
        self.budgets.append(max_new_tokens)
        lengths = torch.tensor([1 + r % 2 for r in range(n)])
        cmask = (torch.arange(2)[None, :] < lengths[:, None]).long()
        return RolloutOutput(
            ids, mask, torch.full((n, 2), 20) * cmask, cmask, torch.zeros(n, 2), torch.zeros(n, dtype=torch.bool), []
        )


class _Length(RewardTerm):  # a completion of n tokens ("x" × n) scores n / 10
    def score(self, sample) -> float:
        return len(sample.completion) / 10


def _stage_batch():
    # one group of two 4-token rows after the prompt (1, 1, 1); sampling probabilities:
    # row 0: p = (0.5, 0.95, 0.5, 0.95) → cutpoints 0, 2; row 1: p = (0.5, 0.5, 0.95, 0.95) → cutpoints 0, 1
    batch = make_batch([1.0, 0.0], [0, 0], lengths=[4, 4])
    batch.completion_ids = torch.tensor([[10, 11, 12, 13], [10, 14, 15, 16]])
    p = torch.tensor([[0.5, 0.95, 0.5, 0.95], [0.5, 0.5, 0.95, 0.95]])
    batch.sampling_logprobs = p.log()
    return batch


def _ctx(limit=8):
    return SimpleNamespace(
        rollout=_Rollout(limit),
        reward_terms={"r": _Length()},
        tokenizer=_Tok(),
        policy=torch.nn.Linear(1, 1),
        autocast_dtype=None,
    )


def test_stage_values_on_a_worked_example():
    stage = MonteCarloValues(boundaries="cutpoints", num_rollouts=2, interval=1, prob_mask=True)
    ctx = _ctx()
    out = stage(_stage_batch(), ctx)
    # states: the prompt (shared by both rows: sampled once), row 1's [10], row 0's [10, 11] (shorter prefixes first);
    # each continued twice, with 1 and 2 tokens: V̂ = mean of (b + 1, b + 2) / 10 = 0.15, 0.25, 0.35
    assert ctx.rollout.contexts == [[1, 1, 1]] * 2 + [[1, 1, 1, 10]] * 2 + [[1, 1, 1, 10, 11]] * 2
    assert ctx.rollout.budgets == [8]  # the limit minus the shortest prefix
    assert out.extras[MC_BOUNDARIES].tolist() == [[0, 2], [0, 1]]
    assert torch.allclose(out.extras[MC_VALUES], torch.tensor([[0.15, 0.35], [0.15, 0.25]]))
    assert out.extras[MC_OUTCOME].tolist() == [1.0, 0.0]
    # the probability mask: only the tokens sampled with p < 0.9 train
    assert out.extras[TOKEN_LOSS_MASK].tolist() == [[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    s = out.stats
    assert s["spo/states"] == 3.0 and s["spo/mc_rollouts"] == 6.0 and s["spo/segments_mean"] == 2.0
    assert s["spo/value_mean"] == pytest.approx(0.25) and s["spo/value_std_mean"] == pytest.approx(0.05)
    assert s["spo/low_prob_frac"] == 0.5 and s["spo/mc_truncated_frac"] == 0.0
    # row 0: tokens 0–1: 0.35 − 0.15 = 0.2, tokens 2–3: 1 − 0.35 = 0.65; row 1: token 0: 0.1, tokens 1–3: −0.25
    adv = segment_values(out, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.2, 0.0, 0.65, 0.0], [0.1, -0.25, 0.0, 0.0]]))


def test_stage_cuts_continuations_at_the_completion_limit():
    # limit 3: the state [10, 11] has room for 1 token, so its 2-token continuation is cut and truncated
    for truncated_reward, value in ((0.0, 0.15), (None, 0.3)):  # (0.3 + 0) / 2; the cut one scored as is: 0.3
        stage = MonteCarloValues(boundaries="cutpoints", num_rollouts=2, interval=1, truncated_reward=truncated_reward)
        out = stage(_stage_batch(), _ctx(limit=3))
        assert out.extras[MC_VALUES][0, 1].item() == pytest.approx(value)
        assert out.stats["spo/mc_truncated_frac"] == pytest.approx(1 / 6)
        assert TOKEN_LOSS_MASK not in out.extras  # no probability mask unless asked


def test_stage_max_steps_and_truncated_outcome():
    # max_steps=0: only each row's first state (the shared prompt) is sampled; later boundaries take the outcome
    batch = _stage_batch()
    batch.truncated = torch.tensor([True, False])  # row 0's own outcome: the unfinished penalty 0
    out = MonteCarloValues(boundaries="cutpoints", num_rollouts=2, interval=1, max_steps=0)(batch, _ctx())
    assert out.stats["spo/states"] == 1.0 and out.stats["spo/unestimated"] == 2.0
    assert torch.allclose(out.extras[MC_VALUES], torch.tensor([[0.15, 0.0], [0.15, 0.0]]))
    assert out.extras[MC_OUTCOME].tolist() == [0.0, 0.0]


def test_stage_settings_are_checked():
    with pytest.raises(ValueError, match="boundaries"):
        MonteCarloValues(boundaries="tree")
    with pytest.raises(ValueError, match="num_rollouts"):
        MonteCarloValues(num_rollouts=0)
    with pytest.raises(ValueError, match="prob_mask"):
        MonteCarloValues(boundaries="steps", prob_mask=True)
    with pytest.raises(ValueError, match="split"):
        MonteCarloValues(split="words")
    ctx = _ctx()
    ctx.rollout = SimpleNamespace(max_new_tokens=8)  # no generate_from_ids
    with pytest.raises(RuntimeError, match="rollout=hf"):
        MonteCarloValues(boundaries="cutpoints")(_stage_batch(), ctx)


# ---------------------------------------------------------------- the tiny model


@pytest.fixture(scope="module")
def tiny_rollout(tiny):
    torch.manual_seed(0)
    ro = HFRollout(max_new_tokens=8, engine="loop", decode_graph=None)
    prompts = chat_prompts(tiny.tokenizer, 2)
    out = ro.generate(tiny.model, tiny.tokenizer, prompts, num_generations=2)
    batch = RolloutBatch.from_generation(
        out, torch.tensor([0, 0, 1, 1]), [p for p in prompts for _ in range(2)], [{"question": "q"}] * 4
    )
    score(batch, {"vowels": VowelShare()})
    ctx = SimpleNamespace(
        rollout=ro, reward_terms={"vowels": VowelShare()}, tokenizer=tiny.tokenizer, policy=tiny.model
    )
    return batch, ctx


def test_continuations_start_with_the_completions_prefix_on_the_tiny_model(tiny_rollout):
    batch, ctx = tiny_rollout
    jobs = [(0, batch.completion_ids[0, :3].tolist()), (3, batch.completion_ids[3, :5].tolist()), (2, [])]
    cont = sample_continuations(ctx, jobs, batch, 2, 8, 0)
    assert len(cont) == 6
    for k, (row, prefix) in enumerate(j for j in jobs for _ in range(2)):
        ids = cont.completion_ids[k][cont.completion_mask[k].bool()].tolist()
        assert ids[: len(prefix)] == prefix and len(prefix) < len(ids) <= 8  # prefix + its continuation, ≤ the limit
        own = batch.prompt_ids[row][batch.prompt_mask[row].bool()]
        assert torch.equal(cont.prompt_ids[k][cont.prompt_mask[k].bool()], own)
        assert cont.completions[k] == ctx.tokenizer.decode(ids, skip_special_tokens=True)
    assert cont.group_ids.tolist() == [2, 2, 3, 3, 4, 4]  # each state's continuations: a group of their own


def test_stage_on_the_tiny_model(tiny_rollout):
    batch, ctx = tiny_rollout
    out = MonteCarloValues(boundaries="cutpoints", num_rollouts=2, truncated_reward=None, prob_mask=True)(batch, ctx)
    # the random model's sampling probabilities are far below 0.9: every token is a cutpoint, a segment every 5
    assert out.extras[MC_BOUNDARIES][:, :2].tolist() == [[0, 5]] * 4
    assert out.stats["spo/low_prob_frac"] == 1.0 and out.stats["spo/states"] == 2 + 4  # 2 prompts, 4 prefixes
    assert torch.isfinite(out.extras[MC_VALUES][:, :2]).all() and out.stats["spo/value_mean"] > 0
    adv = segment_values(out)
    assert adv.shape == out.completion_mask.shape and torch.isfinite(adv).all()


# ---------------------------------------------------------------- two training steps

# the tiny model never ends a completion within the limit: with the releases' unfinished-response penalty (0) every
# value would be 0, so the truncated completions are scored by the (varying) test reward instead
TINY_MC = [
    *VARYING,
    "trainer.autocast=off",
    "trainer.max_new_tokens=8",
    "algorithm.group_stages.0.truncated_reward=null",
]


@pytest.mark.long
def test_vineppo_trains_two_steps(tiny_cfg):
    result = run(tiny_cfg(*TINY_MC, "algorithm=vineppo", "algorithm.group_stages.0.num_rollouts=2"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    # every row has at least the prompt's state; the 2 prompts' states are sampled once for their 4 rows each
    assert m["vineppo/segments_mean"] >= 1.0 and m["vineppo/mc_rollouts"] >= 2 * 2
    assert m["vineppo/value_mean"] > 0 and m["advantage/abs_mean"] > 0
    # 2 epochs × 2 mini-batches (2 prompts a step): the clipped ratio leaves 1
    assert m["train/optimizer_steps"] == 4.0 and (m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0)
    assert m["kl/mean"] >= 0


@pytest.mark.long
def test_spo_chain_trains_two_steps(tiny_cfg):
    result = run(tiny_cfg(*TINY_MC, "algorithm=spo_chain", "algorithm.group_stages.0.num_rollouts=2"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert m["spo/segments_mean"] >= 2.0  # 8 low-probability tokens: segments at 0 and 5
    assert m["spo/low_prob_frac"] > 0 and m["spo/value_mean"] > 0 and m["advantage/abs_mean"] > 0
    assert m["train/optimizer_steps"] == 4.0 and (m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0)


def test_configs_compose_with_the_stage_last():
    from rlexp.config.paths import CONF_DIR

    for name, boundaries in (("vineppo", "steps"), ("spo_chain", "cutpoints")):
        cfg = OmegaConf.load(f"{CONF_DIR}/algorithm/{name}.yaml")
        stage = cfg.group_stages[-1]
        assert stage._target_.endswith("monte_carlo.MonteCarloValues") and stage.boundaries == boundaries
        assert cfg.num_iterations * cfg.steps_per_rollout > 1  # PPO: several optimiser steps per rollout
        assert cfg.advantage._target_.endswith("segment_values.segment_values")
