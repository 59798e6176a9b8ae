"""Paraphrase consistency of an evaluation (rlexp/evaluation/paraphrase.py): by hand, with a scripted rollout in both
evaluators (greedy held-out and benchmarks), and as a training metric on the tiny model."""

import json
import re
from types import SimpleNamespace

import pytest
import torch

from rlexp.data.prompts import PromptFormat
from rlexp.evaluation.benchmarks import Benchmark
from rlexp.evaluation.checkers import AnswerChecker, AnswerExtractor
from rlexp.evaluation.greedy import GreedyEvaluator
from rlexp.evaluation.paraphrase import agreement, majority, paraphrased_records
from rlexp.evaluation.runner import BenchmarkEvaluator, EvalSettings
from rlexp.evaluation.sources import HubSource
from rlexp.rewards.terms import Accuracy
from rlexp.runs.training import run

EQ = lambda a, b, i: a == b


def test_majority_and_agreement_by_hand():
    assert majority(["3", None, "4", "4"], lambda a, b: a == b) == "4"
    assert majority([None, None], lambda a, b: a == b) is None
    # q0: 3 vs 3 agree; q1: majority 4 vs 5 disagree; q2: a missing answer agrees with nothing; q3: None vs None
    original = [["3"], ["4", "4", "5"], ["7"], [None]]
    reworded = [["3"], ["5", "5", "4"], [None], [None]]
    assert agreement(original, reworded, EQ) == [1.0, 0.0, 0.0, 0.0]


def test_paraphrased_records_keep_everything_but_the_question():
    recs = [{"id": "a", "question": "Calculate 2 + 3.", "answer": "5"}]
    (once,) = paraphrased_records(recs, 1, "template", seed=0)
    assert once[0]["answer"] == "5" and once[0]["question"] != recs[0]["question"] and "2 + 3" in once[0]["question"]
    assert len(paraphrased_records(recs, 3, "template", 0)) == 3


class WordingRollout:
    """Answers the sum right when the question starts with 'Calculate', else one more (the answer depends on the
    wording, as an inconsistent model's does)."""

    max_new_tokens = 8

    def generate(self, model, tokenizer, texts, num_generations=1, greedy=False, max_new_tokens=None):
        outs = []
        for t in texts:
            a, b = map(int, re.findall(r"(\d+) \+ (\d+)", t)[0])
            right = "user\nCalculate" in t
            outs.append(f"#### {a + b if right else a + b + 1}")
        outs = [o for o in outs for _ in range(num_generations)]
        n = len(outs)
        return SimpleNamespace(
            texts=outs,
            completion_mask=torch.ones(n, 3, dtype=torch.long),
            truncated=torch.zeros(n, dtype=torch.bool),
        )


def test_greedy_evaluator_logs_accuracy_and_agreement_on_paraphrases(tiny):
    fmt = PromptFormat(answer_format="hash", system_prompt="sys", instruction="")
    recs = [{"id": f"r{i}", "question": f"Calculate {i} + 2.", "answer": str(i + 2), "scorer": "math"} for i in (1, 5)]
    ev = GreedyEvaluator(recs, fmt, WordingRollout(), Accuracy(), paraphrases=2, seed=0)
    m = ev(None, tiny.tokenizer, 0)
    # the questions start with "Calculate": right; every paraphrase rewords it: wrong, and disagrees
    assert m["eval/accuracy"] == 1.0
    assert m["eval/paraphrase/accuracy"] == 0.0 and m["eval/paraphrase/agreement"] == 0.0
    off = GreedyEvaluator(recs, fmt, WordingRollout(), Accuracy())
    assert "eval/paraphrase/agreement" not in off(None, tiny.tokenizer, 0)
    with pytest.raises(ValueError, match="eval.paraphrases=-1"):
        GreedyEvaluator(recs, fmt, WordingRollout(), Accuracy(), paraphrases=-1)


def test_benchmark_evaluator_logs_paraphrase_metrics(tiny, tmp_path):
    path = tmp_path / "sums.jsonl"
    rows = [{"question": f"Calculate {i} + 2.", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in (1, 5)]
    path.write_text("\n".join(json.dumps(r) for r in rows))  # GSM8K's schema
    fmt = PromptFormat(answer_format="hash", system_prompt="sys", instruction="")
    bench = Benchmark(
        "sums",
        HubSource(parser="gsm8k", data_files=str(path)),
        fmt,
        AnswerExtractor(answer_format="hash"),
        AnswerChecker(scorer="math"),
    )
    ev = BenchmarkEvaluator({"sums": bench}, WordingRollout(), EvalSettings(n=2, paraphrases=1, bootstrap=0))
    m = ev.evaluate(tiny.model, tiny.tokenizer).metrics
    assert m["eval/sums/accuracy"] == 1.0
    assert m["eval/sums/paraphrase/accuracy"] == 0.0 and m["eval/sums/paraphrase/agreement"] == 0.0


def test_paraphrase_agreement_is_a_training_metric(tiny_cfg, tmp_path):
    run(tiny_cfg("eval.size=4", "eval.paraphrases=1", "trainer.eval_every=2"))
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/paraphrase/agreement" in logged[-1] and 0.0 <= logged[-1]["eval/paraphrase/agreement"] <= 1.0
