"""Test doubles for the search methods' two-step runs on the tiny random model, which never writes a search call nor
a self-search block: the policy's turns are scripted (as if sampled, with the policy's own log-probs of the scripted
tokens at the rollout temperature; nothing is decoded, which keeps the runs short). The retrieval tool, the
environment, the chat template, the rewards and the training step are real.

* ``SearchScriptEngine`` (multi-turn, StepSearch): within each group of four rows, turn 1 searches the question or
  generic words, turn 2 repeats the query (rows 0, 1: redundant) or searches something else, turn 3 answers; so the
  steps' information gains and redundancy penalties differ within the group.
* ``SelfSearchEngine`` (single turn, SSRL): even rows are a self-search completion with an ``<information>`` block
  (format reward 1), odd rows think and answer (format reward 1/2)."""

from __future__ import annotations

import torch

from rlexp.core.forward import token_logprobs
from rlexp.rollout.hf import HFRollout, RolloutOutput


def call(query: str) -> str:
    return '<tool_call>{"name": "search", "arguments": {"query": "' + query + '"}}</tool_call>'


def question_of(context: str) -> str:
    """The question of a chat-templated context (its last user message, without the instruction line)."""
    user = context.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
    return user.split("\n")[0].strip().rstrip("?")


def left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, width - len(r) :], mask[k, width - len(r) :] = torch.tensor(r, dtype=torch.long), 1
    return ids.to(device), mask.to(device)


def scripted(engine, model, tokenizer, prompt_ids, prompt_mask, texts: list[str]) -> RolloutOutput:
    """Each row's ``texts`` entry as its completion (its tokens and EOS), with the model's log-probs of those tokens
    after the row's context (``prompt_ids``, left-padded) at the engine's temperature."""
    eos = tokenizer.eos_token_id
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    device = prompt_ids.device
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for k, r in enumerate(rows):
        ids[k, : len(r)], mask[k, : len(r)] = torch.tensor(r, device=device), 1
    with torch.no_grad():
        logps, _ = token_logprobs(model, prompt_ids, prompt_mask, ids, mask, engine.temperature, share_prompts=False)
    n = len(rows)
    return RolloutOutput(
        prompt_ids, prompt_mask, ids, mask, logps.float() * mask, torch.zeros(n, dtype=torch.bool, device=device),
        list(texts),
    )  # fmt: skip


class SearchScriptEngine(HFRollout):
    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, use_shadow=True, greedy=False):
        texts = []
        for k, context in enumerate(tokenizer.batch_decode(ids)):
            tail = context.split("<|im_start|>user\n")[-1]  # this episode's turns (the examples come before)
            turn, q, slot = tail.count("<|im_start|>tool"), question_of(context), k % 4
            first = q if slot % 2 == 0 else "town river founded"
            if turn == 0:
                texts.append(call(first))
            elif turn == 1:
                texts.append(call(first if slot < 2 else "society headquarters"))
            else:
                texts.append("<answer>unknown</answer>")
        return scripted(self, model, tokenizer, ids, mask, texts)


SELF_SEARCH = (
    "<think>I need a fact.</think><search>birth year</search><information>Doc 1: the person was born in 1873."
    "</information><think>So it is 1873.</think><answer>1873</answer>"
)
NO_SEARCH = "<think>I know it.</think><answer>1795</answer>"


class SelfSearchEngine(HFRollout):
    def generate(self, model, tokenizer, prompts, num_generations=1, greedy=False, max_new_tokens=None, **kw):
        rows = tokenizer([p for p in prompts for _ in range(num_generations)], add_special_tokens=False)["input_ids"]
        ids, mask = left_pad(rows, tokenizer.pad_token_id, next(model.parameters()).device)
        texts = [SELF_SEARCH if k % 2 == 0 else NO_SEARCH for k in range(len(rows))]
        return scripted(self, model, tokenizer, ids, mask, texts)
