"""Test doubles for CoMAS's discussion (rlexp/algorithms/group_stages/discussion.py) on the tiny random model, which
never writes a ``<score>`` tag: scripted replies, tokenised with the real tokenizer and ended with EOS (log-prob 0, as
if sampled).

* ``scripted_output``: a rollout output holding given replies to given prompts.
* ``ScriptedScorer``: the real engine (rollout=hf), except that a call whose prompts are all scorer prompts gets the
  replies of ``SCORE_CYCLE`` in turn (a score of 3, of 1, no score, a score of 2, ...), so some scores parse and some
  do not; every other reply (the solutions, the evaluations) is sampled by the tiny model."""

from __future__ import annotations

import torch

from rlexp.rollout.hf import HFRollout, RolloutOutput

SCORER_MARK = "between <score> and </score>"  # in the scorer prompt (discussion.SCORER_TEMPLATE) only
SCORE_CYCLE = ("Sound. <score>3</score>", "Fatal. <score>1</score>", "I cannot tell.", "<score>2</score>")


def scripted_output(tokenizer, prompts: list[str], replies: list[str], device="cpu") -> RolloutOutput:
    """Prompts left-padded, each reply right-padded and ended with EOS; sampling log-probs 0, none truncated."""
    pad = tokenizer.pad_token_id
    p_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    c_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in replies]
    pw, cw, n = max(len(x) for x in p_ids), max(len(x) for x in c_ids), len(prompts)
    prompt_ids = torch.full((n, pw), pad, dtype=torch.long)
    prompt_mask = torch.zeros(n, pw, dtype=torch.long)
    comp = torch.full((n, cw), pad, dtype=torch.long)
    cmask = torch.zeros(n, cw, dtype=torch.long)
    for i, (p, c) in enumerate(zip(p_ids, c_ids)):
        prompt_ids[i, pw - len(p) :], prompt_mask[i, pw - len(p) :] = torch.tensor(p), 1
        comp[i, : len(c)], cmask[i, : len(c)] = torch.tensor(c), 1
    return RolloutOutput(
        prompt_ids.to(device),
        prompt_mask.to(device),
        comp.to(device),
        cmask.to(device),
        torch.zeros(n, cw, device=device),
        torch.zeros(n, dtype=torch.bool, device=device),
        list(replies),
    )


class ScriptedScorer(HFRollout):
    def generate(self, model, tokenizer, prompts, num_generations=1, *args, **kwargs):
        if prompts and num_generations == 1 and all(SCORER_MARK in p for p in prompts):
            replies = [SCORE_CYCLE[i % len(SCORE_CYCLE)] for i in range(len(prompts))]
            return scripted_output(tokenizer, list(prompts), replies, next(model.parameters()).device)
        return super().generate(model, tokenizer, prompts, num_generations, *args, **kwargs)
