"""A test double for the policy's first turn of multi-turn runs on the tiny random model, which never writes a
tool call: the first turn of every episode is the scripted call below (as if sampled, log-prob 0); every later
turn is sampled by the real engine. The tool, the environment, the chat template and the training step are real."""

from __future__ import annotations

import torch

from rlexp.rollout.hf import HFRollout, RolloutOutput

CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(17 * 3)"}}</tool_call>'


class FirstCallEngine(HFRollout):
    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, use_shadow=True, greedy=False):
        contexts = tokenizer.batch_decode(ids)
        # a later turn (a tool result after the question; the prompt's worked examples come before it): sampled
        if any("<|im_start|>tool" in c.rsplit("<|im_start|>user", 1)[-1] for c in contexts):
            return super().generate_from_ids(model, tokenizer, ids, mask, max_new_tokens, use_shadow, greedy)
        toks = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        comp = torch.tensor([toks] * ids.shape[0], device=ids.device)
        n = ids.shape[0]
        return RolloutOutput(
            ids,
            mask,
            comp,
            torch.ones_like(comp),
            torch.zeros(comp.shape),
            torch.zeros(n, dtype=torch.bool),
            [CALL] * n,
        )
