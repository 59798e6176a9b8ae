"""GRPO-CARE consistency bonus (rlexp.algorithms.group_stages.consistency) and the EMA reference, values computed
by hand."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.algorithms.group_stages.consistency import ConsistencyBonus, care_bonus
from rlexp.algorithms.regularisers.reference import ReferenceModel, ema_update
from rlexp.core.batch import RolloutBatch
from rlexp.runs.training import run

NAN = float("nan")


def bonus_of(acc, conf, groups, **kw):
    return care_bonus(torch.tensor(acc, dtype=torch.float32), torch.tensor(conf), torch.tensor(groups), **kw)


def nan_list(t):
    return [None if math.isnan(v) else round(v, 6) for v in t.tolist()]


def test_bonus_on_hand_made_groups():
    out = bonus_of(
        acc=[1, 1, 0, 1, 0, 0, 0, 0, 0.05, 0.05, 0.05, 0, 1, 1, 1, 0, 0.5, 1, 0.5, 0],
        conf=[0.9, 0.6, 0.99, 0.97, 0.5, 0.9, NAN, 0.2, 0.9, 0.9, 0.9, 0.9, NAN, 0.8, 0.6, 0.9, 0.9, 0.5, 0.9, 0.9],
        groups=[0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4,
    )
    # g0: mean acc 0.75 -> accurate rows 0, 1, 3; capped conf 0.9, 0.6, 0.95 -> threshold 2.45/3;
    #     rows 0 (0.9) and 3 (0.95) reach it, row 1 (0.6) does not; bonus 0.5 * acc
    # g1: no accurate sample -> no threshold, no bonus
    # g2: 0.05 >= mean 0.0375 but not > floor 0.1 -> nobody accurate
    # g3: accurate rows 0, 1, 2; row 0 has no parsed answer (NaN): out of the threshold, no bonus;
    #     threshold mean(0.8, 0.6) = 0.7 -> only row 1
    # g4: partial accuracy, mean 0.5 -> accurate rows 0, 1, 2; threshold (0.9+0.5+0.9)/3 = 2.3/3;
    #     the most accurate row 1 is unconfident -> no bonus; rows 0, 2 get 0.5 * 0.5
    assert out["bonus"].tolist() == pytest.approx(
        [0.5, 0, 0, 0.5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5, 0, 0, 0.25, 0, 0.25, 0]
    )
    assert out["accurate"].tolist() == [True, True, False, True] + [False] * 8 + [True, True, True, False] * 2
    assert out["consistent"].tolist() == (
        [True, False, False, True] + [False] * 8 + [False, True, False, False] + [True, False, True, False]
    )
    thr = nan_list(out["threshold"])
    assert thr[0] == pytest.approx(2.45 / 3) and thr[4] is None and thr[8] is None
    assert thr[12] == pytest.approx(0.7) and thr[16] == pytest.approx(2.3 / 3)


def test_margin_lowers_the_threshold():
    out = bonus_of([1, 1, 0, 1], [0.9, 0.6, 0.99, 0.97], [0] * 4, margin=0.25)
    # threshold 2.45/3 - 0.25 = 0.5667 -> row 1 (0.6) now gets the bonus too
    assert out["bonus"].tolist() == pytest.approx([0.5, 0.5, 0, 0.5])
    assert out["threshold"][0].item() == pytest.approx(2.45 / 3 - 0.25)


def test_confidence_cap():
    capped = bonus_of([1, 1], [0.99, 0.95], [0, 0], confidence_cap=0.95)
    # both capped to 0.95 -> threshold 0.95 -> both consistent
    assert capped["bonus"].tolist() == pytest.approx([0.5, 0.5])
    uncapped = bonus_of([1, 1], [0.99, 0.95], [0, 0], confidence_cap=None)
    # threshold 0.97 -> only the first
    assert uncapped["bonus"].tolist() == pytest.approx([0.5, 0.0])


def test_group_and_batch_scope_differ():
    acc, conf, groups = [1, 0, 1, 1], [0.6, 0.9, 0.8, 0.9], [0, 0, 1, 1]
    # group: g0 mean 0.5, accurate row 0, threshold 0.6 -> bonus; g1 mean 1, threshold 0.85 -> row 3 only
    assert bonus_of(acc, conf, groups, scope="group")["bonus"].tolist() == pytest.approx([0.5, 0, 0, 0.5])
    # batch: mean acc 0.75 -> accurate rows 0, 2, 3; threshold (0.6+0.8+0.9)/3 = 0.7667 -> rows 2, 3
    assert bonus_of(acc, conf, groups, scope="batch")["bonus"].tolist() == pytest.approx([0, 0, 0.5, 0.5])
    with pytest.raises(ValueError, match="scope"):
        bonus_of(acc, conf, groups, scope="device")


def make_batch(acc, groups, completions=None, prompts=None):
    n = len(acc)
    acc_t = torch.tensor(acc, dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.ones(n, 3, dtype=torch.long),
        completion_mask=torch.ones(n, 3, dtype=torch.long),
        sampling_logprobs=torch.zeros(n, 3),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.tensor(groups),
        prompts=prompts or ["p"] * n,
        completions=completions or ["c"] * n,
        records=[{}] * n,
        rewards=torch.stack([acc_t, torch.ones(n)], 1),
        reward_names=["accuracy", "format"],
        reward_weights=torch.tensor([1.0, 0.2]),
        reward=acc_t + 0.2,
        reward_failures=torch.zeros(n, 2, dtype=torch.bool),
    )


class FixedConfidence(ConsistencyBonus):
    def __init__(self, conf, **kw):
        super().__init__(**kw)
        self.conf = torch.tensor(conf)

    def confidence(self, batch, ctx):
        return self.conf


def test_stage_adds_a_reward_column_and_logs_metrics():
    acc = [1, 1, 0, 1, 0, 0, 0, 0]
    conf = [0.9, 0.6, 0.99, 0.97, 0.5, 0.9, NAN, 0.2]
    out = FixedConfidence(conf)(make_batch(acc, [0] * 4 + [1] * 4), ctx=None)
    bonus = [0.5, 0, 0, 0.5, 0, 0, 0, 0]
    assert out.reward_names == ["accuracy", "format", "care_bonus"]
    assert out.reward_weights.tolist() == pytest.approx([1.0, 0.2, 1.0])
    assert out.term("care_bonus").tolist() == pytest.approx(bonus)
    # added before group normalisation: the advantage sees accuracy + 0.2 format + bonus
    assert out.reward.tolist() == pytest.approx([a + 0.2 + b for a, b in zip(acc, bonus)])
    s = out.stats
    assert s["care/bonus_frac"] == pytest.approx(2 / 8)
    assert s["care/bonus_mean"] == pytest.approx(1.0 / 8)
    assert s["care/confidence_mean"] == pytest.approx((0.9 + 0.6 + 0.99 + 0.97 + 0.5 + 0.9 + 0.2) / 7)  # uncapped
    assert s["care/answer_parsed_frac"] == pytest.approx(7 / 8)
    assert s["care/accurate_frac"] == pytest.approx(3 / 8)
    assert s["care/consistency_rate"] == pytest.approx(2 / 3)
    assert s["care/threshold_mean"] == pytest.approx(2.45 / 3)  # group 1 has no threshold
    assert out.extras["care_consistent"].tolist() == [True, False, False, True] + [False] * 4
    assert len(out.select([0, 3])) == 2


def test_stage_with_no_accurate_sample_gives_no_bonus_and_nan_rate():
    out = FixedConfidence([0.9, 0.8])(make_batch([0, 0], [0, 0]), ctx=None)
    assert out.term("care_bonus").tolist() == [0.0, 0.0]
    assert out.reward.tolist() == pytest.approx([0.2, 0.2])
    assert math.isnan(out.stats["care/consistency_rate"]) and math.isnan(out.stats["care/threshold_mean"])
    assert out.stats["care/bonus_frac"] == 0.0


def test_stage_errors_name_the_key():
    with pytest.raises(KeyError, match="ConsistencyBonus.accuracy_term"):
        FixedConfidence([0.5], accuracy_term="acc")(make_batch([1], [0]), ctx=None)
    with pytest.raises(ValueError, match="ConsistencyBonus.scope"):
        ConsistencyBonus(scope="device")
    with pytest.raises(ValueError, match="ConsistencyBonus.confidence_cap"):
        ConsistencyBonus(confidence_cap=1.5)
    with pytest.raises(ValueError, match="already exists"):
        append_reward_column(make_batch([1], [0]), "format", torch.zeros(1))
    with pytest.raises(RuntimeError, match="reference"):
        ConsistencyBonus()(make_batch([1], [0]), SimpleNamespace(reference=None))


def token_ids_batch(tok, acc, prompt, pieces):
    """A batch whose completions are the given token pieces, as sampled (each piece tokenised on its own, so a
    completion's ids need not be the canonical tokenisation of its text); right-padded, EOS-free."""
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    rows = [[i for piece in row for i in tok(piece, add_special_tokens=False)["input_ids"]] for row in pieces]
    width = max(len(r) for r in rows)
    batch = make_batch(acc, [0] * len(rows), completions=["".join(r) for r in pieces], prompts=[prompt] * len(rows))
    batch.prompt_ids = torch.tensor([p_ids] * len(rows))
    batch.prompt_mask = torch.ones_like(batch.prompt_ids)
    batch.completion_ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    batch.completion_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    batch.sampling_logprobs = torch.zeros(len(rows), width)
    return batch


def test_confidence_is_scored_on_the_sampled_token_ids_by_hand(tiny):
    """The released code (grpo_trainer_ref_ema.py) scores exp(mean reference log-prob) of the sampled answer tokens.
    Row 0 sampled the answer "hello" as two tokens, "hel" + "lo"; re-tokenising its text gives one token "hello",
    so a text-based score would rate a sequence the policy never produced."""
    from rlexp.algorithms.group_stages.consistency import answer_token_mask, sampled_answer_confidence
    from rlexp.core.forward import token_logprobs
    from rlexp.rewards.likelihood import answer_confidence

    tok, model = tiny.tokenizer, tiny.model
    pieces = [
        ["<think>", "hi", "</think>", "<answer>", "hel", "lo", "</answer>"],
        ["<think>", "hi", "</think>", "<answer>", "hello", "</answer>"],
        ["<think>", "no answer", "</think>"],
    ]
    batch = token_ids_batch(tok, [1, 1, 0], "Say hello. ", pieces)
    mask = answer_token_mask(tok, batch.completion_ids, batch.completion_mask, "tag")
    n = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in ("<think>", "hi", "</think>", "<answer>")]
    first = sum(n)  # the answer starts after the <think>hi</think><answer> tokens
    assert mask[0].nonzero().squeeze(-1).tolist() == [first, first + 1]  # "hel", "lo"
    assert mask[1].nonzero().squeeze(-1).tolist() == [first]  # "hello"
    assert not mask[2].any()
    conf = sampled_answer_confidence(model, tok, batch, "tag")
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                               batch.completion_mask, share_prompts=False)  # fmt: skip
    assert conf[0].item() == pytest.approx(math.exp(float(lp[0, first : first + 2].mean())), rel=1e-5)
    assert conf[1].item() == pytest.approx(math.exp(float(lp[1, first])), rel=1e-5)
    assert math.isnan(conf[2])
    text = answer_confidence(model, tok, batch.prompts, batch.completions, "tag")  # re-tokenised: "hello" in both
    assert text[0].item() == pytest.approx(text[1].item(), rel=1e-5) and conf[0] != pytest.approx(conf[1])


def test_stage_scores_confidence_with_the_reference_model(tiny):
    ref = ReferenceModel(tiny.model, "ema", 0.995, 10)
    ctx = SimpleNamespace(reference=ref, tokenizer=tiny.tokenizer, answer_format="tag")
    pieces = [
        ["<think>2+2 is 4</think>", "<answer>", "4", "</answer>"],
        ["<think>2+2 is 4</think>", "<answer>", "5", "</answer>"],
        ["<think>no answer given</think>"],
        ["<think>2+2</think>", "<answer>", "4", "</answer>"],
    ]
    batch = token_ids_batch(tiny.tokenizer, [1, 0, 0, 1], "What is 2+2? ", pieces)
    out = ConsistencyBonus(confidence_cap=None)(batch, ctx)
    conf = out.extras["care_confidence"]
    assert math.isnan(conf[2]) and all(0 < conf[i] <= 1 for i in (0, 1, 3))
    # accurate rows 0 and 3 (mean 0.5); threshold = their mean confidence -> exactly the higher one gets 0.5
    # (their confidences differ: the reasoning differs), so the bonus share is 1/4
    assert out.stats["care/accurate_frac"] == 0.5
    assert conf[0] != conf[3]
    assert out.term("care_bonus").tolist() == ([0.5, 0, 0, 0] if conf[0] > conf[3] else [0, 0, 0, 0.5])
    assert out.stats["care/consistency_rate"] == pytest.approx(0.5)


# ---- the EMA reference ----------------------------------------------------------------------


class Tiny(torch.nn.Module):
    def __init__(self, w, buf):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(w))
        self.register_buffer("b", torch.tensor(buf))


def test_ema_update_by_hand():
    target, source = Tiny([1.0, 2.0], [0.0]), Tiny([0.0, 4.0], [7.0])
    ema_update(target, source, 0.995)
    # 0.995 * [1, 2] + 0.005 * [0, 4] = [0.995, 2.01]; buffers copied
    assert target.w.tolist() == pytest.approx([0.995, 2.01])
    assert target.b.tolist() == [7.0]
    ema_update(target, source, 0.995)
    assert target.w.tolist() == pytest.approx([0.995**2, 0.995 * 2.01 + 0.005 * 4])


def test_ema_reference_updates_every_interval_steps():
    policy = Tiny([1.0, 2.0], [0.0])
    ref = ReferenceModel(policy, "ema", ema_decay=0.9, ema_interval=3)
    with torch.no_grad():
        policy.w.copy_(torch.tensor([2.0, 4.0]))
    assert [ref.after_optimizer_step(policy, s) for s in (1, 2)] == [False, False]
    assert ref.model.w.tolist() == pytest.approx([1.0, 2.0])
    assert ref.after_optimizer_step(policy, 3)
    assert ref.model.w.tolist() == pytest.approx([1.1, 2.2])  # 0.9 * [1, 2] + 0.1 * [2, 4]
    assert not ref.after_optimizer_step(policy, 4)
    assert ref.after_optimizer_step(policy, 6)
    assert ref.model.w.tolist() == pytest.approx([1.19, 2.38])
    frozen = ReferenceModel(policy, "frozen")
    assert not frozen.after_optimizer_step(Tiny([9.0, 9.0], [0.0]), 3)


# ---- the method as configured ---------------------------------------------------------------


def test_config_composes_to_care_with_ema_reference_and_no_kl(tiny_cfg):
    algo = instantiate(tiny_cfg("algorithm=grpo_care", "prompt=tag").algorithm, _convert_="all")
    (stage,) = algo.group_stages
    assert isinstance(stage, ConsistencyBonus)
    assert (stage.coef, stage.accuracy_floor, stage.confidence_cap, stage.margin, stage.scope) == (
        0.5,
        0.1,
        0.95,
        0.0,
        "group",
    )
    assert algo.needs_reference and algo.kl.coef == 0
    assert (algo.reference.kind, algo.reference.ema_decay, algo.reference.ema_interval) == ("ema", 0.995, 10)


def test_grpo_care_trains_two_steps_and_logs_its_metrics(tiny_cfg, tmp_path):
    result = run(tiny_cfg("algorithm=grpo_care", "prompt=tag", "algorithm.reference.ema_interval=1"))
    assert result.last_step == 2
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in (
            "care/bonus_frac",
            "care/bonus_mean",
            "care/confidence_mean",
            "care/consistency_rate",
            "care/threshold_mean",
            "reward/care_bonus/mean",
            "reference/ema_updates",
        ):
            assert key in row, key
        assert 0.0 <= row["care/bonus_frac"] <= 1.0
