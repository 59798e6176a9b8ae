"""Test doubles for the policy's turns of game runs on the tiny random model (which never ends a turn by itself):
the first turn of each episode is a scripted move — ``MOVES[k % len(MOVES)]`` on row k, as if sampled (log-prob
0); every later turn is sampled by the real engine and closed with a scripted EOS (tests/environments/
game_engine.py's rule), so the environment really answers the model's own junk. One subclass per game."""

from __future__ import annotations

import torch

from rlexp.rollout.hf import RolloutOutput
from tests.environments.game_engine import GameEngine


class MoveEngine(GameEngine):
    MOVES: tuple[str, ...] = ("look",)

    def generate_from_ids(self, model, tokenizer, ids, mask, max_new_tokens, use_shadow=True, greedy=False):
        contexts = tokenizer.batch_decode(ids)
        if any(c.count("<|im_start|>assistant") > 1 for c in contexts):  # a later turn: GameEngine samples it
            return super().generate_from_ids(model, tokenizer, ids, mask, max_new_tokens, use_shadow, greedy)
        n, eos = ids.shape[0], tokenizer.eos_token_id
        texts = [self.MOVES[k % len(self.MOVES)] for k in range(n)]
        rows = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
        width = max(len(r) for r in rows)
        comp = torch.full((n, width), tokenizer.pad_token_id, device=ids.device)
        cmask = torch.zeros((n, width), dtype=torch.long, device=ids.device)
        for k, r in enumerate(rows):
            comp[k, : len(r)], cmask[k, : len(r)] = torch.tensor(r), 1
        return RolloutOutput(ids, mask, comp, cmask, torch.zeros(comp.shape), torch.zeros(n, dtype=torch.bool), texts)


class GuessEngine(MoveEngine):
    """Guess The Number over 1-2: even rows guess 1, odd rows 2 — one of each pair is right, whatever the secret."""

    MOVES = ("\\boxed{1}", "\\boxed{2}")


class ScienceEngine(MoveEngine):
    """ScienceWorld: even rows focus on the agent (a wrong focus: the task fails), odd rows look around."""

    MOVES = ("focus on agent", "look around")
