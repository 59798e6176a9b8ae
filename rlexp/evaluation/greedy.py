"""Periodic evaluation inside training: greedy decoding on the held-out split."""

from __future__ import annotations

import torch

from rlexp.rewards.terms import Sample


class GreedyEvaluator:
    def __init__(self, records, prompt_format, rollout, accuracy_term, max_new_tokens=None):
        self.records, self.prompt_format, self.rollout = records, prompt_format, rollout
        self.accuracy_term, self.max_new_tokens = accuracy_term, max_new_tokens

    @torch.no_grad()
    def __call__(self, model, tokenizer, step: int) -> dict[str, float]:
        prompts = [self.prompt_format.render(tokenizer, r["question"]) for r in self.records]
        out = self.rollout.generate(model, tokenizer, prompts, 1, greedy=True, max_new_tokens=self.max_new_tokens)
        lengths = out.completion_mask.sum(-1).float()
        metrics = {
            "eval/length/mean": float(lengths.mean()),
            "eval/length/truncated_frac": float(out.truncated.float().mean()),
        }
        if self.accuracy_term is not None:
            samples = [
                Sample(p, c, r, i, int(n), bool(tr))
                for i, (p, c, r, n, tr) in enumerate(
                    zip(prompts, out.texts, self.records, lengths.tolist(), out.truncated.tolist())
                )
            ]
            metrics["eval/accuracy"] = sum(self.accuracy_term(samples).scores) / len(samples)
        return metrics
