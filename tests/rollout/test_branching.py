"""ARPO's branching rollout (rlexp/rollout/branching.py): the entropy rise and the branch rule on given numbers, a
hand-scripted group (the policy's turns, the turns' entropies and the coins scripted; the Python tool, the tool-use
environment and SmolLM2's chat template real) whose branch copies its parent's prefix token for token, the
environment forks, and a rollout on the tiny model whose first turn is a scripted call (tests/rollout/
first_call_engine.py): the Python tool really runs and the branches share its result."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.environments import EnvStep
from rlexp.environments.tool_use import ToolUse, ToolUseEpisode
from rlexp.rollout.branching import (
    BranchingRollout,
    branch_probability,
    entropy_rise,
    fork_environment,
    should_branch,
)
from rlexp.rollout.hf import RolloutOutput
from rlexp.tools.python import PythonTool
from tests.rollout.first_call_engine import FirstCallEngine

LP = -0.25  # every scripted token's sampling log-prob
CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
MODEL = torch.nn.Linear(1, 1)


class Scripted:
    """The engine's ``generate_from_ids``: each call answers the active rows with the next scripted texts (in order)."""

    temperature, max_new_tokens = 1.0, 64

    def __init__(self, turns):
        self.turns, self.contexts = list(turns), []

    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, greedy=False):
        texts = self.turns.pop(0)
        assert len(texts) == ids.shape[0]
        self.contexts.append([tokenizer.decode(r[m.bool()]) for r, m in zip(ids, mask)])
        rows = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
        width = max(len(r) for r in rows)
        comp = torch.full((len(rows), width), tokenizer.pad_token_id)
        cmask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, r in enumerate(rows):
            comp[k, : len(r)], cmask[k, : len(r)] = torch.tensor(r), 1
        return RolloutOutput(ids, mask, comp, cmask, cmask * LP, torch.zeros(len(rows), dtype=torch.bool), texts)


class Coins:
    """Scripted draws of the branch coin (``rng.random()``)."""

    def __init__(self, values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


class ScriptedBranching(BranchingRollout):
    """The branching rollout with each round's turn entropies scripted (a list per round, a value per scored row)."""

    def __init__(self, turns, entropies, coins, **kw):
        super().__init__(Scripted(turns), ToolUse([PythonTool()]), **kw)
        self.script, self.rng, self.scored = list(entropies), Coins(coins), []

    def _turn_entropies(self, model, tokenizer, eps, out, rows):
        self.scored.append(len(rows))
        return dict(zip(rows, self.script.pop(0)))


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny.tokenizer


def test_the_entropy_rise_and_the_branch_rule_by_hand():
    V = 49152
    # H = 8.0, H0 = 3.0 (sums over the first tokens): ΔH = 5 / ln 49152 = 5 / 10.8027 = 0.46285
    assert entropy_rise(8.0, 3.0, V) == pytest.approx(5.0 / math.log(V)) == pytest.approx(0.46285, abs=1e-5)
    assert entropy_rise(3.0, 3.0, V) == 0.0 and entropy_rise(2.0, 3.0, V) < 0  # a fall is negative
    # P = clip(α + β·ΔH): 0.5 + 0.2·0.46285 = 0.59257; clipped at both ends
    assert branch_probability(0.46285, 0.5, 0.2) == pytest.approx(0.59257)
    assert branch_probability(5.0, 0.5, 0.2) == 1.0 and branch_probability(-5.0, 0.5, 0.2) == 0.0
    # one coin u: a branch when u ≤ α + β·ΔH — u = 0.59 branches at ΔH = 0.46285, u = 0.6 does not; at ΔH = 0, u ≤ α
    assert should_branch(0.59, 0.46285, 0.5, 0.2) and not should_branch(0.6, 0.46285, 0.5, 0.2)
    assert should_branch(0.5, 0.0, 0.5, 0.2) and not should_branch(0.51, 0.0, 0.5, 0.2)
    # the released code's form: skip when clip(u − β·ΔH, 0, 1) > α — the same decisions
    for u in (0.0, 0.3, 0.59, 0.6, 0.99):
        for rise in (-3.0, -0.5, 0.0, 0.46285, 3.0):
            assert should_branch(u, rise, 0.5, 0.2) == (not min(1.0, max(0.0, u - 0.2 * rise)) > 0.5)


def test_a_branch_copies_the_episode_before_its_high_entropy_turn(tok):
    ln_v = math.log(len(tok))
    r = ScriptedBranching(
        # round 1: e0 calls the tool; round 2: e0 answers; round 3: its branch e1 answers the same turn afresh;
        # round 4: the refill e2 (the group's last row) answers at once
        [[CALL], ["#### 42"], ["#### 7"], ["#### 1"]],
        # H (summed first-token entropies): e0's first turn 2.0 (H0); its second 2.0 + 0.5 ln|V| (ΔH = 0.5); the
        # branch's second 2.0 − 0.1 ln|V| (ΔH = −0.1); the refill fills the group, so its turn is not scored
        [[2.0], [2.0 + 0.5 * ln_v], [2.0 - 0.1 * ln_v]],
        # α = 0, β = 1: a branch when u ≤ ΔH — 0.3 ≤ 0.5 branches, 0.05 > −0.1 does not
        [0.3, 0.05],
        initial_rollouts=1,
        alpha=0.0,
        beta=1.0,
    )
    out = r.generate(MODEL, tok, ["P0"], num_generations=3)
    call = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    obs = tok("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    prefix = call + obs
    e0, e1, e2 = out.episodes
    assert (e0["branch"], e1["branch"], e2["branch"]) == (
        {"index": 0, "parent": None, "shared": 0},
        {"index": 1, "parent": 0, "shared": len(prefix)},
        {"index": 2, "parent": None, "shared": 0},
    )
    n = len(prefix)
    assert out.completion_ids[0, :n].tolist() == prefix == out.completion_ids[1, :n].tolist()  # the shared prefix
    assert out.logprobs[1, :n].tolist() == [LP] * len(call) + [0.0] * len(obs)  # its sampling log-probs too
    assert out.policy_tokens[1, :n].tolist() == [1.0] * len(call) + [0.0] * len(obs)
    assert out.texts == [CALL + "\n#### 42", CALL + "\n#### 7", "#### 1"]
    # the branch resampled the second turn from the prefix: its context is the prompt, the call and the tool's result
    assert r.engine.contexts[2] == [tok.decode(tok("P0", add_special_tokens=False)["input_ids"] + prefix)]
    assert (e1["tool_calls"], e1["turns"], e1["states"]) == (1, 2, e0["states"])  # its prefix's counters and states
    assert (e2["tool_calls"], e2["turns"]) == (0, 1)
    s = out.stats
    assert (s["arpo/branches"], s["arpo/branch_frac"], s["arpo/refills"], s["arpo/branch_points"]) == (1, 1 / 3, 1, 2)
    assert s["arpo/entropy_rise_mean"] == pytest.approx((0.5 - 0.1) / 2)  # ΔH at the two decisions
    assert s["arpo/branch_prob_mean"] == pytest.approx((0.5 + 0.0) / 2)  # clip(0 + 1·ΔH)
    assert s["arpo/initial_entropy_mean"] == pytest.approx(2.0) and r.scored == [1, 1, 1]  # H0: e0's only
    total = sum(int(out.completion_mask[i].sum()) for i in range(3))
    assert s["arpo/shared_token_frac"] == pytest.approx(n / total)


def test_the_group_budget_stops_branching_and_refill_one_adds_one_per_round(tok):
    ln_v = math.log(len(tok))
    # G = 2, M = 1: e0's second turn branches (e1 fills the group); e1's second turn is not even scored (no room)
    r = ScriptedBranching(
        [[CALL], ["#### 1"], ["#### 2"]], [[0.0], [ln_v]], [0.0], initial_rollouts=1, alpha=0.0, beta=1.0
    )
    out = r.generate(MODEL, tok, ["P0"], num_generations=2)
    assert [e["branch"]["parent"] for e in out.episodes] == [None, 0] and r.scored == [1, 1]
    # refill=one: two prompts' groups of 3 with M = 1, none branching: the refills come one a round, per group
    r = ScriptedBranching(
        [["#### a", "#### b"], ["#### c", "#### d"], ["#### e", "#### f"]],
        [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
        [],
        initial_rollouts=1,
        refill="one",
    )
    out = r.generate(MODEL, tok, ["P0", "P1"], num_generations=3)
    assert out.texts == ["#### a", "#### c", "#### e", "#### b", "#### d", "#### f"]  # record-major groups
    assert out.stats["arpo/refills"] == 2 and out.stats["arpo/branches"] == 0


def test_greedy_and_groups_without_room_roll_out_plain_episodes(tok):
    r = ScriptedBranching([["#### 5", "#### 6"]], [], [], initial_rollouts=2)
    out = r.generate(MODEL, tok, ["P0"], num_generations=2)  # M = G: no room for a branch
    assert "branch" not in out.episodes[0] and out.stats["arpo/branches"] == 0.0 and r.scored == []
    r = ScriptedBranching([["#### 5"]], [], [])
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, greedy=True)
    assert "branch" not in out.episodes[0] and "arpo/branches" not in out.stats


class Counter:
    """An environment whose state is its turn count: it answers 'n=<count>' until the third turn."""

    role = "user"

    def __call__(self, record):
        class Ep:
            n = 0

            def reset(self):
                return None

            def step(self, action):
                self.n += 1
                return EnvStep(f"n={self.n}", done=self.n == 3)

        return Ep()


def test_environment_forks():
    factory = Counter()
    env = factory({})
    env.step("a")
    env.step("b")
    twin = fork_environment(env, factory, {}, ["a", "b"])  # replayed with the prefix's turns
    assert twin is not env and twin.n == 2 and twin.step("c").observation == "n=3"
    tools = ToolUse([PythonTool()])
    ep = tools({})
    assert isinstance(fork_environment(ep, tools, {}, [CALL]), ToolUseEpisode)  # stateless: a fresh episode

    class Forkable:
        def fork(self):
            return "forked"

    assert fork_environment(Forkable(), factory, {}, ["a"]) == "forked"


def test_bad_settings_name_the_key():
    for kw, key in (
        ({"initial_rollouts": 0}, "rollout.initial_rollouts"),
        ({"branches": 0}, "rollout.branches"),
        ({"alpha": 1.5}, "rollout.alpha"),
        ({"beta": -0.1}, "rollout.beta"),
        ({"entropy_tokens": 0}, "rollout.entropy_tokens"),
        ({"refill": "some"}, "rollout.refill"),
    ):
        with pytest.raises(ValueError, match=key):
            BranchingRollout(Scripted([]), Counter(), **kw)


@pytest.mark.long  # ~3 s quiet (8 s beside the benchmark runs): decoding on the tiny model, two sandboxed calls
def test_the_branching_rollout_runs_the_python_tool_on_the_tiny_model(tiny):
    """Two global episodes open with the scripted call (17 * 3); the tool runs in the sandbox; α = 1 branches every
    turn after its result while the group has room, so each global episode gets one branch sharing call and result."""
    tok = tiny.tokenizer
    engine = FirstCallEngine(max_new_tokens=80, temperature=1.0)
    r = BranchingRollout(
        engine, ToolUse([PythonTool()]), max_turns=3, max_turn_tokens=3, initial_rollouts=2, alpha=1.0, beta=0.0
    )
    messages = [{"role": "user", "content": "What is 17 * 3?"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    torch.manual_seed(0)
    out = r.generate(tiny.model, tok, [prompt], num_generations=4)
    parents = [e["branch"]["parent"] for e in out.episodes]
    assert parents == [None, None, 0, 1]
    for i, e in enumerate(out.episodes):
        text = tok.decode(out.completion_ids[i][out.completion_mask[i].bool()])
        assert "<|im_start|>tool\n51" in text and e["tool_calls"] == 1 and e["tool_errors"] == 0  # the tool ran
    for child, parent in ((2, 0), (3, 1)):
        n = out.episodes[child]["branch"]["shared"]
        assert n > 0 and torch.equal(out.completion_ids[child, :n], out.completion_ids[parent, :n])
        assert out.policy_tokens[child, :n].min() == 0.0  # the tool's result is in the shared prefix
    s = out.stats
    assert s["arpo/branches"] == 2.0 and s["arpo/branch_points"] >= 2.0 and s["arpo/branch_prob_mean"] == 1.0
    assert s["arpo/initial_entropy_mean"] > 0.0 and math.isfinite(s["arpo/entropy_rise_mean"])  # the tiny model's
    assert s["episode/tool_calls"] == 1.0
