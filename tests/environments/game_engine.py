"""A test double for the policy's turns of text-game runs on the tiny random model, which never ends a turn (no EOS
within a few tokens): the first turn of each episode is a scripted command — ``take coin`` on even rows (the coin
collector's level-1 walkthrough: the game is won), ``look`` on odd rows — as if sampled (log-prob 0); every later
turn is sampled by the real engine (junk commands) and closed with a scripted EOS, so the game really answers it.
The games, the environment, the chat template and the training step are real."""

from __future__ import annotations

import torch

from rlexp.rollout.hf import HFRollout, RolloutOutput

FIRST = ("take coin", "look")


class GameEngine(HFRollout):
    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, use_shadow=True, greedy=False):
        n = ids.shape[0]
        eos = tokenizer.eos_token_id
        contexts = tokenizer.batch_decode(ids)
        # a later turn (the last user message is the game's feedback): sampled, then closed
        if any(not _first_turn(c) for c in contexts):
            out = super().generate_from_ids(model, tokenizer, ids, mask, max(1, max_new_tokens - 1), use_shadow, greedy)
            lengths = out.completion_mask.sum(-1)
            comp = torch.cat([out.completion_ids, torch.full((n, 1), tokenizer.pad_token_id, device=ids.device)], 1)
            cmask = torch.cat([out.completion_mask, torch.zeros((n, 1), dtype=out.completion_mask.dtype)], 1)
            logp = torch.cat([out.logprobs, torch.zeros((n, 1), dtype=out.logprobs.dtype)], 1)
            for k in range(n):
                if bool(out.truncated[k]):  # no EOS of its own (always, for the random model)
                    comp[k, lengths[k]], cmask[k, lengths[k]] = eos, 1
            return RolloutOutput(ids, mask, comp, cmask, logp, torch.zeros(n, dtype=torch.bool), out.texts)
        rows = [tokenizer(FIRST[k % 2], add_special_tokens=False)["input_ids"] + [eos] for k in range(n)]
        width = max(len(r) for r in rows)
        comp = torch.full((n, width), tokenizer.pad_token_id, device=ids.device)
        cmask = torch.zeros((n, width), dtype=torch.long, device=ids.device)
        for k, r in enumerate(rows):
            comp[k, : len(r)], cmask[k, : len(r)] = torch.tensor(r), 1
        texts = [FIRST[k % 2] for k in range(n)]
        return RolloutOutput(ids, mask, comp, cmask, torch.zeros(comp.shape), torch.zeros(n, dtype=torch.bool), texts)


def _first_turn(context: str) -> bool:
    """The question's turn: the context's only assistant header, or (a prompt with worked examples before the
    question) the last user message carries prompt=text_game's instruction ("Your command:"), which the game's
    feedback does not."""
    return context.count("<|im_start|>assistant") == 1 or "Your command:" in context.rsplit("<|im_start|>user", 1)[-1]
