"""A*-PO: the optimal value V* from reference samples (group_stages.optimal_value, cached per prompt) and the
least-squares regression of β2·log π/π_ref onto r − V* (losses.optimal_advantage)."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.baselines import remax
from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.group_stages.optimal_value import OptimalValue, optimal_value
from rlexp.algorithms.losses.optimal_advantage import OptimalAdvantageRegression
from rlexp.core.batch import RolloutBatch
from rlexp.rollout.hf import RolloutOutput
from tests.algorithms.varying_reward import VowelShare


def test_optimal_value_is_the_log_mean_exp_by_hand():
    # β1 = 0.5, r = (0, 1): 0.5·log((e^0 + e^2)/2) = 0.5·log(4.194528) = 0.5·1.433781 = 0.716891
    v = optimal_value(torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]), 0.5)
    assert v.tolist() == pytest.approx([0.716891, 1.0, 0.0], abs=1e-5)
    # between the mean (β1 → ∞) and the max (β1 → 0)
    assert optimal_value(torch.tensor([0.0, 1.0]), 1e3).item() == pytest.approx(0.5, abs=1e-3)
    assert optimal_value(torch.tensor([0.0, 1.0]), 1e-3).item() == pytest.approx(1.0, abs=1e-2)
    # large rewards over a small β1 stay finite (log-sum-exp)
    assert math.isfinite(optimal_value(torch.tensor([100.0, 0.0]), 0.01).item())
    with pytest.raises(ValueError, match="beta1"):
        optimal_value(torch.tensor([0.0]), 0.0)


def test_the_loss_on_hand_numbers():
    loss = OptimalAdvantageRegression(beta2=0.5)
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -7.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -3.0], [-0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    target = torch.tensor([0.25, -0.25])  # r − V*
    out = loss(logp, logp.detach(), target, mask, ref_logp=ref)
    # row 0: h = (−1 + 2) + (−2 + 3) = 2, β2·h = 1, e = 1 − 0.25 = 0.75, e² = 0.5625
    # row 1: h = −1 + 0.5 = −0.5 (the padded token is out), β2·h = −0.25, e = 0
    assert out.per_token.flatten().tolist() == pytest.approx([0.5625, 0.5625, 0.0, 0.0])
    assert out.token_stats["a_star_po/regression_residual"][0].tolist() == pytest.approx([0.75, 0.75])
    assert out.token_stats["a_star_po/log_ratio"][:, 0].tolist() == pytest.approx([2.0, -0.5])
    total = aggregate(out.per_token, mask, "seq-mean-token-mean", Normaliser.from_mask(mask))
    assert total.item() == pytest.approx(0.5625 / 2)  # mean over the two sequences of e²
    total.backward()
    # d/dlogp_{0,t} of ½·e0² (half: the mean over two rows) = e0·β2 = 0.375 on each valid token of row 0; row 1: e = 0
    assert logp.grad.flatten().tolist() == pytest.approx([0.375, 0.375, 0.0, 0.0])
    with pytest.raises(ValueError, match="ref_logp"):
        loss(logp, logp.detach(), target, mask)
    with pytest.raises(ValueError, match="beta2"):
        OptimalAdvantageRegression(beta2=0.0)


def test_the_algorithm_hands_the_loss_the_reference_log_probs():
    algo = Algorithm(
        name="a_star_po",
        advantage=remax,
        loss=OptimalAdvantageRegression(beta2=1.0),
        aggregation="seq-mean-token-mean",
    )
    assert algo.needs_reference and algo.loss_needs_reference
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    out = algo.token_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), ref_logp=ref)
    assert out.per_token.item() == pytest.approx(0.25)  # (1·0.5 − 0)²
    with pytest.raises(ValueError, match="reference log-probs"):
        algo.token_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1))
    with pytest.raises(ValueError, match="aggregation"):
        Algorithm(name="x", advantage=remax, loss=OptimalAdvantageRegression(), aggregation="token-mean")


class _Rollout:
    """Each prompt's N completions alternate 'aa' (vowel share 1) and 'bb' (0); counts the prompts generated for."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def generate(self, model, tokenizer, prompts, num_generations=1, **_):
        self.calls.append(list(prompts))
        n = len(prompts) * num_generations
        texts = ["aa" if k % 2 == 0 else "bb" for k in range(num_generations)] * len(prompts)
        return RolloutOutput(
            prompt_ids=torch.ones(n, 2, dtype=torch.long),
            prompt_mask=torch.ones(n, 2, dtype=torch.long),
            completion_ids=torch.ones(n, 2, dtype=torch.long),
            completion_mask=torch.ones(n, 2, dtype=torch.long),
            logprobs=torch.zeros(n, 2),
            truncated=torch.zeros(n, dtype=torch.bool),
            texts=texts,
        )


def _batch(ids: list[int]) -> RolloutBatch:
    n = len(ids)
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, 2, dtype=torch.long),
        completion_mask=torch.ones(n, 2, dtype=torch.long),
        sampling_logprobs=torch.zeros(n, 2),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.arange(n),
        prompts=[f"p{i}" for i in ids],
        completions=["x"] * n,
        records=[{"id": i} for i in ids],
        reward=torch.full((n,), 0.25),
    )


def test_v_star_is_sampled_once_per_prompt_and_cached():
    rollout = _Rollout()
    ctx = SimpleNamespace(
        rollout=rollout,
        reward_terms={"accuracy": VowelShare()},
        tokenizer=object(),
        reference=SimpleNamespace(model=torch.nn.Linear(1, 1)),
        autocast_dtype=None,
    )
    stage = OptimalValue(samples=2, beta1=0.5)
    b = stage(_batch([7, 8]), ctx)
    # rewards (1, 0) per prompt: V* = 0.5·log((e^2 + 1)/2) = 0.716891
    assert b.extras["v_star"].tolist() == pytest.approx([0.716891, 0.716891], abs=1e-5)
    assert rollout.calls == [["p7", "p8"]]
    assert b.stats["a_star_po/new_prompts"] == 2.0 and b.stats["a_star_po/ref_reward_mean"] == pytest.approx(0.5)
    assert remax(b, key="v_star").tolist() == pytest.approx([0.25 - 0.716891] * 2, abs=1e-5)  # r − V*
    # second sight of prompt 7 (and a new prompt 9): only 9 is sampled
    b2 = stage(_batch([7, 9]), ctx)
    assert rollout.calls[1] == ["p9"]
    assert b2.stats["a_star_po/new_prompts"] == 1.0 and b2.stats["a_star_po/cache_size"] == 3.0
    # all cached: no generation
    b3 = stage(_batch([8, 9]), ctx)
    assert len(rollout.calls) == 2 and b3.stats["a_star_po/new_prompts"] == 0.0
    assert "a_star_po/ref_reward_mean" not in b3.stats
    # the cache travels in the stage's state (checkpoints) and a restored stage samples nothing
    restored = OptimalValue(samples=2, beta1=0.5)
    restored.load_state_dict(stage.state_dict())
    restored(_batch([7, 8, 9]), ctx)
    assert len(rollout.calls) == 2


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match="samples"):
        OptimalValue(samples=0)
    with pytest.raises(ValueError, match="beta1"):
        OptimalValue(beta1=-1.0)
    with pytest.raises(ValueError, match="reference.kind"):
        Algorithm(
            name="x",
            advantage=remax,
            loss=OptimalAdvantageRegression(),
            aggregation="seq-mean-token-mean",
            reference={"kind": "ema"},
            group_stages=[OptimalValue()],
        )


@pytest.mark.long
def test_a_star_po_trains_two_steps(tiny_cfg):
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6"]
    result = run(tiny_cfg(*VARYING, *fast, "algorithm=a_star_po", "algorithm.group_stages.0.samples=2"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # one sample per prompt: the step's rows are its prompts
    assert m["train/optimizer_steps"] == 2.0
    assert 0.0 < m["a_star_po/v_star_mean"] < 1.0  # the vowel share's log-mean-exp over 2 reference samples
    assert m["a_star_po/regression_residual"] > 0 and m["loss/total"] > 0
    assert m["a_star_po/cache_size"] == 2.0 + m["a_star_po/new_prompts"]
    assert m["advantage/abs_mean"] > 0
