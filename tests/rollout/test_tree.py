"""Tree rollouts (rlexp/rollout/tree.py): TreePO's segment tree and SPO-tree's (budget, branching, fallback, early
stops) and TreeRL's EPTree (forking points, their contexts, the kept leaves) on a scripted engine whose tokens and
log-probs are known, worked out by hand; then both on the tiny model: every leaf's tokens start with its ancestors'
tokens, shared token for token with the rows that share its nodes, and the recorded sampling log-probs are the policy's
(a teacher-forced forward gives them back)."""

from __future__ import annotations

import pytest
import torch

from rlexp.core.forward import token_logprobs
from rlexp.rollout.hf import HFRollout, RolloutOutput
from rlexp.rollout.tree import EntropyTreeRollout, PromptTree, SegmentTreeRollout, chain_leaves

MODEL = torch.nn.Linear(1, 1)
EOS = 2


class Tok:
    """Just what the rollout needs of a tokenizer: prompts as ids, a pad id, decoding."""

    pad_token_id, eos_token_id = 0, EOS

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[1] * len(t) for t in texts]}

    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(str(int(x)) for x in row if x) for row in ids]


class Scripted:
    """``generate_from_ids``: row k of call c samples tokens 100·(call's row counter) + 1, + 2, ... (each a distinct
    id), log-prob −token/1000; ``eos_at(call, row)`` → the position of an EOS that ends the row (None: none)."""

    temperature, max_new_tokens = 1.0, 64

    def __init__(self, eos_at=lambda call, row: None, logprob=None):
        self.eos_at, self.logprob = eos_at, logprob or (lambda t: -t / 1000)
        self.calls, self.contexts, self.rows = 0, [], 0

    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, greedy=False):
        self.contexts.append([r[m.bool()].tolist() for r, m in zip(ids, mask)])
        n = ids.shape[0]
        comp = torch.zeros((n, max_new_tokens), dtype=torch.long)
        cmask = torch.zeros((n, max_new_tokens), dtype=torch.long)
        trunc = torch.ones(n, dtype=torch.bool)
        for k in range(n):
            self.rows += 1
            toks = [100 * self.rows + j + 1 for j in range(max_new_tokens)]
            stop = self.eos_at(self.calls, k)
            if stop is not None and stop < max_new_tokens:
                toks = toks[:stop] + [EOS]
                trunc[k] = False
            comp[k, : len(toks)] = torch.tensor(toks)
            cmask[k, : len(toks)] = 1
        self.calls += 1
        lps = torch.tensor([[self.logprob(int(t)) for t in row] for row in comp]) * cmask
        return RolloutOutput(ids, mask, comp, cmask, lps, trunc, [""] * n)


class Draws:
    """Scripted draws: ``randint`` returns its queue's next value (checked within bounds), ``shuffle`` keeps the
    order, ``sample`` takes the listed picks."""

    def __init__(self, ints=(), picks=()):
        self.ints, self.picks = list(ints), list(picks)

    def randint(self, a, b):
        v = self.ints.pop(0)
        assert a <= v <= b
        return v

    def shuffle(self, xs):
        pass

    def sample(self, xs, k):
        out = self.picks.pop(0)
        assert len(out) == k
        return out


def rows_of(out):
    """Per row: its completion tokens, log-probs and tree record."""
    rows = []
    for r in range(out.completion_ids.shape[0]):
        n = int(out.completion_mask[r].sum())
        rows.append((out.completion_ids[r, :n].tolist(), out.logprobs[r, :n].tolist(), out.episodes[r]["tree"]))
    return rows


def check_shared_prefixes(out):
    """Two rows of a prompt that share a node share every token up to that node's end."""
    rows = rows_of(out)
    for a in rows:
        for b in rows:
            for node, end in zip(a[2]["nodes"], a[2]["ends"]):
                if node in b[2]["nodes"]:
                    assert a[0][:end] == b[0][:end]


def test_segment_tree_budget_and_branching_worked_by_hand():
    # G = 4, root width 2, branching 2, segments of 2 tokens, depth 3, no EOS. Round 1: root → n1, n2. Round 2: two
    # nodes go on, budget G − 0 = 4, D = min(4, 2 + 2) = 4: two children each (n3, n4 | n5, n6). Round 3: four go on,
    # D = min(4, 8) = 4: one child each (n7..n10), at depth 3 = max_depth: leaves.
    eng = Scripted()
    ro = SegmentTreeRollout(eng, max_new_tokens=12, segment_tokens=2, max_depth=3, branching=2, first_branching=[2, 2])
    out = ro.generate(MODEL, Tok(), ["abc"], num_generations=4)
    rows = rows_of(out)
    assert [r[2]["nodes"] for r in rows] == [[1, 3, 7], [1, 4, 8], [2, 5, 9], [2, 6, 10]]
    assert all(r[2]["ends"] == [2, 4, 6] for r in rows)
    check_shared_prefixes(out)
    assert rows[0][0][:2] == rows[1][0][:2] and rows[0][0][2:4] != rows[1][0][2:4]
    assert all(lp == pytest.approx(-t / 1000) for toks, lps, _ in rows for t, lp in zip(toks, lps))
    # contexts: the prompt (3 ids) then the node's prefix, re-prefilled for each child
    assert [len(c) for c in eng.contexts[1]] == [5, 5, 5, 5] and eng.contexts[1][0] == eng.contexts[1][1]
    assert out.truncated.tolist() == [True] * 4
    s = out.stats
    assert s["tree/leaves"] == 4 and s["tree/nodes"] == 10 and s["tree/depth_mean"] == 3
    assert s["tree/branching_nodes"] == 3  # the root, n1 and n2
    assert s["tree/shared_token_frac"] == pytest.approx(4 / 24)  # n1, n2: 2 tokens, one extra copy each
    assert s["tree/requests"] == 10 and s["tree/sampled_tokens"] == 20
    assert s["tree/prefill_tokens"] == 2 * 3 + 4 * 5 + 4 * 7 and s["tree/depth_stop_frac"] == 1.0
    assert s["tree/fallbacks"] == 0


def test_fallback_refills_the_budget_from_a_cut_back_leaf():
    # G = 3, one chain (width 1, branching 1), segments of 2, depth 3. Round 1: n1. Round 2: n2 ends with EOS at its
    # 2nd token (leaf of 4 tokens: two blocks); no node goes on and 1 < G leaves: the fallback cuts it back to
    # (2 − 1)·2 = 2 tokens (the draw 1), the end of n1, which gets min(1, 2) = 1 child n3; n3 goes on to depth 3 (n4).
    # Then the budget has 1 left: the fallback again, from a leaf that ended with EOS (n2: the draw 2 keeps 0 tokens,
    # the root) — n5, n6, n7 down to depth 3.
    eng = Scripted(eos_at=lambda call, row: 1 if call == 1 else None)
    ro = SegmentTreeRollout(eng, max_new_tokens=12, segment_tokens=2, max_depth=3, branching=1, first_branching=None)
    ro.rng = Draws(ints=[1, 2])
    out = ro.generate(MODEL, Tok(), ["p"], num_generations=3)
    rows = rows_of(out)
    assert [r[2]["nodes"] for r in rows] == [[1, 2], [1, 3, 4], [5, 6, 7]]
    assert out.truncated.tolist() == [False, True, True]
    assert rows[0][0][-1] == EOS and rows[0][0][:2] == rows[1][0][:2]
    check_shared_prefixes(out)
    assert out.stats["tree/fallbacks"] == 2 and out.stats["tree/eos_leaf_frac"] == pytest.approx(1 / 3)


def test_spo_tree_without_fallback_keeps_fewer_leaves_and_maps_rows_to_prompts():
    # branching [3, 3], depth 2, the last level to the budget (last_segment=rest); G = 4. Prompt 0's three first
    # segments all end with EOS (call 0, rows 0-2): three leaves, no fallback. Prompt 1's go on: D = min(4, 3·3) = 4,
    # one each and the remainder to the last (1, 1, 2); the last level decodes the 10 tokens left.
    eng = Scripted(eos_at=lambda call, row: 0 if call == 0 and row < 3 else None)
    ro = SegmentTreeRollout(
        eng, max_new_tokens=12, segment_tokens=2, max_depth=2, branching=[3, 3], fallback="none", last_segment="rest"
    )
    out = ro.generate(MODEL, Tok(), ["p", "q"], num_generations=4)
    assert out.row_episodes == [0, 0, 0, 4, 4, 4, 4]  # each row's prompt slot (g·G)
    rows = rows_of(out)
    assert [r[2]["nodes"] for r in rows[3:]] == [[1, 4], [2, 5], [3, 6], [3, 7]]
    assert [len(r[0]) for r in rows] == [1, 1, 1, 12, 12, 12, 12]
    assert out.stats["tree/leaves"] == 3.5


def test_prompt_tree_paths_and_ancestors():
    tree = PromptTree([9])
    a = tree.add(0, [1, 2], [-0.1, -0.2], False)
    b = tree.add(a.id, [3], [-0.3], True)
    assert tree.path(b.id) == [1, 2] and tree.prefix(b.id) == ([1, 2, 3], [-0.1, -0.2, -0.3])
    assert tree.ancestor_ending_at(b.id, 2) == 1 and tree.ancestor_ending_at(b.id, 1) == 0


def test_eptree_forks_at_the_least_likely_tokens():
    # One chain of 6 tokens 101..106, log-probs scripted so that −log π is largest at positions 3 (0.9) and 1 (0.7);
    # N = 2 forks, T = 1 continuation each: contexts are the chain's first 3 and first 1 tokens. The chain is cut at
    # 1 and 3: nodes (0,1) (1,3) (3,6); the forks hang below the first node and the second.
    lps = {102: -0.7, 104: -0.9}
    eng = Scripted(logprob=lambda t: lps.get(t, -0.1))
    ro = EntropyTreeRollout(eng, max_new_tokens=6, chains=1, forks=2, iterations=1, continuations=1)
    out = ro.generate(MODEL, Tok(), ["p"], num_generations=3)
    assert eng.contexts[1] == [[1, 101, 102, 103], [1, 101]]
    rows = rows_of(out)
    assert [r[2]["nodes"] for r in rows] == [[1, 2, 3], [1, 2, 4], [1, 5]]
    assert [r[2]["ends"] for r in rows] == [[1, 3, 6], [1, 3, 6], [1, 6]]
    assert rows[1][0][:3] == [101, 102, 103] and rows[2][0][:1] == [101]
    check_shared_prefixes(out)
    assert out.stats["tree/forks"] == 2 and out.stats["tree/fork_neglogp_mean"] == pytest.approx(0.8)


def test_eptree_keeps_g_leaves_and_refuses_too_small_a_tree():
    ro = EntropyTreeRollout(Scripted(), max_new_tokens=4, chains=2, forks=1, iterations=1, continuations=2)
    ro.rng = Draws(picks=[[0, 2, 5]])
    out = ro.generate(MODEL, Tok(), ["p"], num_generations=3)  # 2·(1 + 2) = 6 leaves, 3 kept
    assert out.completion_ids.shape[0] == 3 and out.stats["tree/dropped_leaves"] == 3
    with pytest.raises(ValueError, match="rollout.chains=2"):
        ro.generate(MODEL, Tok(), ["p"], num_generations=7)
    assert EntropyTreeRollout(Scripted(), chains=None, forks=2, continuations=2).num_chains(16) == 4  # 5 per chain


def test_chain_leaves_fork_at_the_first_token_is_a_sibling():
    from rlexp.rollout.tree import Chain

    group = [Chain(0, None, 0, 0, [5, 6], [-1.0, -1.0], True, children=[1]), Chain(0, 0, 0, 0, [7], [-1.0], True)]
    leaves = chain_leaves(group)
    assert [leaf.nodes for leaf in leaves] == [[1], [2]] and leaves[1].tokens == [7]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="rollout.fallback"):
        SegmentTreeRollout(Scripted(), fallback="always")
    with pytest.raises(ValueError, match="rollout.first_branching"):
        SegmentTreeRollout(Scripted(), first_branching=[3, 2])
    with pytest.raises(ValueError, match="rollout.branching"):
        SegmentTreeRollout(Scripted(), branching=[])
    with pytest.raises(ValueError, match="rollout.forks"):
        EntropyTreeRollout(Scripted(), forks=0)


@pytest.mark.parametrize("kind", ["segment", "eptree"])
def test_trees_on_the_tiny_model_share_prefixes_and_record_the_policys_logprobs(tiny, kind):
    torch.manual_seed(0)
    tok = tiny.tokenizer
    chat = [{"role": "user", "content": "What is 1 + 3?"}]
    prompts = [tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)]
    engine = HFRollout(max_new_tokens=6, temperature=1.0, inference_dtype=None)
    if kind == "segment":
        ro = SegmentTreeRollout(engine, segment_tokens=2, max_depth=3, first_branching=[2, 2])
    else:
        ro = EntropyTreeRollout(engine, chains=None, forks=1, continuations=2)  # 2 chains, 6 leaves, 4 kept
    out = ro.generate(tiny.model, tok, prompts, num_generations=4)
    assert out.completion_ids.shape[0] == 4 and out.stats["tree/shared_token_frac"] > 0
    check_shared_prefixes(out)  # a leaf's tokens start with its ancestors' tokens
    with torch.no_grad():
        lp = token_logprobs(tiny.model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)[0]
    assert torch.allclose(lp * out.completion_mask, out.logprobs, atol=1e-4)  # aligned with their tokens


def test_greedy_calls_sample_plain_completions():
    class Plain(Scripted):
        def generate(self, model, tokenizer, prompts, num_generations=1, greedy=False, max_new_tokens=None):
            return ("plain", greedy, num_generations)

    assert SegmentTreeRollout(Plain()).generate(MODEL, Tok(), ["p"], 2, greedy=True) == ("plain", True, 2)
    assert EntropyTreeRollout(Plain()).generate(MODEL, Tok(), ["p"], 2, greedy=True) == ("plain", True, 2)
