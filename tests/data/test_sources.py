import pytest

from rlexp.data.prompts import PromptFormat
from rlexp.data.sources import gsm8k, parse_gsm8k_answer, reasoning_gym_task
from rlexp.samplers.shuffle import PromptSampler

FIXTURE = "tests/fixtures/data/gsm8k_sample.jsonl"


def test_gsm8k_parser_on_local_file_in_real_schema():
    splits = gsm8k(seed=0, data_files=FIXTURE, eval_size=1)
    answers = sorted(r["answer"] for r in splits.train + splits.eval)
    assert answers == ["10", "3545", "72"]  # thousands separator removed
    assert all(r["scorer"] == "math" for r in splits.train)


def test_gsm8k_answer_without_marker_names_the_row(tmp_path):
    bad = tmp_path / "g.jsonl"
    bad.write_text('{"question": "q1", "answer": "x #### 1"}\n{"question": "q2", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match="row 2"):
        gsm8k(seed=0, data_files=str(bad), eval_size=1)
    assert parse_gsm8k_answer("so #### -1,234") == "-1234"


def test_reasoning_gym_splits_are_deterministic_and_disjoint():
    a = reasoning_gym_task(
        "basic_arithmetic",
        seed=3,
        train_size=50,
        eval_size=20,
        options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    )
    b = reasoning_gym_task(
        "basic_arithmetic",
        seed=3,
        train_size=50,
        eval_size=20,
        options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    )
    assert [r["question"] for r in a.train] == [r["question"] for r in b.train]
    assert len(a.train) == 50 and len(a.eval) == 20
    assert not {r["question"] for r in a.train} & {r["question"] for r in a.eval}
    c = reasoning_gym_task("basic_arithmetic", seed=4, train_size=50, eval_size=20)
    assert [r["question"] for r in a.train] != [r["question"] for r in c.train]


def test_unknown_reasoning_gym_task_names_the_key():
    with pytest.raises(ValueError, match="dataset.name='no_such_task'"):
        reasoning_gym_task("no_such_task", seed=0, train_size=5, eval_size=1)


def test_sampler_order_is_seeded_and_resumable():
    records = [{"question": str(i)} for i in range(10)]
    s1 = PromptSampler(records, batch_size=4, seed=1)
    first = [s1.next_batch() for _ in range(5)]  # crosses two epoch boundaries
    s2 = PromptSampler(records, batch_size=4, seed=1)
    s2.next_batch()
    s2.next_batch()
    s3 = PromptSampler(records, batch_size=4, seed=1)
    s3.load_state_dict(s2.state_dict())
    assert [s3.next_batch() for _ in range(3)] == first[2:]
    epoch0 = [r["question"] for b in first for r in b][:10]
    assert sorted(epoch0) == sorted(r["question"] for r in records)  # each record once per epoch


def test_prompt_uses_chat_template_with_system_prompt():
    class Tok:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages) + (
                "|assistant:" if add_generation_prompt else ""
            )

    fmt = PromptFormat(system_prompt="SYS", instruction="End with ####.")
    assert fmt.render(Tok(), "1+1?") == "system:SYS|user:1+1?\nEnd with ####.|assistant:"
