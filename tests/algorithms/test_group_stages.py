"""Group stages: DAPO dynamic sampling (drop zero-variance groups, refill), overlong masking, soft
overlong punishment, and ReMax's greedy baseline."""

from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.aggregation import Normaliser
from rlexp.algorithms.group_stages.baselines import greedy_baseline
from rlexp.algorithms.group_stages.filters import dynamic_sampling, overlong_mask
from rlexp.algorithms.group_stages.overlong import overlong_penalty, soft_overlong_punishment
from rlexp.core.masks import loss_mask
from rlexp.rewards.terms import RewardTerm
from rlexp.rollout.hf import RolloutOutput
from tests.algorithms.batches import make_batch


class Refills:
    """ctx.sample stand-in: hands out prepared batches and records how many prompts were asked."""

    def __init__(self, *batches):
        self.batches, self.asked = list(batches), []

    def __call__(self, n):
        self.asked.append(n)
        b = self.batches.pop(0)
        b.stats["time/reward_s"] = 0.25
        return b


def ctx_with(sample=None, **settings):
    return SimpleNamespace(settings=SimpleNamespace(**settings), sample=sample)


def test_dynamic_sampling_drops_degenerate_groups_and_refills():
    batch = make_batch([1, 0, 1, 1], [0, 0, 1, 1])  # group 1 has zero variance
    refill = Refills(make_batch([0, 0, 1, 0], [2, 2, 3, 3]))  # group 2 degenerate, group 3 kept
    out = dynamic_sampling(batch, ctx_with(refill, prompts_per_step=2), max_rounds=3)
    assert out.group_ids.tolist() == [0, 0, 3, 3]
    assert out.reward.tolist() == [1, 0, 1, 0]
    assert refill.asked == [1]
    assert out.stats["dynamic_sampling/rounds"] == 1 and out.stats["dynamic_sampling/kept_groups"] == 2
    assert out.stats["dynamic_sampling/sampled_groups"] == 4 and out.stats["dynamic_sampling/dropped_groups"] == 2
    assert out.stats["time/reward_s"] == 0.25


def test_dynamic_sampling_trims_surplus_groups_and_respects_max_rounds():
    batch = make_batch([1, 1, 0, 0], [0, 0, 1, 1])
    refill = Refills(make_batch([1, 0, 0, 1, 1, 0], [2, 2, 3, 3, 4, 4]), make_batch([1, 0], [5, 5]))
    out = dynamic_sampling(batch, ctx_with(refill, prompts_per_step=2), max_rounds=1, oversample=1.5)
    assert out.group_ids.tolist() == [2, 2, 3, 3]  # third kept group is surplus
    assert refill.asked == [3]  # ⌈2 · 1.5⌉
    short = dynamic_sampling(
        make_batch([1, 1, 1, 0], [0, 0, 1, 1]), ctx_with(Refills(), prompts_per_step=2), max_rounds=0
    )
    assert short.group_ids.tolist() == [1, 1] and short.stats["dynamic_sampling/rounds"] == 0


def test_dynamic_sampling_keeps_the_batch_when_nothing_varies():
    batch = make_batch([1, 1, 0, 0], [0, 0, 1, 1])
    out = dynamic_sampling(batch, ctx_with(Refills(make_batch([0, 0], [2, 2])), prompts_per_step=2), max_rounds=1)
    assert out.group_ids.tolist() == [0, 0, 1, 1] and out.stats["dynamic_sampling/kept_groups"] == 0


def test_dynamic_sampling_filters_on_a_named_term():
    terms = [[1, 0], [1, 1], [0, 1], [1, 1]]  # term t0 varies only in group 1, term t1 only in group 0
    batch = make_batch(None, [0, 0, 1, 1], terms=terms)
    out = dynamic_sampling(batch, ctx_with(Refills(), prompts_per_step=1), metric="t0", max_rounds=0)
    assert out.group_ids.tolist() == [1, 1]
    with pytest.raises(KeyError, match="accuracy"):
        dynamic_sampling(batch, ctx_with(Refills(), prompts_per_step=1), metric="accuracy")


# ---- GPG's resampling: dynamic sampling with min_varied_frac, keep_degenerate, refill=batch -------------------

GPG_STAGE = dict(min_varied_frac=0.5, keep_degenerate=True, refill="batch", max_rounds=18)


def test_gpg_resampling_bounds_alpha_by_hand():
    """AMAP-ML/GPG gpg_trainer.py: whole new batches until the informative groups seen reach 0.5 × the batch's
    groups, then those groups (first) and the last batch's degenerate groups fill the batch; α = 1 / share."""
    from rlexp.algorithms.advantages.group import gpg

    batch = make_batch([1, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3])  # 1 of 4 groups informative: α = 4
    torch.testing.assert_close(gpg(batch, min_valid_frac=0.05)[:2], torch.tensor([2.0, -2.0]))  # ±0.5 · 4
    torch.testing.assert_close(gpg(batch)[:2], torch.tensor([1.0, -1.0]))  # without resampling: α capped at 2
    round1 = make_batch([1, 1, 0, 0, 1, 1, 0, 0], [4, 4, 5, 5, 6, 6, 7, 7])  # nothing informative: 1 < 2
    round2 = make_batch([0, 0, 1, 0, 0, 1, 1, 1], [8, 8, 9, 9, 10, 10, 11, 11])  # groups 9, 10: 3 >= 2, stop
    refill = Refills(round1, round2)
    out = dynamic_sampling(batch, ctx_with(refill, prompts_per_step=4), **GPG_STAGE)
    assert refill.asked == [4, 4]  # a whole batch per round
    assert out.group_ids.tolist() == [0, 0, 9, 9, 10, 10, 8, 8]  # informative first, then round 2's degenerate
    assert out.stats["dynamic_sampling/varied_frac"] == 0.75 and out.stats["dynamic_sampling/rounds"] == 2
    # α = 4 groups / 3 informative: group 0's centred rewards ±0.5 become ±2/3 (the release: loss / (3/4))
    adv = gpg(out)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, 2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0]))


def test_gpg_resampling_stops_at_half_informative_so_alpha_is_at_most_two():
    from rlexp.algorithms.advantages.group import gpg

    batch = make_batch([1, 1, 0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 2, 2, 3, 3])  # nothing informative
    round1 = make_batch([1, 0, 0, 0, 0, 1, 1, 1], [4, 4, 5, 5, 6, 6, 7, 7])  # groups 4, 6: exactly 0.5 × 4
    out = dynamic_sampling(batch, ctx_with(Refills(round1), prompts_per_step=4), **GPG_STAGE)
    assert out.group_ids.tolist() == [4, 4, 6, 6, 5, 5, 7, 7] and out.stats["dynamic_sampling/varied_frac"] == 0.5
    torch.testing.assert_close(gpg(out)[:2], torch.tensor([1.0, -1.0]))  # α = 2: ±0.5 · 2
    # more informative groups than the batch holds: the surplus is dropped and α = 1
    many = make_batch([1, 0] * 4, [8, 8, 9, 9, 10, 10, 11, 11])
    out = dynamic_sampling(make_batch([1, 0, 1, 1], [0, 0, 1, 1]), ctx_with(Refills(many), prompts_per_step=2),
                           **GPG_STAGE)  # fmt: skip
    assert out.group_ids.tolist() == [0, 0, 1, 1]  # 1 of 2 informative is enough: no refill
    out = dynamic_sampling(make_batch([1, 1, 1, 1], [0, 0, 1, 1]), ctx_with(Refills(many), prompts_per_step=2),
                           **GPG_STAGE)  # fmt: skip
    assert out.group_ids.tolist() == [8, 8, 9, 9] and out.stats["dynamic_sampling/varied_frac"] == 1.0


def test_gpg_resampling_rounds_running_out_keeps_a_full_batch_and_the_cap_bounds_alpha():
    from rlexp.algorithms.advantages.group import gpg

    batch = make_batch([1, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3])
    out = dynamic_sampling(batch, ctx_with(Refills(), prompts_per_step=4), **{**GPG_STAGE, "max_rounds": 0})
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and out.stats["dynamic_sampling/varied_frac"] == 0.25
    torch.testing.assert_close(gpg(out)[:2], torch.tensor([1.0, -1.0]))  # α would be 4; capped at 2 (our choice)
    with pytest.raises(ValueError, match="min_varied_frac"):
        dynamic_sampling(batch, ctx_with(Refills(), prompts_per_step=4), min_varied_frac=0.0)
    with pytest.raises(ValueError, match="refill"):
        dynamic_sampling(batch, ctx_with(Refills(), prompts_per_step=4), refill="all")


def test_gpg_config_resamples_as_the_release():
    from pathlib import Path

    from omegaconf import OmegaConf

    from rlexp.config.paths import CONF_DIR

    cfg = OmegaConf.load(Path(CONF_DIR) / "algorithm" / "gpg.yaml")
    (stage,) = cfg.group_stages
    assert stage._target_.endswith("filters.dynamic_sampling")
    assert (stage.min_varied_frac, stage.keep_degenerate, stage.refill, stage.max_rounds, stage.metric) == (
        0.5, True, "batch", 18, None,
    )  # fmt: skip
    assert cfg.advantage.min_valid_frac == 0.5 and cfg.advantage.scale == "none"


def test_overlong_mask_removes_truncated_rows_from_the_loss_only():
    batch = make_batch([1, 0, 1], [0, 0, 0], lengths=[2, 3, 1], truncated=[False, True, False])
    out = overlong_mask(batch)
    assert loss_mask(out).tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert out.completion_mask.sum() == 6 and out.lengths.tolist() == [2, 3, 1]  # completions untouched
    assert out.stats["overlong/masked_frac"] == pytest.approx(1 / 3)
    norm = Normaliser.from_mask(loss_mask(out))
    assert norm.total_tokens == 3 and norm.total_rows == 2


def test_soft_overlong_punishment_by_hand():
    lengths = torch.tensor([5, 6, 9, 10, 12])
    # L_max 10, L_cache 4: free up to 6, then (6 − |y|)/4, −1 beyond L_max
    assert soft_overlong_punishment(lengths, 10, 4).tolist() == [0.0, 0.0, -0.75, -1.0, -1.0]


def test_overlong_penalty_is_added_as_a_reward_term():
    batch = make_batch([1.0, 0.5], [0, 0], lengths=[2, 9], width=10)
    out = overlong_penalty(batch, ctx_with(max_new_tokens=10), cache_fraction=0.4, weight=0.5)
    assert out.reward_names == ["r", "overlong"]
    assert out.rewards[:, 1].tolist() == [0.0, -0.75]
    assert out.reward.tolist() == [1.0, 0.5 - 0.375]
    assert out.reward_weights.tolist() == [1.0, 0.5] and out.reward_failures.shape == (2, 2)
    torch.testing.assert_close(out.rewards @ out.reward_weights, out.reward)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(make_batch([1.0], [0]), ctx_with(max_new_tokens=10), cache_length=11)


class FirstLetterIsA(RewardTerm):
    def score(self, sample):
        return float(sample.completion.startswith("a"))


class GreedyRollout:
    def __init__(self, texts):
        self.texts, self.calls = texts, []

    def generate(self, model, tokenizer, prompts, num_generations=1, greedy=False, max_new_tokens=None):
        self.calls.append((list(prompts), num_generations, greedy))
        n = len(prompts)
        mask = torch.ones(n, 2, dtype=torch.long)
        return RolloutOutput(
            torch.ones(n, 3, dtype=torch.long),
            torch.ones(n, 3, dtype=torch.long),
            torch.ones(n, 2, dtype=torch.long),
            mask,
            torch.zeros(n, 2),
            torch.zeros(n, dtype=torch.bool),
            self.texts[:n],
        )


def test_greedy_baseline_scores_one_greedy_completion_per_prompt():
    batch = make_batch([1, 0, 0, 1, 1], [0, 0, 0, 1, 1])
    rollout = GreedyRollout(["ab", "ba"])
    ctx = SimpleNamespace(
        policy=torch.nn.Linear(1, 1),
        tokenizer=None,
        rollout=rollout,
        reward_terms={"a": FirstLetterIsA()},
        settings=None,
        sample=None,
        autocast_dtype=None,
    )
    out = greedy_baseline(batch, ctx)
    assert rollout.calls == [(["p0", "p1"], 1, True)]
    assert out.extras["greedy_reward"].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert out.stats["remax/greedy_reward_mean"] == 0.5


def test_greedy_baseline_without_rollout_in_context_names_what_is_missing():
    with pytest.raises(RuntimeError, match="reward_terms"):
        greedy_baseline(
            make_batch([0, 1], [7, 7]),
            SimpleNamespace(policy=None, sample=None, rollout=None, reward_terms=None, autocast_dtype=None),
        )


def test_dapo_overlong_weight_matches_dapo_plus_minus_one_scoring():
    """DAPO scores correctness ±1 and adds the soft overlong penalty; we score 0/1 and add the penalty at
    weight 0.5 (dapo.yaml). 2·(acc + 0.5·pen) − 1 = (±1) + pen, an affine map, so the group-normalised
    advantages are the same."""
    from omegaconf import OmegaConf

    from rlexp.algorithms.advantages.group import grpo, normalize_rewards
    from rlexp.algorithms.group_stages.overlong import overlong_penalty, soft_overlong_punishment
    from rlexp.config.paths import CONF_DIR

    cfg = OmegaConf.load(f"{CONF_DIR}/algorithm/dapo.yaml")
    weight = [s for s in cfg.group_stages if s._target_.endswith("overlong_penalty")][0].weight
    assert weight == 0.5
    acc = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    lengths = [10, 20, 19, 5, 18, 20]
    b = make_batch(acc, [0, 0, 0, 1, 1, 1], lengths=lengths, width=20)
    b = overlong_penalty(b, None, max_length=20, cache_fraction=0.25, weight=weight)
    pen = soft_overlong_punishment(torch.tensor(lengths), 20, 5)
    dapo_reward = (2 * torch.tensor(acc) - 1) + pen
    torch.testing.assert_close(grpo(b), normalize_rewards(dapo_reward, b.group_ids), rtol=1e-5, atol=1e-6)


def test_remax_one_sample_and_one_greedy_completion_per_prompt_by_hand():
    """ReMax (Algorithm 1): per prompt one sampled completion y and one greedy ȳ, A = r(y) − r(ȳ)."""
    from rlexp.algorithms.advantages.baselines import remax

    batch = make_batch([1, 0, 1], [0, 1, 2])  # three prompts, one sample each: r(y) = 1, 0, 1
    rollout = GreedyRollout(["ab", "ab", "ba"])  # r(ȳ) = 1, 1, 0
    terms = {"a": FirstLetterIsA()}
    ctx = SimpleNamespace(policy=torch.nn.Linear(1, 1), tokenizer=None, rollout=rollout, reward_terms=terms,
                          settings=None, sample=None, autocast_dtype=None)  # fmt: skip
    out = greedy_baseline(batch, ctx)
    assert rollout.calls == [(["p0", "p1", "p2"], 1, True)]
    assert remax(out).tolist() == [0.0, -1.0, 1.0]


def test_remax_config_samples_one_completion_per_prompt(tiny_cfg, tmp_path):
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING
    from tests.conftest import TINY, compose_train

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=4"]
    m = run(tiny_cfg(*VARYING, *fast, "algorithm=remax")).metrics
    assert m["batch/completions"] == 2.0  # trainer.prompts_per_step = 2 prompts × 1 sample (not × 4)
    assert m["advantage/mean"] == pytest.approx(m["reward/mean"] - m["remax/greedy_reward_mean"], abs=1e-6)
    # a second run in a directory of its own (trainer.resume=false where a run is would be refused)
    shared = run(
        compose_train([*TINY, *VARYING, *fast, "algorithm=remax", "algorithm.num_generations=null"], tmp_path / "g4")
    )
    shared = shared.metrics
    assert shared["batch/completions"] == 8.0  # the previous default: G = 4 samples share one greedy baseline


def test_lagrangian_multiplier_update_and_reward_column():
    """Constrained RLHF (arXiv 2310.04373): μ ← max(0, μ + η·violation); the step's reward uses the μ before it."""
    from rlexp.algorithms.group_stages.lagrangian import LagrangianWeights
    from tests.algorithms.batches import make_batch as make

    stage = LagrangianWeights([{"term": "t1", "threshold": 0.5, "direction": "max", "init": 1.0}], lr=0.5)
    b = make(None, [0, 0], terms=[[1.0, 1.0], [0.0, 0.6]])  # t1 mean 0.8: over its 0.5 ceiling by 0.3
    stage(b)
    assert b.reward_names[-1] == "lagrange/t1"
    assert b.term("lagrange/t1").tolist() == pytest.approx([-1.0, -0.6])
    assert b.reward.tolist() == pytest.approx([2.0 - 1.0, 0.6 - 0.6])  # μ = 1 in use
    assert stage.multipliers["t1"] == pytest.approx(1.0 + 0.5 * 0.3)
    assert b.stats["lagrange/t1/violation"] == pytest.approx(0.3)
    # a min constraint that holds: its multiplier shrinks, and is never negative
    low = LagrangianWeights([{"term": "t0", "threshold": 0.2, "direction": "min", "init": 0.1}], lr=1.0)
    b = make(None, [0, 0], terms=[[1.0, 0.0], [1.0, 0.0]])  # t0 mean 1.0 >= 0.2: slack 0.8
    low(b)
    assert b.reward.tolist() == pytest.approx([1.1, 1.1]) and low.multipliers["t0"] == 0.0
    # at the threshold exactly: no move
    edge = LagrangianWeights([{"term": "t0", "threshold": 1.0, "direction": "min", "init": 0.3}], lr=1.0)
    edge(make(None, [0, 0], terms=[[1.0, 0.0], [1.0, 0.0]]))
    assert edge.multipliers["t0"] == pytest.approx(0.3)
    again = LagrangianWeights([{"term": "t1", "threshold": 0.5}])
    again.load_state_dict(stage.state_dict())
    assert again.multipliers == stage.multipliers
    with pytest.raises(ValueError, match="direction"):
        LagrangianWeights([{"term": "t1", "threshold": 0.5, "direction": "up"}])
    with pytest.raises(KeyError, match="not a reward term"):
        LagrangianWeights([{"term": "nope", "threshold": 0.5}])(make([1.0, 0.0], [0, 0]))


def test_verifier_noise_backward_correction_and_injection():
    """arXiv 2510.00915: R̂ = (R̃ − ρ0)/(1 − ρ0 − ρ1), unbiased for the clean reward; injection flips at the rates."""
    from types import SimpleNamespace

    from rlexp.algorithms.group_stages.verifier_noise import VerifierNoise
    from tests.algorithms.batches import make_batch as make

    b = make(None, [0, 0, 0], terms=[[1.0, 0.5], [0.0, 0.5], [1.0, 0.0]], weights=[2.0, 1.0])
    VerifierNoise(term="t0", rho0=0.1, rho1=0.2)(b)
    hi, lo = (1 - 0.1) / 0.7, (0 - 0.1) / 0.7
    assert b.term("t0").tolist() == pytest.approx([hi, lo, hi])
    assert b.reward.tolist() == pytest.approx([2 * hi + 0.5, 2 * lo + 0.5, 2 * hi])
    # unbiased: over the flips of a true 1 (kept with 1 − ρ1) and of a true 0 (flipped up with ρ0)
    assert (1 - 0.2) * hi + 0.2 * lo == pytest.approx(1.0) and 0.1 * hi + 0.9 * lo == pytest.approx(0.0)
    ctx = SimpleNamespace(step=3, settings=SimpleNamespace(seed=0))
    big = make([1.0] * 2000 + [0.0] * 2000, [0] * 4000)
    big.reward_names = ["accuracy"]
    VerifierNoise(rho0=0.1, rho1=0.3, inject=True, correction="none")(big, ctx)
    acc = big.term("accuracy")
    assert float((acc[:2000] == 0).float().mean()) == pytest.approx(0.3, abs=0.04)  # false negatives
    assert float((acc[2000:] == 1).float().mean()) == pytest.approx(0.1, abs=0.03)  # false positives
    with pytest.raises(ValueError, match="rates"):
        VerifierNoise(rho0=0.5)


def test_noisy_verifier_experiment_runs_two_steps(tiny_cfg):
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    result = run(tiny_cfg(*VARYING, "+experiment=noisy_verifier", "trainer.max_new_tokens=6", "trainer.autocast=off"))
    assert result.last_step == 2 and "verifier_noise/flipped_frac" in result.metrics


def test_demonstration_reference_is_loaded_from_its_own_model(tiny_cfg, tmp_path):
    """+experiment=demo_regularized: the KL anchor is another model (here the tiny model with another seed), so the
    KL is already > 0 at the first step, where a copy of the initial policy gives 0."""
    from omegaconf import OmegaConf, open_dict

    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    fast = ["trainer.max_new_tokens=6", "trainer.autocast=off", "trainer.max_steps=1"]
    cfg = tiny_cfg(*VARYING, *fast, "+experiment=demo_regularized")
    assert cfg.algorithm.reference.model.seed == 0  # by default the run's own model: GRPO's frozen reference
    same = run(cfg)
    assert same.metrics["kl/mean"] == pytest.approx(0.0, abs=1e-6)
    cfg = tiny_cfg(*VARYING, *fast, "+experiment=demo_regularized")
    with open_dict(cfg):
        cfg.algorithm.reference.model = OmegaConf.merge(cfg.model, {"seed": 1})  # another model
        cfg.trainer.run_dir = str(tmp_path / "other")
    other = run(cfg)
    assert other.metrics["kl/mean"] > 1e-3
