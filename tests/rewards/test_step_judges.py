"""Generative process judges (rlexp/rewards/step_judges.py) with hand-worked values: verdict parsing (valid,
malformed, missing), PRM-CoT's per-step verdicts, the per-step prompts, the logits reading against an unpadded
forward of the tiny model, the process reward over a judge (min aggregation, failures, SPARK's format gate, the
cache), and the judge-vs-rule agreement metric; two training steps with reward=judge_prm (long)."""

import math

import pytest
import torch

from rlexp.rewards.judges import compile_pattern
from rlexp.rewards.process import ProcessReward
from rlexp.rewards.step_judges import (
    COT_PATTERN,
    STEP_VERDICTS,
    VERDICT_PATTERN,
    StepJudge,
    parse_cot_verdicts,
    parse_step_verdict,
)
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run
from rlexp.trainer.metrics import batch_metrics
from tests.algorithms.batches import make_batch

VERDICT = compile_pattern(VERDICT_PATTERN, "p")
COT = compile_pattern(COT_PATTERN, "p")


def test_step_verdict_parsing_valid_malformed_missing():
    assert parse_step_verdict("Verdict: Yes", VERDICT, STEP_VERDICTS) == 1.0
    assert parse_step_verdict(" no, the sum is wrong", VERDICT, STEP_VERDICTS) == 0.0
    assert parse_step_verdict("Yes... actually no", VERDICT, STEP_VERDICTS) == 0.0  # the last verdict counts
    assert parse_step_verdict("Verdict: maybe", VERDICT, STEP_VERDICTS) is None  # malformed
    assert parse_step_verdict("", VERDICT, STEP_VERDICTS) is None  # missing
    assert parse_step_verdict("yesterday", VERDICT, STEP_VERDICTS) is None  # a word boundary, not a prefix


def test_cot_verdicts_per_step_by_hand():
    reply = "Step 1: 2 + 3 = 5, correct.\nStep 1: correct\nStep 2: incorrect\nStep 3: Correct\nStep 9: wrong"
    assert parse_cot_verdicts(reply, 3, COT, STEP_VERDICTS) == [1.0, 0.0, 1.0]  # step 9 is out of range: ignored
    assert parse_cot_verdicts("Step 1: correct\nStep 1: incorrect", 1, COT, STEP_VERDICTS) == [0.0]  # revised
    assert parse_cot_verdicts("Step 1: correct\nStep 3: correct", 3, COT, STEP_VERDICTS) is None  # step 2 missing
    assert parse_cot_verdicts("all good", 2, COT, STEP_VERDICTS) is None


def scripted(replies: dict, log: list | None = None):
    """A judge whose reply depends on the step to check (the text after 'Step to check:')."""

    def generate(texts):
        out = []
        for t in texts:
            if log is not None:
                log.append(t)
            step = t.split("Step to check:\n", 1)[1].split("\n\n", 1)[0] if "Step to check:" in t else t
            out.append(next((r for k, r in replies.items() if k in step), "Verdict: ???"))
        return out

    return generate


def test_per_step_prompts_carry_the_earlier_steps():
    judge = StepJudge(generate=lambda t: ["Yes"] * len(t))
    prompts = judge.step_prompts("What is 2+3+4?", ["2 + 3 = 5", "5 + 4 = 9"])
    assert "Earlier steps:\n(none)" in prompts[0] and "Step to check:\n2 + 3 = 5" in prompts[0]
    assert "Earlier steps:\n2 + 3 = 5" in prompts[1] and "Step to check:\n5 + 4 = 9" in prompts[1]
    cot = StepJudge(mode="cot", generate=lambda t: [""] * len(t))
    assert "Step 1: 2 + 3 = 5\nStep 2: 5 + 4 = 9" in cot.cot_prompt("q", ["2 + 3 = 5", "5 + 4 = 9"])


def test_per_step_parse_mode_scores_rows_and_fails_a_row_with_an_unparsed_step():
    judge = StepJudge(generate=scripted({"= 5": "Yes", "= 10": "No", "= 9": "Yes"}), reply_prefix="Verdict:")
    rows = judge.score_batch(["q", "q", "q"], [["2 + 3 = 5", "5 + 4 = 9"], ["2 + 3 = 5", "5 + 5 = 10"], ["hmm"]])
    assert rows == [[1.0, 1.0], [1.0, 0.0], None]  # "hmm" gets "Verdict: ???": unparsed, the row fails
    assert judge.stats == {"asked": 5.0, "unparsed": 1.0, "unparsed_rows": 1.0}


def test_cot_mode_one_reply_per_row():
    replies = iter(["Step 1: correct\nStep 2: incorrect", "I cannot tell"])
    judge = StepJudge(mode="cot", generate=lambda texts: [next(replies) for _ in texts])
    assert judge.score_batch(["q", "q"], [["a", "b"], ["c"]]) == [[1.0, 0.0], None]
    assert judge.stats == {"asked": 2.0, "unparsed": 1.0, "unparsed_rows": 1.0}


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="StepJudge.mode"):
        StepJudge(mode="tree", generate=list)
    with pytest.raises(ValueError, match="score_by=logits.*mode=per_step"):
        StepJudge(mode="cot", score_by="logits", judge_model="initial")
    with pytest.raises(ValueError, match="StepJudge.step_template"):
        StepJudge(step_template="{question} {oops}", generate=list)
    with pytest.raises(ValueError, match="cot_pattern.*two groups"):
        StepJudge(cot_pattern=r"step (\d+)", generate=list)
    with pytest.raises(ValueError, match="judge_model is not set"):
        StepJudge()
    with pytest.raises(ValueError, match="require_answer"):
        ProcessReward(scorer=StepJudge(generate=list), require_answer="latex")


def test_logits_reading_matches_an_unpadded_forward(tiny):
    judge = StepJudge(judge_model="initial", score_by="logits", batch_size=2)
    judge.bind(tiny.model, tiny.tokenizer)
    texts = ["Is 2 + 2 = 4 right?", "A much longer question about whether 17 times 3 is 51, asked at length."]
    got = judge.verdict_probabilities(texts)  # one left-padded batch of two
    model, tok = judge.backend.model()
    yes, no = tok.encode(" Yes", add_special_tokens=False)[0], tok.encode(" No", add_special_tokens=False)[0]
    for text, p in zip(texts, got):
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False) + "Verdict:"  # fmt: skip
        ids = tok(rendered, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            logits = model(**ids).logits[0, -1].float()
        want = torch.softmax(logits[[yes, no]], -1)[0].item()  # P(Yes) / (P(Yes) + P(No))
        assert p == pytest.approx(want, abs=1e-4)
    rows = judge.score_batch(["q"], [["a", "b", "c"]])
    assert len(rows[0]) == 3 and all(0.0 < x < 1.0 for x in rows[0]) and judge.stats["unparsed"] == 0.0
    with pytest.raises(ValueError, match="good_token"):
        StepJudge(judge_model="initial", score_by="logits", good_token=" Yes indeed", batch_size=1)._token_id(
            tok, " Yes indeed", "good_token"
        )


def _sample(completion: str) -> Sample:
    return Sample("p", completion, {"question": "What is 2 + 3 + 4?", "answer": "9"}, 0, 3, False)


def test_process_reward_over_a_judge_min_failures_format_gate_and_cache():
    calls = []
    judge = StepJudge(generate=scripted({"= 5": "Yes", "= 10": "No", "= 9": "Yes", "####": "Yes"}, calls))
    term = ProcessReward(scorer=judge, split="lines", aggregate="min", require_answer="hash")
    samples = [
        _sample("2 + 3 = 5\n5 + 4 = 9\n#### 9"),  # steps 1, 1, 1 -> min 1
        _sample("2 + 3 = 5\n5 + 5 = 10\n#### 10"),  # 1, 0, 1 -> min 0
        _sample("2 + 3 = 5\nthinking\n#### 9"),  # "thinking" is unparsed: the row fails
        _sample("2 + 3 = 5\n5 + 4 = 9"),  # no "#### answer": gated by the format constraint, never judged
    ]
    out = term(samples)
    assert out.scores == [1.0, 0.0, 0.0, 0.0]
    assert out.failures == [False, False, True, False]
    assert out.missing == [False, False, False, True]
    assert out.metrics["format_gated_frac"] == 0.25
    assert out.metrics["judge_asked"] == 9.0 and out.metrics["judge_unparsed"] == 1.0
    assert len(calls) == 9  # 3 steps x 3 judged rows; the gated row cost nothing
    again = term(samples[:2])
    assert again.scores == [1.0, 0.0] and again.metrics["cache_hits"] == 2.0 and len(calls) == 9


def test_process_reward_forwards_the_policy_to_its_judge(tiny):
    term = ProcessReward(scorer=StepJudge(judge_model="initial", score_by="logits"), split="lines")
    term.bind_policy(tiny.model, tiny.tokenizer)
    copy_ = term.scorer.backend.model()[0]
    assert copy_ is not tiny.model and not any(p.requires_grad for p in copy_.parameters())
    out = term([_sample("2 + 3 = 5\n#### 5")])
    assert out.failures == [False] and 0.0 < out.scores[0] < 1.0


def test_rule_agreement_metric_by_hand():
    # columns: accuracy, prm; rows: (1, .8) agree, (0, .7) disagree, (1, .2) disagree, (0, .1) agree, (1, .9) failed
    batch = make_batch(None, [0, 0, 0, 0, 0], terms=[[1, 0.8], [0, 0.7], [1, 0.2], [0, 0.1], [1, 0.9]])
    batch.reward_names = ["accuracy", "prm"]
    batch.reward_failures[4, 1] = True
    m = batch_metrics(batch, "accuracy", ["prm"])
    assert m["reward/prm/rule_agreement"] == 0.5  # 2 of the 4 scored rows
    assert "reward/prm/rule_agreement" not in batch_metrics(batch, "accuracy")


@pytest.mark.long
def test_reward_judge_prm_trains_two_steps_and_logs_the_judge(tiny_cfg):
    cfg = tiny_cfg("reward=judge_prm", "reward.terms.prm.require_answer=null", "trainer.autocast=off")
    m = run(cfg).metrics
    assert m["reward/prm/judge_asked"] > 0 and m["reward/prm/judge_unparsed"] == 0.0  # logits: never unparsed
    assert 0.0 < m["reward/prm/mean"] < 1.0 and m["reward/prm/failures"] == 0.0
    assert 0.0 <= m["reward/prm/rule_agreement"] <= 1.0 and math.isfinite(m["loss/total"])
