"""SUPO's rollout (rlexp/rollout/summarizing.py) on hand-built episodes: the working-context threshold, the dropped
turn, the summary turn, the restart as [prompt + summary], one row per segment with its loss mask and log-probs, the
overlong end after the last summary, and the one-row view for evaluation.

The policy's turns are scripted (``Scripted`` returns given texts; the tool, the environment and SmolLM2's chat template
are real). With the calculator call C (c = 31 tokens with its EOS) and its result R ("42" as a tool message, o = 12
tokens), a segment holding C + R has c + o = 43 tokens after the prompt."""

from __future__ import annotations

import pytest
import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import POLICY_TOKENS, loss_mask
from rlexp.environments.tool_use import ToolUse
from rlexp.rollout.hf import RolloutOutput
from rlexp.rollout.summarizing import SummarizingRollout
from rlexp.tools.calculator import CalculatorTool

LP = -0.5  # every scripted token's sampling log-prob
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
MODEL = torch.nn.Linear(1, 1)
INSTRUCTION = "Summarise now."
RESTART = "Summary:\n{summary}\nGo on."


class Scripted:
    """The sampling engine's interface answering each call with the next scripted texts (one per active row); a text
    ending in "…" is cut (no EOS). Records each call's decoded contexts and token limit."""

    temperature, max_new_tokens = 1.0, 64

    def __init__(self, turns):
        self.turns, self.contexts, self.limits = list(turns), [], []

    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, greedy=False):
        texts = self.turns.pop(0)
        assert len(texts) == ids.shape[0]
        self.contexts.append([tokenizer.decode(r[m.bool()]) for r, m in zip(ids, mask)])
        self.limits.append(max_new_tokens)
        rows, cut = [], []
        for t in texts:
            toks = tokenizer(t.rstrip("…"), add_special_tokens=False)["input_ids"]
            toks += [] if t.endswith("…") else [tokenizer.eos_token_id]
            rows.append(toks[:max_new_tokens])
            cut.append(t.endswith("…") or len(toks) > max_new_tokens)  # no EOS within the limit
        width = max(len(r) for r in rows)
        comp = torch.full((len(rows), width), tokenizer.pad_token_id)
        cmask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, r in enumerate(rows):
            comp[k, : len(r)], cmask[k, : len(r)] = torch.tensor(r), 1
        truncated = torch.tensor(cut)
        return RolloutOutput(ids, mask, comp, cmask, cmask * LP, truncated, [t.rstrip("…") for t in texts])


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny.tokenizer


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def supo(turns, **kw) -> SummarizingRollout:
    kw = {"summary_instruction": INSTRUCTION, "restart_template": RESTART, "max_summary_tokens": 20, **kw}
    return SummarizingRollout(Scripted(turns), ToolUse([CalculatorTool()]), **kw)


def test_the_hand_sizes_of_a_call_and_its_result(tok):
    assert len(ids(tok, CALL)) + 1 == 31  # c, with its EOS
    assert len(ids(tok, "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")) == 12  # o


def test_a_full_context_is_summarised_and_restarted_as_prompt_and_summary(tok):
    # L = 80: the first call and its result fit (0 + 31 + 12 = 43 < 80); the second call fits the room left (37) and
    # runs, but with its result it would take the segment to 43 + 43 = 86 >= 80: both are dropped, the instruction
    # is added and the next turn is the summary; then the context restarts as the prompt and the summary
    r = supo([[CALL], [CALL], ["Found 42."], ["#### 42"]], working_context=80, max_summaries=1)
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, segment_rows=True)
    call = ids(tok, CALL) + [tok.eos_token_id]
    obs = ids(tok, "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    instr = ids(tok, "<|im_end|>\n<|im_start|>user\nSummarise now.<|im_end|>\n<|im_start|>assistant\n")
    summary = ids(tok, "Found 42.") + [tok.eos_token_id]
    restart = ids(tok, "<|im_end|>\n<|im_start|>user\nSummary:\nFound 42.\nGo on.<|im_end|>\n<|im_start|>assistant\n")
    answer = ids(tok, "#### 42") + [tok.eos_token_id]
    # two rows of the one episode: segment 0 = call, result, instruction, summary; segment 1 = restart, answer
    assert out.row_episodes == [0, 0] and out.completion_ids.shape[0] == 2
    seg0, seg1 = call + obs + instr + summary, restart + answer
    assert out.completion_ids[0, : len(seg0)].tolist() == seg0 and int(out.completion_mask[0].sum()) == len(seg0)
    assert out.completion_ids[1, : len(seg1)].tolist() == seg1 and int(out.completion_mask[1].sum()) == len(seg1)
    pol0 = [1.0] * len(call) + [0.0] * (len(obs) + len(instr)) + [1.0] * len(summary)
    assert out.policy_tokens[0, : len(seg0)].tolist() == pol0  # the summary is the policy's: trained end to end
    assert out.policy_tokens[1, : len(seg1)].tolist() == [0.0] * len(restart) + [1.0] * len(answer)
    assert out.logprobs[1, : len(seg1)].tolist() == [0.0] * len(restart) + [LP] * len(answer)
    # the dropped call's context was the first segment; the summary's ended with the instruction; the answer's
    # context is the prompt and the restart only: the first segment is gone from the working context
    p0 = ids(tok, "P0")
    assert r.engine.contexts[1] == [tok.decode(p0 + call + obs)]
    assert r.engine.contexts[2] == [tok.decode(p0 + call + obs + instr)]
    assert r.engine.contexts[3] == [tok.decode(p0 + restart)]
    assert r.engine.limits == [80, 80 - 43, 20, 80 - len(restart)]  # a turn gets the room left, a summary its cap
    # every row carries the episode's text (its outcome) and its own segment
    text = f"{CALL}\nFound 42.\n#### 42"
    assert out.texts == [text, text]
    e0, e1 = out.episodes
    assert (e0["segment"], e1["segment"], e0["segments"], e0["summaries"], e0["episode_index"]) == (0, 1, 2, 1, 0)
    assert e0["turn_ends"] == [len(call) - 1, len(seg0) - 1] and e1["turn_ends"] == [len(seg1) - 1]
    assert e0["tool_calls"] == 2 and not e0["truncated"] and not e0["overlong"]  # the dropped call had run
    assert not out.truncated.any()
    s = out.stats
    assert (s["supo/summaries"], s["supo/segments"], s["supo/rows"], s["supo/discarded_turns"]) == (1, 2, 2, 1)
    assert s["supo/summary_tokens"] == len(summary) and s["supo/overlong_frac"] == 0.0
    assert s["supo/working_context_max"] == len(seg0)
    assert s["episode/length"] == len(seg0) + len(seg1) and s["episode/turns"] == 3


def test_the_threshold_counts_the_turn_and_its_result(tok):
    # L = c + o = 43: the first call and its result reach L (43 >= 43): summarised at once
    r = supo([[CALL], ["S."], ["#### 42"]], working_context=43, max_summaries=1)
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, segment_rows=True)
    assert out.stats["supo/summaries"] == 1.0 and out.stats["supo/discarded_turns"] == 1.0
    assert out.episodes[0]["turn_ends"] == [int(out.completion_mask[0].sum()) - 1]  # segment 0: the summary only
    # L = 46: they fit (43 < 46), and a two-token answer after them too
    r = supo([[CALL], ["#"]], working_context=44 + 2, max_summaries=1)
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, segment_rows=True)
    assert out.stats["supo/summaries"] == 0.0 and out.episodes[0]["turns"] == 2 and not bool(out.truncated[0])


def test_an_overflow_after_the_last_summary_ends_the_episode_overlong_and_masked(tok):
    r = supo([[CALL], [CALL]], working_context=80, max_summaries=0)
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, segment_rows=True)
    assert out.row_episodes == [0] and bool(out.truncated[0])
    assert out.episodes[0]["overlong"] and out.stats["supo/overlong_frac"] == 1.0
    assert out.stats["supo/summaries"] == 0.0 and out.stats["supo/segments"] == 1.0
    # the overlong_mask stage takes the unfinished episode's rows out of the loss
    from rlexp.algorithms.group_stages.filters import overlong_mask

    batch = RolloutBatch.from_generation(out, torch.zeros(1, dtype=torch.long), ["P0"], [{}])
    batch.extras[POLICY_TOKENS] = out.policy_tokens
    assert int(loss_mask(batch).sum()) > 0
    batch = overlong_mask(batch)
    assert int(loss_mask(batch).sum()) == 0 and batch.stats["overlong/masked_frac"] == 1.0


def test_a_turn_cut_by_the_room_left_is_an_overflow_and_one_cut_by_its_own_limit_ends_the_episode(tok):
    # L = 44: after the first call and its result the room is 1 < the turn limit: the second call is cut there, so
    # the context is full — dropped (never run) and summarised
    r = supo([[CALL], [CALL], ["S."], ["#### 42"]], working_context=44, max_summaries=1)
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, segment_rows=True)
    assert r.engine.limits[1] == 1 and out.stats["supo/summaries"] == 1.0 and not bool(out.truncated[0])
    assert out.episodes[0]["tool_calls"] == 1
    # a turn cut at max_turn_tokens with room to spare: no complete message, the episode ends unfinished
    r = supo([["#### 4…"]], working_context=100, max_turn_tokens=3)
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, segment_rows=True)
    assert bool(out.truncated[0]) and out.stats["supo/summaries"] == 0.0 and out.episodes[0]["turn_ends"] == []


def test_two_episodes_of_a_prompt_give_rows_record_major(tok):
    # episode 0 summarises once (two rows), episode 1 answers at once (one row)
    r = supo([[CALL, "#### 1"], [CALL], ["S."], ["#### 42"]], working_context=80, max_summaries=1)
    out = r.generate(MODEL, tok, ["P0"], num_generations=2, segment_rows=True)
    assert out.row_episodes == [0, 0, 1]
    assert [e["episode_index"] for e in out.episodes] == [0, 0, 1]
    assert out.texts[2] == "#### 1" and out.stats["supo/rows"] == 3.0 and out.stats["supo/segments"] == 1.5
    one = supo([[CALL, "#### 1"], [CALL], ["S."], ["#### 42"]], working_context=80, max_summaries=1)
    view = one.generate(MODEL, tok, ["P0"], num_generations=2)  # evaluation's view: one row per episode
    assert view.row_episodes is None and view.completion_ids.shape[0] == 2
    assert view.texts == [f"{CALL}\nS.\n#### 42", "#### 1"] and view.episodes[0]["segment"] == 1


def test_bad_settings_are_refused_naming_the_key():
    env = ToolUse([CalculatorTool()])
    with pytest.raises(ValueError, match="rollout.max_summaries"):
        SummarizingRollout(Scripted([]), env, max_summaries=-1)
    with pytest.raises(ValueError, match="rollout.max_summary_tokens"):
        SummarizingRollout(Scripted([]), env, max_summary_tokens=0)
    with pytest.raises(ValueError, match="rollout.restart_template"):
        SummarizingRollout(Scripted([]), env, restart_template="no placeholder")
    with pytest.raises(ValueError, match="rollout.working_context"):
        SummarizingRollout(Scripted([]), env, working_context=0)


class Intro:
    """A game-like environment: a first observation, then a long answer to every turn (never done)."""

    role = "user"

    def __call__(self, record):
        from rlexp.environments import EnvStep

        class Ep:
            def reset(self):
                return "You are in room A."

            def step(self, action):
                return EnvStep("wall " * 30)

        return Ep()


def test_a_restart_keeps_the_environments_first_observation(tok):
    r = SummarizingRollout(
        Scripted([["go"], ["S."], ["go"]]),
        Intro(),
        working_context=40,
        max_summaries=1,
        max_turns=2,
        summary_instruction=INSTRUCTION,
        restart_template=RESTART,
    )
    out = r.generate(MODEL, tok, ["P0"], num_generations=1, segment_rows=True)
    intro = r._observation_ids(tok, "You are in room A.")
    assert out.completion_ids[0, : len(intro)].tolist() == intro  # segment 0 opens with it
    assert (
        out.completion_ids[1, : len(intro)].tolist() == intro
    )  # and so does the restarted segment, before the summary
    assert r.engine.contexts[2][0].endswith("Summary:\nS.\nGo on.<|im_end|>\n<|im_start|>assistant\n")
    # the second "go" was the last turn allowed (max_turns=2): unfinished at the turn limit
    assert out.episodes[1]["turn_limit"] and bool(out.truncated[1])
