"""Consistency rates on hand-built completions whose reasoning does / does not support the stated
answer. The re-derivation plumbing uses a controlled judge that finishes from the reasoning it is
given (the last number in it); the real-model checks run SmolLM2-135M (slow)."""

import math
import re
from types import SimpleNamespace

import pytest
import torch

from rlexp.evaluation.checkers import AnswerChecker, AnswerExtractor
from rlexp.evaluation.consistency import ConsistencyMeter, first_answer

NUM = re.compile(r"-?\d+")


class LastNumberJudge:
    """Continues a cut completion with the last number of the reasoning it was given, then states a
    different answer (which must be ignored: the judge is held to its first answer)."""

    def __init__(self):
        self.seen = []

    def generate(self, model, tokenizer, texts, num_generations=1, greedy=False, max_new_tokens=None):
        assert greedy and num_generations == 1
        self.seen.extend(texts)
        outs = []
        for t in texts:
            reasoning = t.split("PROMPT|", 1)[1]
            nums = NUM.findall(reasoning)
            v = nums[-1] if nums else "0"
            if t.rstrip().endswith("####"):
                outs.append(f" {v}\n#### 999")
            elif t.endswith("<answer>"):
                outs.append(f"{v}</answer> <answer>999</answer>")
            else:
                outs.append(f"{v}}} or \\boxed{{999}}")
        return SimpleNamespace(texts=outs)


def measure(completions, fmt, judge=None, **kw):
    meter = ConsistencyMeter(judge="policy", likelihood=False, **kw)
    ex, ch = AnswerExtractor(fmt), AnswerChecker("math")
    return meter.measure(
        None,
        None,
        ["PROMPT|"] * len(completions),
        completions,
        fmt,
        ex.strict,
        lambda a, b, i: ch.equivalent(a, b, {}),
        rollout=judge or LastNumberJudge(),
    )


def test_rederivation_hash():
    comps = [
        "3 + 4 = 7.\n#### 7",  # supported
        "3 + 4 = 7.\n#### 9",  # contradicted by its own reasoning
        "I have no idea.",  # no answer: inconsistent, counted separately
        "12 / 16 = 3/4 so 0.75\n#### 0.75",
    ]
    judge = LastNumberJudge()
    m, per = measure(comps, "hash", judge)
    assert [p["rederive_consistent"] for p in per] == [True, False, False, False]
    assert per[1]["stated"] == "9" and per[1]["rederived"] == "7"
    assert per[2]["stated"] is None and "rederived" not in per[2]
    # the judge saw the reasoning without the stated answer, and only the completions with one
    assert judge.seen == ["PROMPT|3 + 4 = 7.\n####", "PROMPT|3 + 4 = 7.\n####", "PROMPT|12 / 16 = 3/4 so 0.75\n####"]
    assert m["consistency/rederive_rate"] == pytest.approx(1 / 4)
    assert m["consistency/no_answer_frac"] == pytest.approx(1 / 4)
    assert m["consistency/measured"] == 4
    assert "consistency/likelihood_mean" not in m


def test_rederivation_boxed_and_tag_and_equivalent_forms():
    boxed = ["6 * 7 = 42, so \\boxed{42}", "6 * 7 = 42, so \\boxed{24}", "1/2 + 1/4 = 3/4 so \\boxed{\\frac{3}{4}}"]
    m, per = measure(boxed, "boxed")
    # the third: the judge writes "4" (last number), stated 3/4 -> inconsistent
    assert [p["rederive_consistent"] for p in per] == [True, False, False]
    tag = ["<think>2 + 2 = 4</think><answer>4</answer>", "<think>2 + 2 = 4</think><answer>5</answer>"]
    m, per = measure(tag, "tag")
    assert [p["rederive_consistent"] for p in per] == [True, False]
    assert m["consistency/rederive_rate"] == 0.5


def test_max_completions_caps_the_measurement():
    m, per = measure(["1\n#### 1"] * 5, "hash", max_completions=2)
    assert m["consistency/measured"] == 2 and len(per) == 2


def test_first_answer_holds_the_judge_to_its_first_answer():
    assert first_answer("x\n####", " 7\n#### 8") == "x\n#### 7"
    assert first_answer("so \\boxed{", "\\frac{1}{2}} and \\boxed{3}") == "so \\boxed{\\frac{1}{2}}"
    assert first_answer("<answer>", "4</answer><answer>5</answer>") == "<answer>4</answer>"


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="consistency.judge"):
        ConsistencyMeter(judge="oracle")
    with pytest.raises(ValueError, match="consistency.threshold"):
        ConsistencyMeter(threshold=2)
    with pytest.raises(RuntimeError, match="no reference model"):
        ConsistencyMeter().judge_model(None)


@pytest.fixture(scope="module")
def tiny():
    from omegaconf import OmegaConf

    from rlexp.config.paths import CONF_DIR
    from rlexp.models.loading import load_model

    return load_model(OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml"), torch.device("cpu"))


def test_likelihood_counts_missing_answers_as_inconsistent(tiny):
    comps = ["3 + 4 = 7\n#### 7", "no answer", "so \\boxed{12}"]
    prompts = ["Q: 3 + 4?\n", "Q: ?\n", "Q: 3 * 4?\n"]
    ex, ch = AnswerExtractor("auto"), AnswerChecker("math")
    eq = lambda a, b, i: ch.equivalent(a, b, {})
    for threshold, rate in ((0.0, 2 / 3), (1.0, 0.0)):
        meter = ConsistencyMeter(judge="policy", rederive=False, threshold=threshold)
        m, per = meter.measure(tiny.model, tiny.tokenizer, prompts, comps, "auto", ex.strict, eq)
        assert m["consistency/likelihood_rate"] == pytest.approx(rate)
        assert per[1]["likelihood"] is None
        assert all(0 < p["likelihood"] <= 1 for p in (per[0], per[2]))
        assert m["consistency/likelihood_mean"] == pytest.approx((per[0]["likelihood"] + per[2]["likelihood"]) / 2)
        assert m["consistency/no_answer_frac"] == pytest.approx(1 / 3)
    none = ConsistencyMeter(judge="policy", rederive=False).measure(
        tiny.model, tiny.tokenizer, ["q"], ["x"], "hash", ex.strict, eq
    )[0]
    assert math.isnan(none["consistency/likelihood_mean"]) and none["consistency/likelihood_rate"] == 0


def test_bind_reuses_a_frozen_reference_or_freezes_a_copy(tiny):
    from rlexp.algorithms.regularisers.reference import ReferenceModel

    meter = ConsistencyMeter()
    ref = ReferenceModel(tiny.model, "frozen")
    meter.bind(tiny.model, ref)
    assert meter.judge_model(tiny.model) is ref.model
    meter.bind(tiny.model, ReferenceModel(tiny.model, "ema"))  # an EMA reference moves: not a frozen judge
    judge = meter.judge_model(tiny.model)
    assert judge is not tiny.model and not any(p.requires_grad for p in judge.parameters())
    w = next(tiny.model.parameters())
    before = next(judge.parameters()).clone()
    with torch.no_grad():
        w.add_(1.0)
    assert torch.equal(next(judge.parameters()), before)  # the copy stays at the initial weights
    with torch.no_grad():
        w.sub_(1.0)
    policy_meter = ConsistencyMeter(judge="policy")
    policy_meter.bind(tiny.model, ref)
    assert policy_meter.judge_model(tiny.model) is tiny.model


@pytest.mark.slow
def test_real_model_rederives_and_prefers_supported_answers():
    """SmolLM2-135M-Instruct as the judge: reasoning that leads to 68 / 42 makes it re-derive 68 / 42,
    and it gives the supported answer a far higher likelihood than a contradicted one."""
    from omegaconf import OmegaConf

    from rlexp.config.paths import CONF_DIR
    from rlexp.data.prompts import PromptFormat
    from rlexp.models.loading import load_model

    lm = load_model(OmegaConf.load(f"{CONF_DIR}/model/smollm2_135m.yaml"), torch.device("cpu"))
    hash_prompt = OmegaConf.load(f"{CONF_DIR}/prompt/hash.yaml")
    pf = PromptFormat(hash_prompt.system_prompt, hash_prompt.instruction, "hash")
    cases = [
        ("What is 23 + 45?", "23 + 45 = 68.\n#### 68", True),
        ("What is 23 + 45?", "23 + 45 = 68.\n#### 91", False),
        ("What is 6 * 7?", "6 * 7 = 42, so the answer is \\boxed{42}", True),
        ("What is 6 * 7?", "6 * 7 = 42, so the answer is \\boxed{24}", False),
    ]
    prompts = [pf.render(lm.tokenizer, q) for q, _, _ in cases]
    ex, ch = AnswerExtractor("auto"), AnswerChecker("math")
    meter = ConsistencyMeter(judge="policy", threshold=0.5)
    m, per = meter.measure(
        lm.model,
        lm.tokenizer,
        prompts,
        [c for _, c, _ in cases],
        "auto",
        ex.strict,
        lambda a, b, i: ch.equivalent(a, b, {}),
    )
    assert [p["rederive_consistent"] for p in per] == [c for _, _, c in cases]
    assert per[0]["likelihood"] > 0.5 > per[1]["likelihood"]
    assert per[2]["likelihood"] > 0.5 > per[3]["likelihood"]
    assert m["consistency/rederive_rate"] == 0.5 and m["consistency/likelihood_rate"] == 0.5


class OptionContentJudge:
    """Finishes a cut multiple-choice completion with the letter under which the prompt now lists the last number
    of the reasoning (a judge that follows the reasoning's content, not the letter first written)."""

    def generate(self, model, tokenizer, texts, num_generations=1, greedy=False, max_new_tokens=None):
        outs = []
        for t in texts:
            prompt, reasoning = t.split("PROMPT|", 1)
            nums = NUM.findall(reasoning)
            found = re.search(rf"^([A-D])\) {nums[-1]}$", prompt, re.M) if nums else None
            outs.append(f"{found.group(1) if found else 'A'}</answer>")
        return SimpleNamespace(texts=outs)


def test_option_shuffle_rate_by_hand():
    from rlexp.data.multiple_choice import ChoiceView, reshuffle
    from rlexp.data.sources import DatasetSplits
    from rlexp.evaluation.checkers import ChoiceExtractor

    recs = [
        {"id": f"r{i}", "question": f"What is {a} + 3?", "answer": str(a + 3), "scorer": "math"}
        for i, a in enumerate((12, 4, 7))
    ]
    view = ChoiceView(seed=0)(DatasetSplits("toy", recs[:2], recs[2:]))
    rec = view.train[0]  # correct option "15"
    opts = rec["metadata"]["options"]
    right, wrong = "ABCD"[opts.index("15")], "ABCD"[opts.index(next(o for o in opts if o != "15"))]
    plain = {"id": "p", "question": "What is 1 + 1?", "answer": "2", "scorer": "math", "metadata": {}}
    completions = [
        f"<think>12 + 3 = 15.</think><answer>{right}</answer>",  # its reasoning supports its option: consistent
        f"<think>12 + 3 = 15.</think><answer>{wrong}</answer>",  # the reasoning supports another option
        "<think>12 + 3 = 15.</think>",  # no answer: inconsistent
        "<think>1 + 1 = 2.</think><answer>2</answer>",  # not multiple choice: left out
    ]
    records = [rec, rec, rec, plain]
    meter = ConsistencyMeter(judge="policy", rederive=False, likelihood=False, shuffle=True)
    m, per = meter.measure(
        None,
        None,
        [r["question"] + "PROMPT|" for r in records],
        completions,
        "tag",
        ChoiceExtractor("tag").strict,
        lambda a, b, i: a == b,
        rollout=OptionContentJudge(),
        records=records,
    )
    assert m["consistency/shuffle_measured"] == 3.0 and m["consistency/shuffle_rate"] == pytest.approx(1 / 3)
    assert [p.get("shuffle_consistent") for p in per] == [True, False, False, None]
    _, moved = reshuffle(rec)
    assert per[0]["shuffle_option"] == "15" and per[0]["shuffle_letter"] == "ABCD"[moved.index("15")] != right
