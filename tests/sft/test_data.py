"""The SFT stage's examples, settings and metric names, worked out by hand (rlexp.sft.data, method, metrics)."""

import pytest

from rlexp.config.schema import ConfigError
from rlexp.sft.data import demonstration_examples, keep_correct
from rlexp.sft.method import SFTMethod, check_node
from rlexp.sft.metrics import translate

ADD = {"id": "r1", "question": "What is 3 + 4?", "answer": "7", "metadata": {"expression": "3 + 4"}}
GIVEN = {"id": "r2", "question": "Say 5.", "answer": "5", "demonstration": "Five.\n#### 5", "metadata": {}}
NONE = {"id": "r3", "question": "Name a colour.", "answer": "red", "metadata": {}}


def test_demonstration_examples_by_hand():
    rows, counts = demonstration_examples([ADD, NONE, GIVEN], lambda q: f"<p>{q}</p>", "hash", "toy")
    # reasoning-gym's expression: "<expression> = <answer>" then the hash answer line; a column is used as written
    assert rows == [
        {"prompt": "<p>What is 3 + 4?</p>", "completion": "3 + 4 = 7\n#### 7", "record_id": "r1"},
        {"prompt": "<p>Say 5.</p>", "completion": "Five.\n#### 5", "record_id": "r2"},
    ]
    assert counts == {"sft/examples": 2.0, "sft/skipped": 1.0}  # r3 has no solution: skipped and counted


def test_demonstrations_in_the_tag_format():
    rows, _ = demonstration_examples([ADD], str, "tag", "toy")
    assert rows[0]["completion"] == "<think>3 + 4 = 7</think><answer>7</answer>"


def test_no_demonstration_at_all_names_the_dataset():
    with pytest.raises(ConfigError, match=r"^dataset=toy: none of its 2 training records has a demonstration"):
        demonstration_examples([NONE, NONE], str, "hash", "toy")


def test_rows_are_trl_prompt_completion_with_the_loss_on_the_completion_only(tiny):
    """TRL's SFTTrainer tokenises our rows as prompt + completion + EOS and masks the prompt: the trained tokens are
    exactly the completion's."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from rlexp.data.prompts import PromptFormat

    fmt = PromptFormat("Answer.", answer_format="hash")
    rows, _ = demonstration_examples([ADD], lambda q: fmt.render(tiny.tokenizer, q), "hash", "toy")
    rows = [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]
    args = SFTConfig(
        output_dir="/tmp/unused-sft", max_steps=1, report_to=[], use_cpu=True, bf16=False, gradient_checkpointing=False
    )
    ds = SFTTrainer(model=tiny.model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tiny.tokenizer)
    ex = ds.train_dataset[0]
    trained = [t for t, lab in zip(ex["input_ids"], ex["labels"]) if lab != -100]
    assert tiny.tokenizer.decode(trained) == "3 + 4 = 7\n#### 7" + tiny.tokenizer.eos_token
    prompt_ids = tiny.tokenizer(rows[0]["prompt"], add_special_tokens=False)["input_ids"]
    assert ex["input_ids"][: len(prompt_ids)] == prompt_ids and all(x == -100 for x in ex["labels"][: len(prompt_ids)])


def test_keep_correct_by_hand():
    groups = [[("a", 1.0), ("b", 1.0)], [("c", 0.0)], [("d", 0.5), ("e", 1.0)]]
    # group 0: a and b correct, first kept; group 1: none; group 2: e (d scores 0.5 < 1)
    assert keep_correct(groups, 1.0, 1, None, 0) == [(0, 0), (2, 1)]
    assert keep_correct(groups, 1.0, 2, None, 0) == [(0, 0), (0, 1), (2, 1)]
    assert keep_correct(groups, 0.5, 1, None, 0) == [(0, 0), (2, 0)]  # d passes at 0.5
    capped = keep_correct(groups, 1.0, 2, 2, 0)  # a seeded subset of 2 of the 3, in group order
    assert len(capped) == 2 and capped == sorted(capped) and set(capped) <= {(0, 0), (0, 1), (2, 1)}
    assert capped == keep_correct(groups, 1.0, 2, 2, 0)


@pytest.mark.parametrize(
    "node,message",
    [
        ({"data": "gold"}, "algorithm.data='gold': one of ['demonstrations', 'own_samples']"),
        ({"loss_type": "kl"}, "algorithm.loss_type='kl': TRL 1.16's SFT takes one of ['nll', 'dft']"),
        ({"teacher": "/m"}, "algorithm.teacher='/m': a teacher samples the examples of algorithm.data=own_samples"),
        ({"greedy": True}, "algorithm.samples_per_prompt=4: greedy decoding"),
        ({"num_prompts": 0}, "algorithm.num_prompts=0: must be an integer >= 1"),
        ({"max_examples": 0}, "algorithm.max_examples=0: must be >= 1"),
        ({"options": {"max_steps": 3}}, "algorithm.options.max_steps: set by rlexp"),
        ({"beta": 0.1}, "algorithm.beta is not a setting of the SFT stage (stage=sft sets the whole algorithm node"),
    ],
)
def test_bad_settings_name_the_key(node, message):
    with pytest.raises(ConfigError) as e:
        check_node(node)
    assert str(e.value).startswith(message)
    if "beta" not in node:  # the node's builder checks it too
        with pytest.raises(ConfigError):
            SFTMethod(**node)


def test_translate_by_hand():
    logs = {
        "loss": 2.5,
        "grad_norm": 1.0,
        "learning_rate": 1e-5,
        "mean_token_accuracy": 0.25,
        "entropy": 3.0,
        "num_tokens": 96.0,
        "epoch": 0.5,
        "new_key": 4.0,
        "note": "text",
    }
    assert translate(logs) == {
        "sft/loss": 2.5,
        "loss/total": 2.5,
        "grad_norm": 1.0,
        "lr": 1e-5,
        "sft/token_accuracy": 0.25,
        "entropy/mean": 3.0,
        "sft/tokens_seen": 96.0,
        "sft/epoch": 0.5,
        "trl/new_key": 4.0,
    }
    assert translate({"train_runtime": 1.0, "train_loss": 2.0}) == {}
    assert translate({"loss": float("nan"), "grad_norm": float("inf")}).keys() == {"sft/loss", "loss/total"}
