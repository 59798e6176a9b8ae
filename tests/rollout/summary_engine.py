"""A test double for SUPO's two-step runs on the tiny random model (rollout=supo), which never writes a tool call nor
an answer: per context, the first turn of an episode is the scripted Python call of ``first_call_engine``; a
summary (the context ends with the summarisation instruction) and a turn after a tool result are sampled by the real
engine; after a restart the episode answers "#### 51" — or, for summaries whose text has an odd CRC-32 (about half
of them), calls the tool again, which overflows the working context once more and ends the episode overlong after
the last summary. The tool, the environment, the chat template, the summaries and the training step are real."""

from __future__ import annotations

import zlib

import torch

from rlexp.rollout.hf import HFRollout, RolloutOutput
from tests.rollout.first_call_engine import CALL

ANSWER = "#### 51"
RESTART_MARK = "Summary of your work so far:"  # conf/rollout/supo.yaml's restart_template
INSTRUCTION_MARK = "Your working context is full."  # conf/rollout/supo.yaml's summary_instruction


def last_message(context: str) -> str:
    """The last message before the open assistant header a decoded context ends with (its role first)."""
    return context.rsplit("<|im_start|>", 1)[0].rsplit("<|im_start|>", 1)[-1]


def scripted(context: str) -> str | None:
    """The scripted turn for a decoded context, or None when the real engine samples it."""
    tail = last_message(context)
    if tail.startswith("user") and INSTRUCTION_MARK in tail:
        return None  # the summary: the policy's own
    if tail.startswith("tool"):
        return None  # a turn after a tool result
    if tail.startswith("user") and RESTART_MARK in tail:
        return CALL if zlib.crc32(tail.encode()) % 2 else ANSWER
    return CALL  # the episode's first turn


class PlannedEngine(HFRollout):
    """A real engine whose rows may be scripted instead: ``plan(contexts)`` gives each row's scripted text (as if
    sampled, log-prob 0, whole with its EOS) or None (the real engine samples it)."""

    def plan(self, contexts: list[str]) -> list[str | None]:
        raise NotImplementedError

    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, use_shadow=True, greedy=False):
        contexts = [tokenizer.decode(r[m.bool()]) for r, m in zip(ids, mask)]
        plan = self.plan(contexts)
        real = [k for k, p in enumerate(plan) if p is None]
        sampled = (
            super().generate_from_ids(model, tokenizer, ids[real], mask[real], max_new_tokens, use_shadow, greedy)
            if real
            else None
        )
        rows, lps, texts, cut = [], [], [], []
        for k, p in enumerate(plan):
            if p is None:
                j = real.index(k)
                n = int(sampled.completion_mask[j].sum())
                rows.append(sampled.completion_ids[j, :n].tolist())
                lps.append(sampled.logprobs[j, :n].float().tolist())
                texts.append(sampled.texts[j])
                cut.append(bool(sampled.truncated[j]))
            else:
                rows.append(tokenizer(p, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
                lps.append([0.0] * len(rows[-1]))
                texts.append(p)
                cut.append(False)  # whole, as FirstCallEngine's call: the rollout holds it to its limits
        width = max(1, max(len(r) for r in rows))
        comp = torch.full((len(rows), width), tokenizer.pad_token_id, device=ids.device)
        cmask = torch.zeros((len(rows), width), dtype=torch.long, device=ids.device)
        logp = torch.zeros((len(rows), width), device=ids.device)
        for k, (r, lp) in enumerate(zip(rows, lps)):
            if r:
                comp[k, : len(r)] = torch.tensor(r, device=ids.device)
                cmask[k, : len(r)] = 1
                logp[k, : len(r)] = torch.tensor(lp, device=ids.device)
        return RolloutOutput(ids, mask, comp, cmask, logp, torch.tensor(cut, device=ids.device), texts)


class SummaryEngine(PlannedEngine):
    def plan(self, contexts: list[str]) -> list[str | None]:
        return [scripted(c) for c in contexts]


class FirstCall(PlannedEngine):
    """The episode's first turn (the last message before the open assistant header is the user's) is the scripted
    Python call; every later turn is sampled. Unlike ``first_call_engine.FirstCallEngine`` it reads the last message
    only, so a prompt whose worked examples hold tool messages (conf/prompt/python_tool.yaml) still gets the call."""

    def plan(self, contexts: list[str]) -> list[str | None]:
        return [CALL if last_message(c).startswith("user") else None for c in contexts]
