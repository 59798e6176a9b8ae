"""The solved-prompt filter (rlexp/samplers/solved_filter.py): solved prompts are passed over, never a short batch."""

from rlexp.samplers.feedback import GroupFeedback
from rlexp.samplers.shuffle import PromptSampler
from rlexp.samplers.solved_filter import SolvedPromptFilter


def _records(n):
    return [{"id": str(i), "question": f"q{i}"} for i in range(n)]


def _solved(records, flags):
    return GroupFeedback(records, [1.0 if f else 0.5 for f in flags], list(flags))


def _ids(batch):
    return [r["id"] for r in batch]


def test_solved_prompts_are_not_drawn_again():
    s = SolvedPromptFilter(_records(8), batch_size=2, seed=0)
    first = s.next_batch()
    s.observe(_solved(first, [True, False]))
    solved = first[0]["id"]
    drawn = [i for _ in range(12) for i in _ids(s.next_batch())]  # three more epochs' worth
    assert solved not in drawn
    assert set(drawn) == {str(i) for i in range(8)} - {solved}
    assert all(len(set(_ids(b))) == 2 for b in [s.next_batch() for _ in range(5)])


def test_without_observations_the_order_is_the_shuffle_order():
    plain, filt = PromptSampler(_records(6), 3, 1), SolvedPromptFilter(_records(6), 3, 1)
    assert [_ids(plain.next_batch()) for _ in range(4)] == [_ids(filt.next_batch()) for _ in range(4)]


def test_too_few_unsolved_left_fills_with_solved_ones():
    s = SolvedPromptFilter(_records(4), batch_size=3, seed=0)
    s.observe(_solved(_records(4)[:2], [True, True]))  # 2 unsolved < 3 per batch
    batch = s.next_batch()
    assert len(batch) == 3 and s.skipped == 0


def test_state_round_trip_resumes_the_same_draws():
    s = SolvedPromptFilter(_records(10), batch_size=2, seed=3)
    s.observe(_solved(s.next_batch(), [True, True]))
    s.next_batch()
    again = SolvedPromptFilter(_records(10), batch_size=2, seed=3)
    again.load_state_dict(s.state_dict())
    assert again.solved == s.solved
    assert [_ids(again.next_batch()) for _ in range(6)] == [_ids(s.next_batch()) for _ in range(6)]


class EvenIdsRight:
    """A test accuracy term: right on every completion of a prompt whose id ends in an even number, else wrong."""

    def __init__(self, weight: float = 1.0, **_ignored):
        self.weight = weight

    def __call__(self, samples):
        from rlexp.rewards.terms import TermResult

        return TermResult([float(int(s.record["id"].rsplit("-", 1)[-1]) % 2 == 0) for s in samples])


def test_a_run_observes_and_skips(tiny_cfg, tmp_path):
    import json

    from rlexp.runs.training import run

    overrides = [
        "sampler=skip_solved",
        "reward=accuracy",
        "reward.terms.accuracy._target_=tests.samplers.test_solved_filter.EvenIdsRight",
        "dataset.train_size=6",
        "trainer.max_steps=6",
        "trainer.max_new_tokens=4",
        "trainer.autocast=off",
    ]
    result = run(tiny_cfg(*overrides))
    assert 0 < result.metrics["sampler/solved_prompts"] < 6  # the even ids, solved in the first epoch
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    skipped = [r["sampler/skipped"] for r in rows if "sampler/skipped" in r]
    assert max(skipped) > 0  # from the second epoch on the solved prompts are passed over
