"""SPEC-RL's speculative rollouts (rlexp/rollout/speculative.py, HFRollout(speculative_reuse=...)): the acceptance
rule by hand and in distribution on a small vocabulary, and the rollout that drafts from a prompt's previous
completions on the tiny model."""

import math

import pytest
import torch

from rlexp.core.forward import token_logprobs
from rlexp.rollout.hf import HFRollout
from rlexp.rollout.speculative import RolloutCache, SpeculativeReuse, accepted_lengths
from tests.conftest import chat_prompts


def test_accepted_prefix_ends_at_the_first_rejection_by_hand():
    # ratios pi_new / pi_old per token: row 0: 1/2, 2, 1/4; row 1: 1/2, 1/2, (padding); row 2: 2, 4, 1
    old = torch.log(torch.tensor([[0.4, 0.2, 0.8], [0.4, 0.4, 0.3], [0.1, 0.1, 0.5]]))
    new = torch.log(torch.tensor([[0.2, 0.4, 0.2], [0.2, 0.2, 0.9], [0.2, 0.4, 0.5]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    u = torch.tensor([[0.49, 0.99, 0.3], [0.51, 0.1, 0.99], [0.99, 0.99, 0.99]])
    # row 0: 0.49 <= 1/2 accept, 2 accept, 0.3 > 1/4 reject -> 2; row 1: 0.51 > 1/2 -> 0; row 2: all accepted -> 3
    assert accepted_lengths(old, new, mask, 1.0, u).tolist() == [2, 0, 3]
    # lenience 2 doubles every ratio: row 0's third token (1/2 >= 0.3) and row 1's first (1 >= 0.51) pass
    assert accepted_lengths(old, new, mask, 2.0, u).tolist() == [3, 2, 3]


def _speculative_marginal(p, q, lenience, residual, n=400_000, seed=0):
    """Empirical distribution of one drafted position: draft y ~ q, accept by ``accepted_lengths``; a rejected
    position is redrawn from the residual norm(max(0, p - q)) (exact speculative sampling) or afresh from p."""
    g = torch.Generator().manual_seed(seed)
    y = torch.multinomial(q, n, replacement=True, generator=g)
    keep = accepted_lengths(
        q.log()[y][:, None], p.log()[y][:, None], torch.ones(n, 1), lenience, torch.rand(n, 1, generator=g)
    ).bool()
    redraw_from = (p - q).clamp(min=0) if residual else p
    redrawn = torch.multinomial(redraw_from / redraw_from.sum(), n, replacement=True, generator=g)
    return torch.bincount(torch.where(keep, y, redrawn), minlength=len(p)).double() / n


P = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
Q = torch.tensor([0.2, 0.2, 0.2, 0.4], dtype=torch.float64)


def test_lenience_one_with_the_residual_draws_the_current_policy_exactly():
    assert torch.allclose(_speculative_marginal(P, Q, 1.0, residual=True), P, atol=3e-3)


@pytest.mark.parametrize("lenience", [1.0, math.exp(0.5)])
def test_fresh_redraw_tilts_toward_the_draft_as_the_docstring_says(lenience):
    a = torch.minimum(Q, lenience * P)  # accepted mass per token
    expected = a + (1 - a.sum()) * P
    if lenience == 1.0:  # by hand: a = [0.2, 0.2, 0.15, 0.05], 1 - sum(a) = 0.4
        assert torch.allclose(expected, torch.tensor([0.4, 0.32, 0.21, 0.07], dtype=torch.float64))
    got = _speculative_marginal(P, Q, lenience, residual=False)
    assert torch.allclose(got, expected, atol=3e-3)
    assert P[0] - got[0] > 0.09  # not the current policy: the token the draft under-weights is drawn too rarely


def test_same_policy_accepts_every_draft():
    lp = torch.log(torch.rand(4, 6))
    assert accepted_lengths(lp, lp, torch.ones(4, 6), 1.0).tolist() == [6] * 4


def _rollout(**spec):
    return HFRollout(max_new_tokens=10, temperature=0.7, speculative_reuse={"enabled": True, **spec})


def test_rollout_reuses_every_draft_of_an_unchanged_policy(tiny):
    prompts = chat_prompts(tiny.tokenizer)
    r = _rollout()
    torch.manual_seed(0)
    first = r.generate(tiny.model, tiny.tokenizer, prompts, 4, reuse=True)
    assert first.stats["spec/drafted_frac"] == 0.0 and len(r.cache) == 3
    second = r.generate(tiny.model, tiny.tokenizer, prompts, 4, reuse=True)
    assert second.stats["spec/drafted_frac"] == 1.0 and second.stats["spec/full_reuse_frac"] == 1.0
    assert torch.equal(second.completion_ids, first.completion_ids)
    assert second.texts == first.texts
    assert second.stats["spec/reused_tokens_mean"] == pytest.approx(float(first.completion_mask.sum()) / 12)
    # without reuse=True (evaluation, ReMax's greedy baseline) the cache is neither read nor written
    plain = r.generate(tiny.model, tiny.tokenizer, prompts[:1], 4)
    assert "spec/drafted_frac" not in plain.stats


def _perturbed(model, scale, seed=1):
    import copy

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return other


def test_rollout_continues_from_the_first_rejected_token(tiny):
    prompts = chat_prompts(tiny.tokenizer)
    r = _rollout()
    torch.manual_seed(0)
    first = r.generate(tiny.model, tiny.tokenizer, prompts, 4, reuse=True)
    moved = _perturbed(tiny.model, 0.3)
    second = r.generate(moved, tiny.tokenizer, prompts, 4, reuse=True)
    s = second.stats
    assert 0 < s["spec/accepted_frac"] < 1 and s["spec/full_reuse_frac"] < 1
    # every row begins with a prefix of its draft (row j of the prompt's previous group)...
    same = (second.completion_ids == first.completion_ids) & first.completion_mask.bool()
    prefix = same.int().cumprod(-1).sum(-1)
    assert float(prefix.sum()) >= s["spec/reused_tokens_mean"] * 12 > 0
    assert bool((prefix < first.completion_mask.sum(-1)).any())  # and some part from it
    # ...and every token's sampling log-prob, reused or decoded, is the moved policy's (the training forward's)
    lp, _ = token_logprobs(
        moved, second.prompt_ids, second.prompt_mask, second.completion_ids, second.completion_mask, 0.7
    )
    assert float(((lp - second.logprobs) * second.completion_mask).abs().max()) < 1e-4
    assert bool((second.completion_mask.sum(-1) <= 10).all())  # continuations stay within max_new_tokens
    # the cache now holds the second group, as drafts for the next time
    ids, logprobs = r.cache.get(prompts[0], 4)[1]
    n = int(second.completion_mask[1].sum())
    assert torch.equal(ids, second.completion_ids[1, :n]) and torch.allclose(logprobs, second.logprobs[1, :n])


def test_speculative_rollout_is_deterministic_under_a_seed(tiny):
    prompts = chat_prompts(tiny.tokenizer)
    moved = _perturbed(tiny.model, 0.3)
    outs = []
    for _ in range(2):
        r = _rollout(verify_micro_batch=4)
        torch.manual_seed(3)
        r.generate(tiny.model, tiny.tokenizer, prompts, 4, reuse=True)
        outs.append(r.generate(moved, tiny.tokenizer, prompts, 4, reuse=True))
    assert torch.equal(outs[0].completion_ids, outs[1].completion_ids)
    assert torch.equal(outs[0].logprobs, outs[1].logprobs)


def test_cache_state_round_trips():
    cache = RolloutCache()
    ids = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0]])
    cache.put("p", ids, torch.full((2, 4), -1.0), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]))
    assert [len(x) for x, _ in cache.get("p", 2)] == [3, 2] and cache.get("p", 4) is None and cache.get("q", 2) is None
    other = RolloutCache()
    other.load_state_dict(cache.state_dict())
    assert torch.equal(other.get("p", 2)[0][0], torch.tensor([5, 6, 2]))


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"speculative_reuse": {"enabled": True, "lenience": 0}}, "rollout.speculative_reuse.lenience"),
        ({"speculative_reuse": {"enabled": True}, "top_p": 0.9}, "rollout.speculative_reuse.enabled"),
        ({"speculative_reuse": {"enabled": True}, "engine": "generate"}, "rollout.speculative_reuse.enabled"),
        ({"speculative_reuse": {"enabled": True, "verify_micro_batch": -1}}, "verify_micro_batch"),
    ],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        HFRollout(**kwargs)


def test_settings_defaults_are_off():
    assert not SpeculativeReuse().enabled and HFRollout().speculative is None
