"""Reward-model consistency on Contrast Instructions (rlexp.evaluation.rm_consistency): the file schema and its errors,
the response/instruction consistency metrics by hand, any reward term as the RM (a score table, a generate= judge, a
tiny random sequence-classification RM through the command line), and RewardFusion's similarity-weighted rewards by
hand."""

import json

import pytest
import torch

from rlexp.evaluation.rm_consistency import (
    SAMPLE,
    RewardFusion,
    bag_of_words,
    consistency_metrics,
    load_contrast_pairs,
    main,
    rm_consistency,
)
from rlexp.rewards.judges import GenerativeJudge
from rlexp.rewards.terms import RewardTerm, Sample, TermResult


def test_the_shipped_sample_loads_in_the_benchmark_schema():
    rows = load_contrast_pairs(SAMPLE)
    assert len(rows) == 6
    assert all(r["query"] != r["retrieval"] and r["query_response_k"] != r["retrieval_response_k"] for r in rows)


def test_bad_files_name_the_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"query": "a", "retrieval": "b", "query_response_k": "c"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl line 1: field 'retrieval_response_k' is missing"):
        load_contrast_pairs(str(path))
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="line 1: not JSON"):
        load_contrast_pairs(str(path))
    listed = tmp_path / "list.json"
    listed.write_text(
        json.dumps([{"query": "a", "retrieval": "b", "query_response_k": "", "retrieval_response_k": "d"}])
    )
    with pytest.raises(ValueError, match="item 0: field 'query_response_k'"):
        load_contrast_pairs(str(listed))


def test_consistency_metrics_by_hand():
    # (r11, r12, r21, r22) = (r(I1,R1), r(I1,R2), r(I2,R1), r(I2,R2))
    a = (2.0, 1.0, 0.0, 3.0)  # all four comparisons hold
    b = (1.0, 2.0, 1.0, 0.0)  # none holds; r11 = r21 is a tie
    m = consistency_metrics([a, b, (1.0, None, 0.0, 0.0)])
    assert m["pairs"] == 3 and m["scored"] == 2 and m["unscored"] == 1
    assert m["c_res"] == 0.5 and m["c_ins"] == 0.5  # 2 of 4 comparisons each
    assert m["c_res_query"] == 0.5 and m["c_ins_query"] == 0.5 and m["c_res_both"] == 0.5 and m["c_ins_both"] == 0.5
    assert m["tie_frac"] == 1 / 8
    # margins: res ((2−1) + (3−0) + (1−2) + (0−1)) / 4 = 0.5; ins ((2−0) + (3−1) + (1−1) + (0−2)) / 4 = 0.5
    assert m["margin_res"] == 0.5 and m["margin_ins"] == 0.5
    # one direction only: res holds for the query (2 > 1) but not the retrieval (0 > 3 fails)
    half = consistency_metrics([(2.0, 1.0, 3.0, 0.0)])
    assert half["c_res"] == 0.5 and half["c_res_query"] == 1.0 and half["c_res_both"] == 0.0
    assert half["c_ins"] == 0.0  # 2 > 3 and 0 > 1 both fail


class Table(RewardTerm):
    """A reward model given as a table (instruction, response) → score; a missing pair is a failure."""

    def __init__(self, table):
        super().__init__(1.0)
        self.table = table

    def __call__(self, samples):
        got = [self.table.get((s.prompt, s.completion)) for s in samples]
        return TermResult([0.0 if v is None else v for v in got], [v is None for v in got])


def test_any_reward_term_as_the_rm_by_hand():
    ex = [{"query": "I1", "retrieval": "I2", "query_response_k": "R1", "retrieval_response_k": "R2"},
          {"query": "J1", "retrieval": "J2", "query_response_k": "S1", "retrieval_response_k": "S2"}]  # fmt: skip
    table = {
        ("I1", "R1"): 0.9,
        ("I1", "R2"): 0.1,
        ("I2", "R1"): 0.95,
        ("I2", "R2"): 0.5,
        ("J1", "S1"): 0.3,
        ("J1", "S2"): 0.4,
        ("J2", "S1"): 0.2,
    }  # fmt: skip  (J2, S2) fails
    m = rm_consistency(Table(table), ex)
    # first pair: res 0.9 > 0.1, 0.5 > 0.95 ✗; ins 0.9 > 0.95 ✗, 0.5 > 0.1 ✓; the second pair is unscored
    assert m["scored"] == 1 and m["unscored"] == 1
    assert (m["c_res"], m["c_ins"], m["c_res_query"], m["c_ins_query"]) == (0.5, 0.5, 1.0, 0.0)

    # a generative judge (the sample's last example, a scripted judge that knows the arithmetic) is consistent
    def judge(prompts):
        out = []
        for p in prompts:
            question, answer = p.split("Answer:", 1)
            good = ("multiplied" in question and "is 48" in answer) or ("divided" in question and "is 3." in answer)
            out.append(" 9" if good else " 2")
        return out

    last = load_contrast_pairs(SAMPLE)[-1:]
    m = rm_consistency(GenerativeJudge(generate=judge), last)
    assert m["c_res_both"] == 1.0 and m["c_ins_both"] == 1.0 and m["tie_frac"] == 0.0


def test_reward_fusion_by_hand():
    assert bag_of_words(["a b a", "b c"]).tolist() == [[2.0, 1.0, 0.0], [0.0, 1.0, 1.0]]
    vectors = {"x|r": (1.0, 0.0), "c1|a": (0.95, 0.31225), "c2|b": (0.0, 1.0), "c3|c": (0.6, 0.8)}

    def embed(texts):
        return torch.tensor([vectors[t] for t in texts])

    corpus = [("c1", "a"), ("c2", "b"), ("c3", "c")]
    fusion = RewardFusion(corpus, embed=embed, top_k=5, threshold=0.9, template="{instruction}|{response}")
    # cos(x|r, c1|a) = 0.95 ≥ 0.9: a neighbour; c3|c: 0.6 and c2|b: 0 are below the threshold
    assert fusion.neighbours([("x", "r")]) == [[(0, pytest.approx(0.95, abs=1e-4))]]
    table = Table({("x", "r"): 1.0, ("c1", "a"): 3.0, ("c2", "b"): -5.0, ("c3", "c"): 7.0})
    res = fusion.bind(table)([Sample("x", "r", {}, 0, 1, False)])
    # (1·1.0 + 0.95·3.0) / (1 + 0.95) = 3.85 / 1.95 = 1.974359
    assert res.scores == pytest.approx([3.85 / 1.95], abs=1e-4) and fusion.stats["fused_frac"] == 1.0
    assert RewardFusion(corpus, embed=embed, top_k=0).neighbours([("x", "r")]) == [[]]
    with pytest.raises(ValueError, match="top_k"):
        RewardFusion(corpus, top_k=-1)


@pytest.mark.long  # ~4 s: a tiny random RM loaded and run (default suite budget)
def test_the_command_line_on_a_tiny_random_rm(tmp_path, capsys):
    from tests.rewards.test_reward_model import save_tiny_rm

    path = save_tiny_rm(tmp_path / "rm", 0)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"instruction": "What is 12 multiplied by 4?", "response": "48"}) + "\n")
    m = main(["--model", path, "--device", "cpu", "--fusion-corpus", str(corpus)])
    assert m["scored"] == 6 and 0.0 <= m["c_res"] <= 1.0 and 0.0 <= m["c_ins"] <= 1.0
    assert json.loads(capsys.readouterr().out)["pairs"] == 6
