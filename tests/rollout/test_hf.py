import pytest
import torch

from rlexp.core.forward import token_logprobs
from rlexp.rollout.hf import HFRollout, completion_mask_from_ids
from tests.conftest import chat_prompts


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 6, 2, 9, 2], [5, 6, 7, 8, 9], [2, 1, 1, 1, 1]])
    mask, truncated = completion_mask_from_ids(ids, [2])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_sampling_logprobs_equal_training_forward(tiny, temperature):
    """The log-probs recorded during generation are the ones the trainer computes for the ratio
    (prompts of different lengths, so left padding and position ids are exercised)."""
    torch.manual_seed(0)
    rollout = HFRollout(max_new_tokens=10, temperature=temperature, engine="generate")
    out = rollout.generate(tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), num_generations=2)
    assert out.completion_ids.shape[0] == 6 and len(out.texts) == 6
    lp, _ = token_logprobs(
        tiny.model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, temperature
    )
    diff = ((lp - out.logprobs) * out.completion_mask).abs().max()
    assert float(diff) < 1e-4
    assert bool((out.logprobs * (1 - out.completion_mask)).eq(0).all())


def test_micro_batched_generation_concatenates(tiny):
    torch.manual_seed(0)
    out = HFRollout(max_new_tokens=6, micro_batch=4, engine="generate").generate(
        tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 2
    )
    assert out.completion_ids.shape[0] == 6 and out.prompt_ids.shape[0] == 6
    assert set(out.completion_mask.unique().tolist()) <= {0, 1}
    assert int(out.prompt_mask.sum()) == sum(
        len(tiny.tokenizer(p, add_special_tokens=False)["input_ids"])
        for p in chat_prompts(tiny.tokenizer)
        for _ in range(2)
    )


def test_invalid_settings_name_the_key():
    with pytest.raises(ValueError, match="max_new_tokens"):
        HFRollout(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        HFRollout(temperature=0)


def test_auto_inference_dtype_copies_the_policy_only_under_autocast(tiny):
    """``inference_dtype=auto``: under bf16 autocast (as the trainer generates) a bf16 copy holding
    the policy's current weights; without autocast the policy itself."""
    rollout = HFRollout(max_new_tokens=4)
    assert rollout.inference_model(tiny.model) is tiny.model and rollout.shadow is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shadow = rollout.inference_model(tiny.model)
    assert shadow is rollout.shadow and shadow is not tiny.model
    assert next(shadow.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        tiny.model.lm_head.weight.add_(1.0)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rollout.inference_model(tiny.model)  # refreshed from the policy before each rollout
        assert torch.equal(shadow.lm_head.weight, tiny.model.lm_head.weight.to(torch.bfloat16))
    finally:
        with torch.no_grad():
            tiny.model.lm_head.weight.sub_(1.0)


def test_finish_zeroes_log_probs_past_eos_even_when_minus_infinity(tiny):
    """A masking logits processor (NLPO) can make the pad token forced after EOS impossible: its recorded log-prob is
    −inf, which a product with the mask would turn into NaN."""
    from rlexp.rollout.hf import _finish

    eos = tiny.tokenizer.eos_token_id
    completion = torch.tensor([[5, eos, 0, 0], [5, 6, 7, 8]])
    logprobs = torch.tensor([[-1.0, -2.0, float("-inf"), float("-inf")], [-1.0, -1.0, -1.0, -1.0]])
    out = _finish(tiny.tokenizer, torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1), completion, logprobs, [eos])
    assert out.logprobs.tolist() == [[-1.0, -2.0, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0]]
