"""NLPO's learned action mask (rlexp/algorithms/regularisers/action_mask.py): the top-p set by hand, generation
restricted to it with the recorded log-probs renormalised as the training forward computes them, the sync schedule,
the checkpointed masking model, and the method on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.regularisers.action_mask import TopPActionMask, top_p_mask
from rlexp.core.forward import token_logprobs
from rlexp.rollout.hf import HFRollout
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING
from tests.conftest import chat_prompts


def test_top_p_set_by_hand():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert top_p_mask(logits, 0.9).tolist() == [True, True, True, False]  # mass before: 0, .5, .8, .95
    assert top_p_mask(logits, 0.5).tolist() == [True, False, False, False]
    assert top_p_mask(logits[[2, 0, 3, 1]], 0.7).tolist() == [False, True, False, True]  # order does not matter
    assert top_p_mask(logits, 1e-9).sum() == 1, "at least the most likely token"


@pytest.mark.parametrize("engine", ["generate", "loop"])
def test_masked_generation_samples_the_mask_and_records_the_renormalised_log_probs(tiny, engine):
    """With a top-p that leaves one token (the masking model's argmax), sampling is that token and its recorded
    log-prob is 0; with top-p 0.5 every sampled token is in the masking model's set, and the recorded log-probs
    equal the training forward's under the same mask. Both engines: transformers' generate (a logits processor) and
    rlexp's decode loop (a stepper beside the policy)."""
    prompts = chat_prompts(tiny.tokenizer)
    mask = TopPActionMask(tiny.model, top_p=1e-6, sync_every=1)
    rollout = HFRollout(max_new_tokens=6, engine=engine)
    rollout.action_mask = mask
    torch.manual_seed(0)
    out = rollout.generate(tiny.model, tiny.tokenizer, prompts, num_generations=2, use_shadow=False)
    m = out.completion_mask.bool()
    assert out.logprobs[m].abs().max() < 1e-5, "one allowed token: probability 1"
    assert torch.isfinite(out.logprobs).all(), "past EOS the forced pad token may be masked: 0, not −inf·0"
    greedy = HFRollout(max_new_tokens=6, engine=engine).generate(
        tiny.model, tiny.tokenizer, prompts, num_generations=2, greedy=True, use_shadow=False
    )
    assert torch.equal(out.completion_ids[m], greedy.completion_ids[m]), "the masking copy's argmax: greedy"

    mask.top_p = 0.5
    torch.manual_seed(1)
    out = rollout.generate(tiny.model, tiny.tokenizer, prompts, num_generations=2, use_shadow=False)
    m = out.completion_mask.bool()
    args = (out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    allowed = mask.vocab_mask(*args)
    assert int(allowed.sum(-1)[m].max()) < tiny.model.config.vocab_size
    with torch.no_grad():
        lp, _ = token_logprobs(tiny.model, *args, vocab_mask=allowed)
        full, _ = token_logprobs(tiny.model, *args)
    assert float((lp - out.logprobs)[m].abs().max()) < 1e-4
    renorm = full - torch.logsumexp(
        torch.log_softmax(_logits(tiny.model, *args), -1).masked_fill(~allowed, float("-inf")), -1
    )
    assert torch.allclose(lp[m], renorm[m], atol=1e-4), "log π(token) − log Σ_allowed π"


def _logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    ids = torch.cat([prompt_ids, completion_ids], 1)
    attn = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    return out[:, prompt_ids.shape[1] - 1 : -1].float()


def test_masking_model_syncs_every_k_steps(tiny):
    policy = torch.nn.Linear(2, 2)
    mask = TopPActionMask(policy, 0.9, sync_every=3)
    with torch.no_grad():
        policy.weight.add_(1.0)
    assert not mask.after_optimizer_step(policy, 2) and not torch.equal(mask.model.weight, policy.weight)
    assert mask.after_optimizer_step(policy, 3) and torch.equal(mask.model.weight, policy.weight)
    other = TopPActionMask(torch.nn.Linear(2, 2), 0.9, 3)
    other.load_state_dict(mask.state_dict())
    assert torch.equal(other.model.weight, policy.weight)
    with pytest.raises(ValueError, match="action_mask.top_p"):
        TopPActionMask(policy, 0.0)


NLPO_FAST = [*VARYING, "trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


def test_nlpo_runs_two_steps_and_keeps_its_masking_model(tiny_cfg, tmp_path):
    m = run(
        tiny_cfg(*NLPO_FAST, "algorithm=nlpo", "algorithm.action_mask.top_p=0.5", "trainer.checkpoint_every=1")
    ).metrics
    assert m["train/optimizer_steps"] == 2.0 and m["action_mask/synced"] == 0.0
    assert 1 <= m["action_mask/allowed"] < 49152 and math.isfinite(m["loss/total"])
    assert m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0
    blob = torch.load(tmp_path / "run" / "checkpoints" / "last" / "state.pt", weights_only=False)
    assert blob["group_stages"][-1] is not None, "the masking model is in the checkpoint"


def test_nlpo_with_speculative_reuse_names_the_setting(tiny_cfg):
    with pytest.raises(ValueError, match="speculative_reuse"):
        run(tiny_cfg(*NLPO_FAST, "algorithm=nlpo", "rollout.speculative_reuse.enabled=true"))
