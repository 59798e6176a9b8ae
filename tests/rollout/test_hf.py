import pytest
import torch
from omegaconf import OmegaConf

from rlexp.models.loading import load_model
from rlexp.rollout.hf import HFRollout, completion_mask_from_ids
from rlexp.train import CONF_DIR
from rlexp.trainer.policy import token_logprobs


@pytest.fixture(scope="module")
def tiny():
    return load_model(OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml"), torch.device("cpu"))


def _prompts(tok, n=3):
    return [tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {7 * i + 3}?" * (i + 1)}],
                                    tokenize=False, add_generation_prompt=True) for i in range(n)]


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
    rollout = HFRollout(max_new_tokens=10, temperature=temperature)
    out = rollout.generate(tiny.model, tiny.tokenizer, _prompts(tiny.tokenizer), num_generations=2)
    assert out.completion_ids.shape[0] == 6 and len(out.texts) == 6
    lp, _ = token_logprobs(tiny.model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, temperature)
    diff = ((lp - out.logprobs) * out.completion_mask).abs().max()
    assert float(diff) < 1e-4
    assert bool((out.logprobs * (1 - out.completion_mask)).eq(0).all())


def test_micro_batched_generation_concatenates(tiny):
    torch.manual_seed(0)
    out = HFRollout(max_new_tokens=6, micro_batch=4).generate(tiny.model, tiny.tokenizer, _prompts(tiny.tokenizer), 2)
    assert out.completion_ids.shape[0] == 6 and out.prompt_ids.shape[0] == 6
    assert set(out.completion_mask.unique().tolist()) <= {0, 1}
    assert int(out.prompt_mask.sum()) == sum(len(tiny.tokenizer(p, add_special_tokens=False)["input_ids"])
                                             for p in _prompts(tiny.tokenizer) for _ in range(2))


def test_invalid_settings_name_the_key():
    with pytest.raises(ValueError, match="max_new_tokens"):
        HFRollout(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        HFRollout(temperature=0)
