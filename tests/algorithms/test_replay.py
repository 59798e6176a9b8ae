"""RePO's replay stage (rlexp/algorithms/group_stages/replay.py): strategies by hand, the replayed rows a step gets,
the split and mixed advantages, the behaviour log-probs the update keeps, checkpoints, and the method on the tiny
model (replay fires, the ratio leaves 1 at one optimiser step per rollout, a resume replays what the uninterrupted
run does)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.group_stages.replay import Replay, max_variance_subset
from rlexp.core.masks import LOSS_MASK, REPLAYED
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING


def _entries(rewards):
    return [{"reward": r, "step": i} for i, r in enumerate(rewards)]


def test_strategies_pick_by_hand():
    e = _entries([0.0, 1.0, 0.5, 1.0, 0.0])
    pick = lambda strategy, k=2: [x["step"] for x in Replay(strategy, k, 1, 5).choose(e, 3, "p")]  # noqa: E731
    assert pick("highest_k") == [1, 3]  # rewards 1.0, 1.0 (ties keep buffer order)
    assert pick("recent_k") == [3, 4]
    assert pick("all") == [0, 1, 2, 3, 4]
    # the 2-subset with the largest variance: (0.0, 1.0) var 0.25; ties to the larger sum (all 1.0) then the first
    assert pick("max_variance_k") == [0, 1]
    assert pick("max_variance_k", 3) == [0, 1, 3]  # (0, 1, 1): var 2/9, sum 2 beats (0, 0, 1): var 2/9, sum 1
    r1, r2 = pick("random_k", 3), pick("random_k", 3)
    assert r1 == r2 and len(set(r1)) == 3, "seeded by run seed, step and prompt"
    assert Replay("highest_k", 2, 6, 6).choose(e, 3, "p") == [], "below min_size: nothing replays"


def test_max_variance_subset_by_hand():
    assert max_variance_subset([1.0, 1.0, 0.0, 0.5], 2) == [0, 2]  # var 0.25 (1, 0): first of (0,2), (1,2)
    assert max_variance_subset([0.2, 0.2, 0.2], 2) == [0, 1]  # all equal: the first subset


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="Replay.strategy"):
        Replay("best")
    with pytest.raises(ValueError, match="Replay.widen"):
        Replay(widen="both")
    with pytest.raises(ValueError, match="min_size=8 > capacity=4"):
        Replay(min_size=8, capacity=4)


def _step_batch(rewards, logp):
    """Two prompts (p0, p1), two completions each, with per-row sampling log-probs ``logp`` on both tokens."""
    b = make_batch(rewards, [0, 0, 1, 1])
    b.sampling_logprobs = torch.tensor(logp, dtype=torch.float32)[:, None].expand(4, 2).clone()
    b.completions = [f"c{i}:{r}" for i, r in enumerate(rewards)]
    return b


def test_replayed_rows_follow_their_group_with_the_stored_fields():
    stage = Replay("highest_k", num_replays=1, min_size=2, capacity=2, widen="split")
    first = stage(_step_batch([1.0, 0.0, 0.0, 0.5], [-1.0, -2.0, -3.0, -4.0]), SimpleNamespace(step=1))
    assert len(first) == 4 and first.stats["replay/rows"] == 0.0, "an empty buffer replays nothing"
    assert REPLAYED not in first.extras, "nothing replayed: no mark"
    assert first.stats["replay/buffer_rows"] == 4.0 and first.stats["replay/buffer_prompts"] == 2.0
    out = stage(_step_batch([0.0, 0.0, 1.0, 1.0], [-5.0, -5.0, -5.0, -5.0]), SimpleNamespace(step=2))
    # p0's fresh pair, p0's best stored row (reward 1.0 of step 1), p1's pair, p1's best (0.5)
    assert out.group_ids.tolist() == [0, 0, 2, 1, 1, 3]
    assert out.extras[REPLAYED].tolist() == [False, False, True, False, False, True]
    assert out.reward.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 0.5]
    assert out.completions[2] == "c0:1.0" and out.completions[5] == "c3:0.5"
    assert out.sampling_logprobs[2].tolist() == [-1.0, -1.0] and out.sampling_logprobs[5].tolist() == [-4.0, -4.0]
    assert out.prompts[2] == "p0" and out.records[5]["question"] == "q1"
    assert out.stats["replay/rows"] == 2.0 and out.stats["replay/age_mean"] == 1.0
    assert out.stats["replay/reward_mean"] == 0.75
    assert out.stats["replay/buffer_rows"] == 4.0, "FIFO of 2 per prompt: step 2's rows pushed out step 1's"
    assert LOSS_MASK not in out.extras, "loss_coef 1: no loss weights"


def test_split_and_mixed_advantages_by_hand():
    def second_step(widen):
        stage = Replay("all", num_replays=1, min_size=2, capacity=2, widen=widen, loss_coef=0.5)
        stage(_step_batch([1.0, 0.0, 1.0, 1.0], [0.0] * 4), SimpleNamespace(step=1))
        return stage(_step_batch([1.0, 1.0, 0.0, 1.0], [0.0] * 4), SimpleNamespace(step=2))

    split, mixed = second_step("split"), second_step("mixed")
    # p0: fresh (1, 1) and replayed (1, 0); p1: fresh (0, 1) and replayed (1, 1)
    assert split.reward.tolist() == mixed.reward.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    s = 1 / (math.sqrt(0.5) + 1e-4)  # (r - mean) / (std + eps) over a pair (1, 0): ±0.5 / 0.7072 (RePO's eps)
    expected = [0, 0, 0.5 * s, -0.5 * s, -0.5 * s, 0.5 * s, 0, 0]
    assert grpo(split, eps=1e-4).tolist() == pytest.approx(expected, abs=1e-6)
    # mixed: one group of four per prompt; p0 (1, 1, 1, 0): mean 0.75, std (Bessel) 0.5
    m = grpo(mixed, eps=1e-4).tolist()
    assert mixed.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert m[:4] == pytest.approx([0.25 / 0.5001, 0.25 / 0.5001, 0.25 / 0.5001, -0.75 / 0.5001])
    assert split.extras[LOSS_MASK].tolist() == [1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.5, 0.5], "loss_coef weights them"


def test_state_dict_round_trip_keeps_the_buffer():
    stage = Replay("recent_k", num_replays=1, min_size=1, capacity=3)
    stage(_step_batch([1.0, 0.0, 0.0, 0.5], [-1.0, -2.0, -3.0, -4.0]), SimpleNamespace(step=1))
    other = Replay("recent_k", num_replays=1, min_size=1, capacity=3)
    other.load_state_dict(stage.state_dict())
    a = stage(_step_batch([0.0] * 4, [0.0] * 4), SimpleNamespace(step=2))
    b = other(_step_batch([0.0] * 4, [0.0] * 4), SimpleNamespace(step=2))
    assert a.completions == b.completions and torch.equal(a.sampling_logprobs, b.sampling_logprobs)


def test_update_keeps_the_behaviour_log_probs_of_replayed_rows_on_policy():
    """One optimiser step per rollout: fresh rows get the ratio 1 (old = current, detached); a replayed row is
    clipped against the log-probs of the policy that sampled it."""
    from rlexp.algorithms.algorithm import Algorithm
    from rlexp.algorithms.losses.clip import ppo_clip
    from rlexp.trainer.optimize import policy_update
    from tests.algorithms.batches import tiny_policy, token_batch

    model = tiny_policy()
    batch = token_batch()
    n = len(batch)
    batch.advantages = torch.ones(n)
    batch.extras[REPLAYED] = torch.tensor([False] * (n - 1) + [True])
    batch.sampling_logprobs = torch.zeros_like(batch.sampling_logprobs)
    batch.sampling_logprobs[-1] = -50.0  # the replayed row's behaviour policy: far away
    algo = Algorithm(name="t", advantage=grpo, loss=ppo_clip, aggregation="token-mean")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    m = policy_update(model, opt, None, batch, algo, mu=1, micro_batch=n, temperature=1.0, max_grad_norm=None)
    assert m["ratio/max"] > 1e6, "the replayed row: π_θ / π_behaviour, far above 1"
    assert m["ratio/min"] == pytest.approx(1.0), "fresh rows: exactly on-policy"
    assert m["clip/high_frac"] > 0
    assert m["mismatch/ratio_max"] <= 1.0, "the mismatch is the fresh rows' (log π ≤ 0 = their sampler's log-prob)"
    batch.extras[REPLAYED] = torch.zeros(n, dtype=torch.bool)
    batch.sampling_logprobs = torch.zeros_like(batch.sampling_logprobs)
    m0 = policy_update(model, opt, None, batch, algo, mu=1, micro_batch=n, temperature=1.0, max_grad_norm=None)
    assert m0["ratio/max"] == m0["ratio/min"] == 1.0


REPLAY_TINY = [
    *VARYING,
    "algorithm=repo",
    "dataset.train_size=2",  # both prompts every step: the buffer fills on step 1 and replays from step 2
    "algorithm.group_stages.0.min_size=4",
    "algorithm.group_stages.0.capacity=4",
    "algorithm.group_stages.0.num_replays=2",
    "trainer.autocast=off",
]


def test_repo_runs_two_steps_and_replays_on_the_second(tiny_cfg):
    m = run(tiny_cfg(*REPLAY_TINY)).metrics
    assert m["replay/rows"] == 4.0 and m["replay/prompts"] == 2.0 and m["replay/age_mean"] == 1.0
    assert m["batch/replayed_completions"] == 4.0
    assert m["batch/completions"] == 8.0, "reward metrics count the step's own 2 x 4 completions"
    assert m["train/optimizer_steps"] == 1.0
    assert m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0, "the replayed rows' ratio is against step 1's policy"
    assert math.isfinite(m["loss/total"])


@pytest.mark.long
def test_repo_resume_replays_what_the_uninterrupted_run_does(tiny_cfg, tmp_path):
    from tests.conftest import TINY, compose_train
    from tests.trainer.test_resume import CrashAt

    overrides = [*TINY, *REPLAY_TINY, "trainer.max_steps=3", "trainer.checkpoint_every=1"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(compose_train(overrides, tmp_path / "run"), callbacks=[CrashAt(2)])
    blob = torch.load(tmp_path / "run" / "checkpoints" / "last" / "state.pt", weights_only=False)
    assert sum(len(v) for v in blob["group_stages"][0]["buffer"].values()) == 8, "step 1's rollouts are kept"
    run(compose_train(overrides, tmp_path / "run"))
    run(compose_train(overrides, tmp_path / "ref"))

    def rows(d):
        out = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k.startswith(("replay/", "reward/", "ratio/"))} for r in out]

    resumed, ref = rows(tmp_path / "run"), rows(tmp_path / "ref")
    assert len(resumed) == 3
    for a, b in zip(resumed, ref):
        assert a.keys() == b.keys()
        # the same completions, rewards and replayed rows; the ratios within float noise (CPU kernels in a process
        # that ran other tests may round the resumed run's matmuls differently in the last bits)
        assert {k: v for k, v in a.items() if not k.startswith("ratio/")} == {
            k: v for k, v in b.items() if not k.startswith("ratio/")
        }
        assert {k: a[k] for k in a if k.startswith("ratio/")} == pytest.approx(
            {k: b[k] for k in b if k.startswith("ratio/")}, rel=1e-4
        )


# ---- ReMix: mix-policy groups, KL-Convex, policy reincarnation ------------------------------------------------


def test_mix_policy_replay_appends_whole_groups_of_the_previous_steps():
    from rlexp.algorithms.group_stages.replay import MixPolicyReplay

    stage = MixPolicyReplay(history=1, replay_frac=0.5, seed=0)
    first = stage(_step_batch([1.0, 0.0, 0.0, 0.5], [-1.0, -2.0, -3.0, -4.0]), SimpleNamespace(step=1))
    assert len(first) == 4 and first.stats["replay/rows"] == 0.0 and first.stats["replay/buffer_groups"] == 2.0
    second = stage(_step_batch([0.0, 1.0, 1.0, 1.0], [-5.0] * 4), SimpleNamespace(step=2))
    # ⌈0.5 × 2⌉ = 1 of step 1's two groups, whole, as a group of its own after the fresh ones
    assert len(second) == 6 and second.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert second.extras[REPLAYED].tolist() == [False] * 4 + [True] * 2
    picked = second.completions[4:]
    assert picked in (["c0:1.0", "c1:0.0"], ["c2:0.0", "c3:0.5"])
    behaviour = {"c0:1.0": -1.0, "c1:0.0": -2.0, "c2:0.0": -3.0, "c3:0.5": -4.0}
    assert second.sampling_logprobs[4:, 0].tolist() == [behaviour[c] for c in picked]
    assert second.stats["replay/groups"] == 1.0 and second.stats["replay/age_mean"] == 1.0
    third = stage(_step_batch([0.0] * 4, [0.0] * 4), SimpleNamespace(step=3))
    assert all(c.startswith(("c0:0.0", "c1:1.0", "c2:1.0", "c3:1.0")) for c in third.completions[4:]), (
        "history 1: only step 2's groups remain"
    )
    again = MixPolicyReplay(history=1, replay_frac=0.5, seed=0)
    again.load_state_dict(stage.state_dict())
    assert again.state_dict()["steps"][0][0] == 3


def test_precedent_kl_by_hand():
    from rlexp.algorithms.losses.clip import ppo_clip
    from rlexp.algorithms.losses.mirror import PrecedentKL

    logp = torch.tensor([[-1.0, -2.0]])
    old = torch.tensor([[-1.0, -2.0]])
    prev = torch.tensor([[-1.5, -2.0]])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    out = PrecedentKL(ppo_clip, coef=0.1)(logp, old, adv, mask, precedent_logprobs=prev)
    r = math.exp(0.5)  # π_θ / π_prev on the first token; 1 on the second
    kl0 = r * 0.5 - r + 1
    assert out.per_token[0].tolist() == pytest.approx([-1.0 + 0.1 * kl0, -1.0])
    assert out.token_stats["kl_convex/precedent_kl"][0].tolist() == pytest.approx([kl0, 0.0])
    assert "clip/low_frac" in out.token_stats, "the inner loss's statistics pass through"
    same = PrecedentKL(ppo_clip, coef=0.1)(logp, old, adv, mask, precedent_logprobs=logp.clone())
    assert torch.allclose(same.per_token, ppo_clip(logp, old, adv, mask).per_token)


def test_reference_reset_to_the_policy_is_kept_in_its_state():
    from rlexp.algorithms.regularisers.reference import ReferenceModel
    from tests.algorithms.batches import tiny_policy

    policy = tiny_policy(0)
    ref = ReferenceModel(policy, "frozen")
    assert ref.state_dict() is None, "a frozen reference is rebuilt from the initial weights, not saved"
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    ref.reset_to(policy)
    assert all(torch.equal(a, b) for a, b in zip(ref.model.parameters(), policy.parameters()))
    other = ReferenceModel(tiny_policy(0), "frozen")
    other.load_state_dict(ref.state_dict())
    assert other.reincarnated and all(torch.equal(a, b) for a, b in zip(other.model.parameters(), policy.parameters()))


def test_remix_mixes_policies_then_reincarnates_on_the_tiny_model(tiny_cfg, tmp_path):
    cfg = tiny_cfg(*VARYING, "algorithm=remix", "algorithm.reincarnate_at=2", "trainer.max_steps=3")
    run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    one, two, three = rows
    assert one["replay/rows"] == 0.0 and one["train/optimizer_steps"] == 2.0 and one["reincarnation/done"] == 0.0
    # step 2: step 1's two groups replayed beside the fresh two, clipped against step 1's policy, UTD 2
    assert two["replay/rows"] == 8.0 and two["replay/groups"] == 2.0 and two["train/optimizer_steps"] == 2.0
    assert two["batch/replayed_completions"] == 8.0 and two["batch/completions"] == 8.0
    assert two["ratio/max"] != 1.0 and two["kl_convex/precedent_kl"] > 0 and two["kl/mean"] > 0
    assert two["reincarnation/done"] == 1.0
    # step 3, after the reincarnation: on-policy (one optimiser step, no replay), the base is step 2's policy
    assert "replay/rows" not in three and three["train/optimizer_steps"] == 1.0
    assert three["kl/mean"] == pytest.approx(0.0, abs=1e-6), "the reference is the policy the step started from"
    assert three["ratio/max"] == pytest.approx(1.0, abs=1e-5)
