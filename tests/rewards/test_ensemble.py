"""Multi-reward-model voting (rlexp.rewards.ensemble, "Secrets of RLHF Part II", arXiv 2401.06080): the ensemble
mean, spread, pairwise agreement and preference strength on a hand-written score matrix; the keep / shrink / drop
treatments of contested completions; the per-model score cache; the vote of tiny random reward models against the
single models; bad settings; and two training steps of reward=rm_vote on the tiny model (long)."""

import math

import pytest
import torch

from rlexp.config.schema import ConfigError
from rlexp.rewards.ensemble import RewardVote, group_means, vote_statistics
from rlexp.rewards.reward_model import RewardModel
from rlexp.rewards.terms import Sample
from rlexp.runs.setup import build_reward_term
from rlexp.runs.training import run
from tests.rewards.test_reward_model import samples as rm_samples
from tests.rewards.test_reward_model import save_tiny_rm

# 3 models x 4 completions; completions 0-2 form group 0, completion 3 is alone in group 1
SCORES = torch.tensor(
    [
        [1.0, 0.0, 0.5, 0.2],
        [0.8, 0.2, 0.9, 0.4],
        [0.0, 1.0, 0.3, 0.6],
    ]
)
GROUPS = [0, 0, 0, 1]
# means: c0 1.8/3 = 0.6, c1 1.2/3 = 0.4, c2 1.7/3, c3 1.2/3 = 0.4
MEANS = [0.6, 0.4, 1.7 / 3, 0.4]
# pairs of group 0, d_m = r_m(i) - r_m(j):
#   (0,1): d = [1.0, 0.6, -1.0], mu = 0.2 > 0: m0, m1 side with it -> 2/3
#   (0,2): d = [0.5, -0.1, -0.3], mu = 0.1/3 > 0: m0 only -> 1/3
#   (1,2): d = [-0.5, -0.7, 0.7], mu = -0.5/3 < 0: m0, m1 -> 2/3
# a0 = (2/3 + 1/3)/2 = 1/2, a1 = (2/3 + 2/3)/2 = 2/3, a2 = (1/3 + 2/3)/2 = 1/2, a3 = 1 (no peers)
AGREEMENT = [0.5, 2 / 3, 0.5, 1.0]
# population std over models: c0 and c1 sqrt(0.56/3); c2 sqrt((1/15^2 + 1/3^2 + 4/15^2)/3) = sqrt(0.18667/3);
# c3 sqrt(0.08/3)
STDS = [math.sqrt(0.56 / 3)] * 2 + [math.sqrt((1 / 225 + 1 / 9 + 16 / 225) / 3), math.sqrt(0.08 / 3)]


def vote(**kw):
    return RewardVote(models=["a", "b", "c"], device="cpu", **kw)  # loads nothing until scored


def test_vote_statistics_by_hand():
    st = vote_statistics(SCORES, GROUPS)
    assert st["mean"].tolist() == pytest.approx(MEANS)
    assert st["agreement"].tolist() == pytest.approx(AGREEMENT)
    assert st["std"].tolist() == pytest.approx(STDS, abs=1e-5)
    assert sorted(st["strength"].tolist()) == pytest.approx([0.1 / 3, 0.5 / 3, 0.2])  # |mu| of the three pairs
    # one model: every model agrees with itself, no spread
    one = vote_statistics(SCORES[:1], GROUPS)
    assert one["agreement"].tolist() == [1.0] * 4 and one["std"].tolist() == [0.0] * 4
    # a pair the ensemble ties (mu = 0) agrees only where every model ties: m0 +1, m1 -1 -> 0; equal scores -> 1
    assert vote_statistics(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), [0, 0])["agreement"].tolist() == [0.0, 0.0]
    assert vote_statistics(torch.tensor([[0.3, 0.3], [0.5, 0.5]]), [0, 0])["agreement"].tolist() == [1.0, 1.0]
    assert group_means(torch.tensor(MEANS), GROUPS).tolist() == pytest.approx([1.5666667 / 3] * 3 + [0.4])


def test_keep_shrink_and_drop_by_hand():
    keep, m = vote().combine_votes(SCORES, GROUPS)
    assert keep == pytest.approx(MEANS)
    assert m["agreement"] == pytest.approx((0.5 + 2 / 3 + 0.5 + 1) / 4)  # 0.6667
    assert m["std_mean"] == pytest.approx(sum(STDS) / 4, abs=1e-5)
    assert m["strength_mean"] == pytest.approx(0.4 / 3)  # (0.2 + 0.0333 + 0.1667) / 3
    assert m["low_agreement_frac"] == 0.0 and m["models"] == 3  # threshold 0.5: a0 = a2 = 0.5 are not below
    g = (0.6 + 0.4 + 1.7 / 3) / 3  # group 0's mean of the ensemble means = 0.52222
    shrink, _ = vote(low_agreement="shrink").combine_votes(SCORES, GROUPS)
    # r = g + a (mean - g): 0.52222 + 0.5 * 0.07778 = 0.56111; 0.52222 - 2/3 * 0.12222 = 0.44074; 0.54444; alone 0.4
    assert shrink == pytest.approx([g + 0.5 * (0.6 - g), g + 2 / 3 * (0.4 - g), g + 0.5 * (1.7 / 3 - g), 0.4])
    assert shrink == pytest.approx([0.561111, 0.440741, 0.544444, 0.4], abs=1e-6)
    drop, m = vote(low_agreement="drop", agreement_threshold=0.6).combine_votes(SCORES, GROUPS)
    assert drop == pytest.approx([g, 0.4, g, 0.4])  # c0, c2 (agreement 1/2 < 0.6) get the group mean
    assert m["low_agreement_frac"] == 0.5


def test_call_caches_each_pairs_model_scores(monkeypatch):
    rm = vote(cache=8)
    monkeypatch.setattr(rm, "scorers", lambda: [])
    calls = []
    table = {c: SCORES[:, i] for i, c in enumerate(["w", "x", "y", "z"])}

    def model_scores(questions, completions):
        calls.append(list(completions))
        return torch.stack([table[c] for c in completions], 1), 0

    monkeypatch.setattr(rm, "model_scores", model_scores)
    batch = [Sample("p", c, {"question": "q"}, g, 3, False) for c, g in zip("wxyz", GROUPS)]
    first = rm(batch)
    assert first.scores == pytest.approx(MEANS) and first.failures == [False] * 4
    assert first.metrics["agreement"] == pytest.approx(2 / 3) and first.metrics["cache_hits"] == 0
    again = rm(batch[:2] + [Sample("p", "y", {"question": "q"}, 0, 3, False)])  # all three cached
    assert calls == [list("wxyz")] and again.metrics["cache_hits"] == 3
    # the cache keeps the M scores, so the agreement is recomputed within the new group: (0,1) 2/3, (0,2) 1/3 ...
    assert again.metrics["agreement"] == pytest.approx((0.5 + 2 / 3 + 0.5) / 3)

    def broken(q, c):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(rm, "model_scores", broken)
    res = rm([Sample("p", "new", {"question": "q"}, 0, 3, False), batch[0]])
    assert res.failures == [True, False] and res.scores[0] == 0.0  # the failed row: 0; the cached one still votes


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="RewardVote.models: at least two"):
        RewardVote(models=["a"])
    with pytest.raises(ValueError, match="RewardVote.models: at least two"):
        RewardVote()
    with pytest.raises(ValueError, match="not model"):
        RewardVote(model="a", models=["a", "b"])
    with pytest.raises(ValueError, match="combine: mean"):
        RewardVote(models=["a", "b"], combine="min")
    with pytest.raises(ValueError, match="low_agreement='flip'"):
        RewardVote(models=["a", "b"], low_agreement="flip")
    with pytest.raises(ValueError, match="agreement_threshold=1.5"):
        RewardVote(models=["a", "b"], agreement_threshold=1.5)


@pytest.fixture(scope="module")
def rm_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("vote_rms")
    return [save_tiny_rm(root / f"rm{s}", s) for s in (0, 1, 2)]


def test_the_vote_of_tiny_reward_models_is_their_mean(rm_paths):
    single = [RewardModel(model=p, device="cpu", cache=0)(rm_samples()).scores for p in rm_paths]
    res = RewardVote(models=rm_paths, device="cpu", cache=0)(rm_samples())
    assert res.scores == pytest.approx([sum(s) / 3 for s in zip(*single)], abs=1e-5)
    st = vote_statistics(torch.tensor(single), [s.group for s in rm_samples()])
    assert res.metrics["agreement"] == pytest.approx(float(st["agreement"].mean()), abs=1e-5)
    assert res.metrics["std_mean"] > 0 and res.metrics["models"] == 3


def test_rm_vote_without_models_is_a_config_error_naming_the_term(tiny_cfg):
    cfg = tiny_cfg("reward=rm_vote")
    with pytest.raises(ConfigError, match=r"reward\.terms\.rm: RewardVote\.models: at least two"):
        build_reward_term(cfg.reward.terms.rm, "reward.terms.rm")


@pytest.mark.long
def test_rm_vote_trains_two_steps_on_the_tiny_model(tiny_cfg, rm_paths):
    models = ",".join(f"'{p}'" for p in rm_paths)
    cfg = tiny_cfg("reward=rm_vote", f"reward.terms.rm.models=[{models}]", "trainer.autocast=off")
    m = run(cfg).metrics
    assert math.isfinite(m["loss/total"]) and m["reward/rm/failures"] == 0 and m["reward/rm/models"] == 3
    assert 0.0 < m["reward/rm/agreement"] <= 1.0 and m["reward/rm/std_mean"] > 0  # random RMs disagree
    assert m["reward/rm/strength_mean"] > 0 and 0.0 < m["reward/rm/mean"] < 1.0
