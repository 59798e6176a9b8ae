"""A step never holds a prompt twice (issue 16): a training split smaller than a step is refused in one line naming
trainer.prompts_per_step and the split's size, and a step that straddles the end of an epoch takes no prompt it
already holds, while every epoch still holds every prompt once."""

import json

import pytest

from rlexp.config.schema import ConfigError
from rlexp.samplers.shuffle import PromptSampler


def _records(n):
    return [{"id": str(i), "question": f"q{i}"} for i in range(n)]


def _ids(batch):
    return [r["id"] for r in batch]


def test_a_split_smaller_than_a_step_is_refused():
    with pytest.raises(ConfigError) as e:
        PromptSampler(_records(5), batch_size=8, seed=0)
    assert str(e.value) == (
        "trainer.prompts_per_step=8 is more than the 5 prompts of the training split, so a step would hold some "
        "twice; lower trainer.prompts_per_step or use more data (dataset.train_size, a larger file)"
    )
    PromptSampler(_records(8), batch_size=8, seed=0)  # exactly one step per epoch is fine


@pytest.mark.parametrize("n,batch", [(10, 4), (7, 3), (9, 8), (5, 4), (11, 6)])
def test_no_prompt_twice_in_a_batch_across_epoch_boundaries(n, batch):
    for seed in range(20):
        s = PromptSampler(_records(n), batch_size=batch, seed=seed)
        stream = []
        for _ in range(4 * n):  # many epoch boundaries, at every offset
            ids = _ids(s.next_batch())
            assert len(set(ids)) == len(ids), (seed, ids)
            stream += ids
        for e in range(len(stream) // n):  # each epoch still holds each prompt once
            assert sorted(stream[e * n : (e + 1) * n]) == sorted(str(i) for i in range(n)), (seed, e)


def test_resume_after_a_straddling_batch_repeats_the_same_order():
    s1 = PromptSampler(_records(10), batch_size=4, seed=3)
    full = [_ids(s1.next_batch()) for _ in range(12)]
    for cut in range(1, 12):
        s2 = PromptSampler(_records(10), batch_size=4, seed=3)
        for _ in range(cut):
            s2.next_batch()
        s3 = PromptSampler(_records(10), batch_size=4, seed=3)
        s3.load_state_dict(json.loads(json.dumps(s2.state_dict())))  # checkpoints store it as JSON
        assert [_ids(s3.next_batch()) for _ in range(12 - cut)] == full[cut:], cut


def test_a_checkpoint_from_before_the_carry_still_loads():
    s = PromptSampler(_records(10), batch_size=4, seed=0)
    s.load_state_dict({"consumed": 4})
    assert len(set(_ids(s.next_batch()))) == 4


def test_training_on_a_split_smaller_than_a_step_stops_before_training(tiny_cfg, tmp_path):
    from rlexp.runs.training import run

    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(5))
    )
    cfg = tiny_cfg("dataset=local", f"dataset.path={path}", "dataset.eval_size=1", "trainer.prompts_per_step=8")
    with pytest.raises(ConfigError, match=r"^trainer\.prompts_per_step=8 is more than the 4 prompts of the training"):
        run(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
