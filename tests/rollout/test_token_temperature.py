"""Per-token sampling temperatures (rlexp.rollout.temperature): EAD's annealing and HAPO's entropy-adaptive schedule,
by hand, and the decode loop / generate recording the log-prob under the temperature actually used at each position."""

import math

import pytest
import torch

from rlexp.core.entropy import EntropyScale
from rlexp.core.forward import completion_logits
from rlexp.rollout.decode import Sampling, pick_tokens
from rlexp.rollout.hf import HFRollout
from rlexp.rollout.temperature import (
    AnnealedTemperature,
    EntropyAdaptiveTemperature,
    build_token_temperature,
    temperature_stats,
)
from tests.conftest import chat_prompts


def test_annealed_schedule_by_hand():
    # τ_max 1.2, τ_min 0.1, d = 10, warm-up 2: τ/T = 1 for t < 2; t = 2: 2.2 − e^0.2 = 2.2 − 1.221403 = 0.978597;
    # t = 10: 2.2 − e = −0.518 → τ_min 0.1
    a = AnnealedTemperature(tau_max=1.2, tau_min=0.1, decay=10, decay_growth=0, warmup=2)
    assert [a.factor(t) for t in (0, 1)] == [1.0, 1.0]
    assert a.factor(2) == pytest.approx(2.2 - math.exp(0.2))
    assert a.factor(10) == pytest.approx(0.1)
    # no warm-up: t = 0 gives 1 + τ_max − 1 = τ_max
    assert AnnealedTemperature(warmup=0).factor(0) == pytest.approx(1.2)
    # the base temperature T = 0.5 scales it: 0.5 · 0.978597 = 0.4892985 for every row
    temps = a(torch.zeros(3, 5), 2, 0.5)
    assert temps.shape == (3,) and torch.allclose(temps, torch.full((3,), 0.4892985))


def test_annealed_decay_grows_with_the_train_step():
    # d_s = min(d_0 + g·s, d_max): 10 + 5·2 = 20; capped at 15
    a = AnnealedTemperature(decay=10, decay_growth=5, decay_max=1000)
    a.on_step(2)
    assert a.decay == 20
    # t = 20 at d = 20: 2.2 − e^1 < 0.1 → 0.1; t = 10: 2.2 − e^0.5 = 2.2 − 1.648721 = 0.551279
    assert a.factor(10) == pytest.approx(2.2 - math.exp(0.5))
    capped = AnnealedTemperature(decay=10, decay_growth=5, decay_max=15)
    capped.on_step(2)
    assert capped.decay == 15


def test_entropy_adaptive_temperature_by_hand():
    s = EntropyAdaptiveTemperature(tau=0.05)
    uniform = torch.zeros(2, 4)  # entropy ln 4 at any base temperature
    assert torch.allclose(s(uniform, 0, 0.7), torch.full((2,), 0.7))  # no statistics yet: T, as the release
    # statistics: pivot 3, spread sqrt(3), scale_pos sqrt(3), scale_neg 1/sqrt(3) (tests/core/test_entropy.py)
    s.scale = EntropyScale(3.0, math.sqrt(3), math.sqrt(3), 1 / math.sqrt(3))
    # uniform over 4: ℓ = ln(ln 4) = 0.326634, h = (0.326634 − 3)/sqrt(3) = −1.543476, ĥ = h/sqrt(3) = −0.891126
    # τ = 0.7 · (1 + 0.05 · −0.891126) = 0.7 · 0.955444 = 0.668811
    assert torch.allclose(s(uniform, 0, 0.7), torch.full((2,), 0.668811), atol=1e-6)
    # a near-certain row: ĥ far below −1, clamped: τ = 0.7 · 0.95 = 0.665
    sure = torch.tensor([[30.0, 0.0, 0.0, 0.0]])
    assert float(s(sure, 0, 0.7)) == pytest.approx(0.665)
    # ℓ = 4 (entropy e^4 ≈ 54.6 nats, beyond a 4-token vocabulary, so via the scale alone): ĥ = 1 → τ = 0.7 · 1.05
    s.scale = EntropyScale(float(math.log(math.log(4))) - 1.0, 1.0, 1.0, 1.0)  # ℓ − pivot = 1 → ĥ = 1
    assert torch.allclose(s(uniform, 0, 0.7), torch.full((2,), 0.735), atol=1e-6)


def test_observe_takes_the_batch_statistics():
    s = EntropyAdaptiveTemperature()
    entropy = torch.tensor([[1.0, math.e, math.e**2], [math.e**3, math.e**4, 123.0]])
    s.observe(entropy, torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert s.scale.pivot == pytest.approx(3.0) and s.scale.spread == pytest.approx(math.sqrt(3))
    state = s.state_dict()
    fresh = EntropyAdaptiveTemperature()
    fresh.load_state_dict(state)
    assert fresh.scale == s.scale


def test_pick_tokens_logprob_under_each_rows_temperature():
    # logits (2, 0, 0) for both rows; τ = 2 on row 0: softmax of (1, 0, 0) = (e, 1, 1)/(e + 2), e + 2 = 4.718282;
    # τ = 0.5 on row 1: (4, 0, 0) → (e^4, 1, 1)/(e^4 + 2), e^4 + 2 = 56.598150
    logits = torch.tensor([[2.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    temps = torch.tensor([2.0, 0.5])
    # uniform 0.99 draws the last token on both rows (cumulative 0.576, 0.788, 1 and 0.965, 0.982, 1)
    tok, lp = pick_tokens(logits, Sampling(temperature=0.7), torch.full((2, 1), 0.99), temps)
    assert tok.tolist() == [2, 2]
    assert torch.allclose(lp, torch.tensor([-math.log(math.e + 2), -math.log(math.e**4 + 2)]))
    # and against log_softmax(logits / τ_t) directly, for the first token
    tok, lp = pick_tokens(logits, Sampling(temperature=0.7), torch.zeros(2, 1), temps)
    expected = torch.log_softmax(logits / temps[:, None], -1)[:, 0]
    assert tok.tolist() == [0, 0] and torch.allclose(lp, expected)
    assert float(lp[0]) == pytest.approx(1 - math.log(math.e + 2))  # −0.551445


def test_temperature_stats_by_hand():
    temps = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # valid 1, 2, 4: mean 7/3, min 1, max 4; first tokens 1, 4 → 2.5; last tokens 2, 4 → 3
    m = temperature_stats("ead", temps, mask)
    assert m == pytest.approx(
        {
            "ead/temperature_mean": 7 / 3,
            "ead/temperature_min": 1.0,
            "ead/temperature_max": 4.0,
            "ead/temperature_first": 2.5,
            "ead/temperature_last": 3.0,
        }
    )


ANNEALED = {"schedule": "annealed", "tau_max": 1.2, "tau_min": 0.1, "decay": 6.0, "warmup": 1}


@torch.no_grad()
def _expected_logprobs(tiny, out):
    logits = completion_logits(tiny.model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    lp = torch.log_softmax(logits.float() / out.temperatures[..., None], -1)
    return lp.gather(-1, out.completion_ids[..., None]).squeeze(-1)


@pytest.mark.parametrize("engine", ["loop", "generate"])
def test_rollout_records_the_logprob_at_the_annealed_temperature(tiny, engine):
    torch.manual_seed(0)
    rollout = HFRollout(max_new_tokens=10, temperature=0.7, engine=engine, token_temperature=ANNEALED)
    out = rollout.generate(tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 2)
    T = out.completion_ids.shape[1]
    sched = AnnealedTemperature(tau_max=1.2, tau_min=0.1, decay=6.0, warmup=1)
    want = torch.tensor([0.7 * sched.factor(t) for t in range(T)])
    assert torch.allclose(out.temperatures, want.expand_as(out.temperatures))
    m = out.completion_mask.bool()
    assert float((_expected_logprobs(tiny, out) - out.logprobs)[m].abs().max()) < 1e-4
    assert out.stats["ead/temperature_first"] == pytest.approx(0.7)
    assert out.stats["ead/temperature_max"] == pytest.approx(0.7 * (2.2 - math.exp(1 / 6)))  # at t = 1
    # greedy calls ignore the schedule
    g = rollout.generate(tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 1, greedy=True)
    assert g.temperatures is None and not any(k.startswith("ead/") for k in g.stats)


@pytest.mark.parametrize("engine", ["loop", "generate"])
def test_rollout_records_the_logprob_at_the_entropy_temperature(tiny, engine):
    torch.manual_seed(0)
    rollout = HFRollout(max_new_tokens=6, temperature=0.7, engine=engine)
    prompts = chat_prompts(tiny.tokenizer, 2)
    first = rollout.generate(tiny.model, tiny.tokenizer, prompts, 2)  # no schedule: one temperature
    assert first.temperatures is None
    schedule = EntropyAdaptiveTemperature(tau=0.5)  # strong, so the temperatures differ visibly
    with torch.no_grad():  # the statistics of the first rollout's entropies at T (what the trainer passes)
        logits = completion_logits(
            tiny.model, first.prompt_ids, first.prompt_mask, first.completion_ids, first.completion_mask
        )
        logp = torch.log_softmax(logits.float() / 0.7, -1)
        schedule.observe(-(logp.exp() * logp).sum(-1), first.completion_mask)
    rollout.token_temperature = schedule
    out = rollout.generate(tiny.model, tiny.tokenizer, prompts, 2)
    m = out.completion_mask.bool()
    temps = out.temperatures[m]
    assert float(temps.min()) >= 0.7 * 0.5 - 1e-6 and float(temps.max()) <= 0.7 * 1.5 + 1e-6
    assert float(temps.max() - temps.min()) > 0.01  # per token, not one value
    assert float((_expected_logprobs(tiny, out) - out.logprobs)[m].abs().max()) < 1e-4
    assert "hapo/temperature_mean" in out.stats


def test_micro_groups_keep_each_rows_temperatures(tiny):
    torch.manual_seed(0)
    out = HFRollout(max_new_tokens=6, temperature=0.7, micro_group_size=1, token_temperature=ANNEALED).generate(
        tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer, 2), 2
    )
    assert out.temperatures.shape == out.completion_ids.shape
    assert float((_expected_logprobs(tiny, out) - out.logprobs)[out.completion_mask.bool()].abs().max()) < 1e-4


def test_settings_errors_name_the_key():
    with pytest.raises(ValueError, match="rollout.token_temperature.schedule"):
        HFRollout(token_temperature={"schedule": "cosine"})
    with pytest.raises(ValueError, match="unknown setting"):
        build_token_temperature({"schedule": "annealed", "tau": 1.0})
    with pytest.raises(ValueError, match="tau_min"):
        build_token_temperature({"schedule": "annealed", "tau_max": 0.5, "tau_min": 0.8})
    with pytest.raises(ValueError, match="eager decode loop"):
        HFRollout(engine="loop", cache_implementation="static", decode_graph="capture", token_temperature=ANNEALED)
    with pytest.raises(ValueError, match="speculative_reuse"):
        HFRollout(speculative_reuse={"enabled": True}, token_temperature=ANNEALED)


def test_vllm_refuses_a_per_token_temperature():
    from rlexp.rollout.vllm import VLLMRollout

    rollout = VLLMRollout()
    assert rollout.token_temperature is None
    with pytest.raises(ValueError, match="rollout=hf"):
        rollout.token_temperature = AnnealedTemperature()
