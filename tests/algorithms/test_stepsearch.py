"""StepSearch's step rewards (issue 28): TF-IDF cosines, information gains, redundancy penalties and search-key
scores worked out by hand; the group stage on a hand-built batch of search episodes (token rewards at the search
turns' ends, the answer gate, turn rewards); a two-step run with the real retrieval tool."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.group_stages.step_search import (
    StepSearch,
    episode_queries,
    information_gains,
    redundancy_penalties,
    search_key_score,
    tfidf_cosines,
)
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import POLICY_TOKENS, TOKEN_REWARDS, TURN_REWARDS
from rlexp.rollout.multi_turn import observation_template
from rlexp.runs.training import run


def test_tfidf_cosines_by_hand():
    # 3 texts; idf = ln((1 + 3) / (1 + df)) + 1; "cat sat" equals gold 0 and shares nothing with gold 1
    assert tfidf_cosines("cat sat", ["cat sat", "dog ran"]) == pytest.approx([1.0, 0.0])
    # 2 texts: idf(cat) = ln(3/3) + 1 = 1, idf(dog) = idf(sat) = ln(3/2) + 1 = 1.405465; both vectors have
    # |v|² = 1 + 1.405465² = 2.975332 and share only "cat": cos = 1 / 2.975332
    assert tfidf_cosines("cat dog", ["cat sat"]) == pytest.approx([1 / 2.975332], rel=1e-6)
    assert tfidf_cosines("The Cat, a sat!", ["cat sat"]) == pytest.approx([1.0])  # SQuAD-normalised first
    assert tfidf_cosines("", ["cat"]) == [0.0] and tfidf_cosines("x y", ["cat"]) == [0.0]  # 1-letter: no token


def test_information_gain_counts_only_new_coverage_of_the_gold_documents():
    golds = ["cat sat", "dog ran"]
    # step 1 covers gold 0: G = (1 + 0) / 2; step 2 adds gold 1: G = (0 + 1) / 2; step 3 covers nothing new: 0
    gains, memory = information_gains([["cat sat"], ["cat sat", "dog ran"], ["dog ran"]], golds)
    assert gains == pytest.approx([0.5, 0.5, 0.0]) and memory == pytest.approx([1.0, 1.0])
    # a partial match, then a better one: the gain is the rise of the best match, 1/2.975332 then the rest
    gains, _ = information_gains([["cat dog"], ["cat sat"]], ["cat sat"])
    assert gains == pytest.approx([1 / 2.975332, 1 - 1 / 2.975332], rel=1e-6)
    assert information_gains([["cat"]], []) == ([0.0], [])


def test_redundancy_is_the_share_of_documents_seen_before():
    # step 2 repeats A (1 of 2); step 3 repeats C from step 2 and C again within itself (2 of 2)
    assert redundancy_penalties([["A", "B"], ["A", "C"], ["C", "C"]]) == [0.0, 0.5, 1.0]
    assert redundancy_penalties([[]]) == [0.0]


def test_search_key_score_by_hand():
    # key 1: F1("orla venn born", "orla venn") = 0.8 (best query); key 2: F1("keldmoor", "keldmoor river") = 2/3
    queries = ["Orla Venn born", "Keldmoor"]
    assert search_key_score(queries, [["Orla Venn"], ["Keldmoor river"]]) == pytest.approx((0.8 + 2 / 3) / 2)
    assert search_key_score([], [["x"]]) == 0.0 and search_key_score(["x"], []) == 0.0
    text = '<tool_call>{"name": "search", "arguments": {"query": "a b"}}</tool_call>\n<search> c </search><x>'
    assert episode_queries(text) == ["a b", "c"]
    assert episode_queries('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>') == []


ORLA = "Orla Venn was a cartographer born in 1873 in Keldmoor."
KELD = "Keldmoor is a town in Vessany on the river Tavel."
CALL = '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>'


def episode_batch(tok, rows: list[list[tuple[str, bool]]], f1: list[float]) -> RolloutBatch:
    """Rows of (text, policy?) pieces: a policy turn ends with EOS, an observation is rendered as the rollout does."""
    before, after = observation_template(tok, "tool")
    ids, pol, texts = [], [], []
    for pieces in rows:
        r, p, turns = [], [], []
        for text, policy in pieces:
            t = tok(text if policy else before + text + after, add_special_tokens=False)["input_ids"]
            if policy:
                t = t + [tok.eos_token_id]
                turns.append(text)
            r += t
            p += [int(policy)] * len(t)
        ids.append(r)
        pol.append(p)
        texts.append("\n".join(turns))
    width = max(len(r) for r in ids)
    comp = torch.full((len(rows), width), tok.pad_token_id)
    mask, policy = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width)
    for i, (r, p) in enumerate(zip(ids, pol)):
        comp[i, : len(r)], mask[i, : len(r)], policy[i, : len(r)] = torch.tensor(r), 1, torch.tensor(p).float()
    n = len(rows)
    record = {
        "answer": "1873",
        "metadata": {
            "supporting_docs": [{"id": "p0", "title": "Orla Venn", "text": ORLA}],
            "search_keys": [["Orla Venn", "Orla Venn born"]],
        },
    }
    scores = torch.tensor(f1)
    batch = RolloutBatch(
        torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.long), comp, mask, torch.zeros(n, width),
        torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.long), [""] * n, texts, [record] * n,
        rewards=scores[:, None], reward_names=["f1"], reward_weights=torch.tensor([1.0]), reward=scores.clone(),
        reward_failures=torch.zeros(n, 1, dtype=torch.bool),
    )  # fmt: skip
    batch.extras[POLICY_TOKENS] = policy
    return batch


def four_episodes(tok) -> RolloutBatch:
    docs = f"Doc 1(Title: Orla Venn) {ORLA}\nDoc 2(Title: Keldmoor) {KELD}"
    return episode_batch(
        tok,
        [
            [(CALL % "Orla Venn born", True), (docs, False), ("<answer>1873</answer>", True)],
            [(CALL % "Orla Venn born", True), (f"Doc 1(Title: Orla Venn) {ORLA}", False)] * 2
            + [("<answer>1873</answer>", True)],
            [(CALL % "Keldmoor", True), (f"Doc 1(Title: Keldmoor) {KELD}", False), ("I give up.", True)],
            [("<answer>1900</answer>", True)],
        ],
        [1.0, 1.0, -1.0, 0.0],
    )


def turn_ends(batch: RolloutBatch, row: int) -> list[int]:
    p = batch.extras[POLICY_TOKENS][row].tolist() + [0]
    return [k for k in range(len(p) - 1) if p[k] == 1 and p[k + 1] == 0]


def test_the_stage_pays_each_search_step_at_its_end_and_gates_on_the_answer(tiny):
    from types import SimpleNamespace

    tok = tiny.tokenizer
    batch = four_episodes(tok)
    out = StepSearch()(batch, SimpleNamespace(tokenizer=tok, answer_format="tag"))
    extra = out.extras[TOKEN_REWARDS]
    # row 0: one search, the gold document retrieved: G = 1, P = 0 -> 0.6 at the call's EOS
    # row 1: the same document twice: G = 1 then 0, P = 0 then 1 -> 0.6, then -0.6
    # row 2: G = cos(KELD, ORLA) = 3 / (3.721827 · 4.105118) = 0.196354 (shared: "keldmoor", "in"), but it does not
    #   end with its answer: no step reward, no key score; row 3: no search
    e0, e1, e2 = turn_ends(out, 0), turn_ends(out, 1), turn_ends(out, 2)
    assert extra[0, e0[0]].item() == pytest.approx(0.6) and extra[0].abs().sum().item() == pytest.approx(0.6)
    assert extra[1, e1[0]].item() == pytest.approx(0.6) and extra[1, e1[1]].item() == pytest.approx(-0.6)
    assert extra[1].abs().sum().item() == pytest.approx(1.2)
    assert extra[2].abs().sum().item() == 0.0 and extra[3].abs().sum().item() == 0.0 and len(e2) == 2
    g = 3 / (math.sqrt(1 + 1 + 6 * 1.405465**2) * math.sqrt(6 * 1.405465**2 + 4 + 1))
    assert tfidf_cosines(KELD, [ORLA])[0] == pytest.approx(g, rel=1e-5)
    s = out.stats
    assert s["stepsearch/info_gain_mean"] == pytest.approx((1 + 1 + 0 + g) / 4, rel=1e-5)
    assert s["stepsearch/redundancy_mean"] == pytest.approx(0.25)
    assert s["stepsearch/step_reward_mean"] == pytest.approx(0.6 / 3)  # paid: 0.6, 0.6, -0.6
    assert s["stepsearch/search_steps"] == 1.0 and s["stepsearch/answered_frac"] == 0.75
    assert s["stepsearch/coverage"] == pytest.approx((1 + 1 + g + 0) / 4, rel=1e-5)
    # the key score: F1 of "Orla Venn born" against the key's expressions = 1 for rows 0 and 1; 0.618 x it
    assert s["stepsearch/key_score_mean"] == pytest.approx(0.5)
    assert out.reward_names == ["f1", "search_key"] and out.term("search_key").tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.reward.tolist() == pytest.approx([1.618, 1.618, -1.0, 0.0])


def test_turn_rewards_and_switches(tiny):
    from types import SimpleNamespace

    tok = tiny.tokenizer
    ctx = SimpleNamespace(tokenizer=tok, answer_format="tag")
    out = StepSearch(emit="turn", key_weight=0.0)(four_episodes(tok), ctx)
    assert TOKEN_REWARDS not in out.extras and out.reward_names == ["f1"]
    r = out.extras[TURN_REWARDS]
    assert r.shape == (4, 3)
    assert r[0, :2].tolist() == pytest.approx([0.6, 1.0]) and math.isnan(r[0, 2])  # the outcome on the last turn
    assert r[1].tolist() == pytest.approx([0.6, -0.6, 1.0])
    assert r[2, :2].tolist() == pytest.approx([0.0, -1.0]) and r[3, 0].item() == 0.0 and math.isnan(r[3, 1])
    gain_only = StepSearch(redundancy_penalty=False, require_answer=False, key_weight=0.0)(four_episodes(tok), ctx)
    e1, e2 = turn_ends(gain_only, 1), turn_ends(gain_only, 2)
    assert gain_only.extras[TOKEN_REWARDS][1, e1[1]].item() == 0.0  # no penalty: G = 0 on the repeat
    g = tfidf_cosines(KELD, [ORLA])[0]
    assert gain_only.extras[TOKEN_REWARDS][2, e2[0]].item() == pytest.approx(0.6 * g)  # no gate
    with pytest.raises(ValueError, match=r"StepSearch.emit='step' is not one of"):
        StepSearch(emit="step")
    with pytest.raises(ValueError, match="StepSearch needs multi-turn search episodes"):
        batch = four_episodes(tok)
        del batch.extras[POLICY_TOKENS]
        StepSearch()(batch, ctx)


def test_stepsearch_refuses_a_single_turn_rollout_at_config_time(tiny_cfg):
    from rlexp.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match=r"algorithm.group_stages.0 \(StepSearch\) reads multi-turn episodes"):
        validate(tiny_cfg("algorithm=stepsearch"))


# what a two-step StepSearch run on the tiny model needs beside the reward (test_methods_run adds these to its varying
# reward; this file's run uses reward=search_qa): search episodes with scripted calls, the real BM25 tool over the
# synthetic corpus (written under the run directory), room for three turns
SEARCH_RUN = [
    "rollout=multi_turn",
    "environment=tool_use",
    "tools=[retrieval]",
    "dataset=search_facts",
    "dataset.cache_dir=${trainer.run_dir}/search_facts",
    "prompt=search_tool",
    "prompt.examples=[]",  # a shorter prompt: the few-shot exchanges add ~400 tokens a row
    "rollout.engine._target_=tests.tools.search_engines.SearchScriptEngine",
    "rollout.max_turns=3",
    "rollout.max_turn_tokens=16",
    "trainer.max_new_tokens=260",
    "tools.retrieval.top_k=2",
    "tools.retrieval.max_doc_chars=120",
    "trainer.autocast=off",
]


@pytest.mark.long  # two steps of four scripted 3-turn episodes, the real BM25 tool, critic and reference
def test_stepsearch_trains_two_steps_with_the_real_retrieval_tool(tiny_cfg):
    result = run(tiny_cfg("algorithm=stepsearch", "reward=search_qa", "trainer.prompts_per_step=1", *SEARCH_RUN))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["episode/tool_calls"] == 2.0 and m["episode/tool_errors"] == 0.0 and m["episode/turns"] == 3.0
    assert m["stepsearch/search_steps"] == 2.0 and m["stepsearch/answered_frac"] == 1.0
    assert 0.0 < m["stepsearch/info_gain_mean"] <= 1.0  # the retrieved documents covered the gold ones
    assert m["stepsearch/redundancy_mean"] == 0.25  # half the episodes repeat their query: P = 1 on 1 step in 4
    assert m["stepsearch/step_reward_mean"] != 0.0 and m["stepsearch/coverage"] > 0.0
    assert m["reward/search_key/mean"] > 0.0 and m["advantage/abs_mean"] > 0.0
