"""A learned action mask: NLPO ("Is Reinforcement Learning (Not) for Natural Language Processing: Benchmarks,
Baselines, and Building Blocks for Natural Language Policy Optimization", Ramamurthy et al., 2022; arXiv 2210.01241).

A masking policy π_ψ, a copy of the policy refreshed every ``sync_every`` optimiser steps, restricts each next-token
choice to its top-p tokens: the policy samples from π_θ renormalised on that set, and its log-probs in the loss are
renormalised on the same set (the released RL4LMs' ``learned_top_p`` mask: ``MaskableCategorical`` over the masking
model's top-p). ``processor`` masks generation (a transformers logits processor with the masking model's own KV cache);
``vocab_mask`` gives the (N, T, V) masks of a training micro-batch.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from rlexp.core.forward import completion_logits
from rlexp.core.registry import REGULARISERS
from rlexp.models.copies import full_parameters, weights_copy


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """(…, V) bool: the fewest most likely tokens of softmax(logits) whose mass reaches ``top_p`` (at least one)."""
    probs = torch.softmax(logits.float(), -1)
    sorted_p, order = probs.sort(-1, descending=True)
    keep_sorted = torch.cumsum(sorted_p, -1) - sorted_p < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


@REGULARISERS.register
class TopPActionMask:
    """NLPO's masking policy: a frozen copy of the policy, synced every ``sync_every`` optimiser steps (the released
    code's ``target_update_iterations``), whose top-``top_p`` tokens are the allowed actions."""

    def __init__(self, policy: torch.nn.Module, top_p: float = 0.9, sync_every: int = 5):
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"algorithm.action_mask.top_p={top_p} must be in (0, 1]")
        if sync_every < 1:
            raise ValueError(f"algorithm.action_mask.sync_every={sync_every} must be >= 1")
        self.top_p, self.sync_every = float(top_p), int(sync_every)
        self.model = weights_copy(policy).eval()  # distributed=fsdp | deepspeed_zero*: an unsharded copy
        self.model.requires_grad_(False)

    @torch.no_grad()
    def after_optimizer_step(self, policy: torch.nn.Module, step: int) -> bool:
        """Copy the policy into the masking model after training step ``step`` (1-based) every ``sync_every``."""
        if step % self.sync_every:
            return False
        with full_parameters(policy) as params:  # a sharded policy's gathered (every process syncs at this step)
            for t, (_, s) in zip(self.model.parameters(), params, strict=True):
                t.copy_(s)
        return True

    @torch.no_grad()
    def vocab_mask(self, prompt_ids, prompt_mask, completion_ids, completion_mask, autocast_dtype=None) -> torch.Tensor:
        """(N, T, V) bool: the allowed tokens at each completion position (the sampled token always allowed, so a
        top-p boundary that rounds differently from generation's never masks it out)."""
        with torch.autocast(
            prompt_ids.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
        ):
            logits = completion_logits(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask)
        mask = top_p_mask(logits, self.top_p)
        return mask.scatter(-1, completion_ids.unsqueeze(-1), True)

    def processor(self, prompt_mask: torch.Tensor) -> LogitsProcessor:
        """The mask for transformers' generate (rollout.engine=generate)."""
        return _MaskingProcessor(self.model, self.top_p, prompt_mask)

    def stepper(self) -> MaskStepper:
        """The mask for rlexp's decode loop (rollout.engine=loop, eager)."""
        return MaskStepper(self.model, self.top_p)

    def state_dict(self):
        return self.model.state_dict()

    def load_state_dict(self, state) -> None:
        if state is not None:
            self.model.load_state_dict(state)


class _MaskingProcessor(LogitsProcessor):
    """Generation's mask: a ``MaskStepper`` fed the prompt on the first call and the sampled token on each later
    one; scores outside its top-p become −inf (so a recorder after it records the renormalised log-probs)."""

    def __init__(self, model, top_p: float, prompt_mask: torch.Tensor):
        self.stepper, self.prompt_mask = MaskStepper(model, top_p), prompt_mask

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.stepper.cache is None:
            self.stepper.start(input_ids, self.prompt_mask)
        else:
            self.stepper.advance(input_ids[:, -1])
        return self.stepper.apply(scores)


class MaskStepper:
    """The decode loop's mask: ``start`` prefills the masking model on a round's rows (left-padded prompts),
    ``apply`` masks the policy's logits to its current top-p set, ``advance`` feeds it the tokens just sampled."""

    def __init__(self, model, top_p: float):
        self.model, self.top_p = model, top_p
        self.cache = self.allowed = self.attention = self.lengths = None

    @torch.no_grad()
    def start(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        self.attention = prompt_mask.clone()
        self.lengths = prompt_mask.sum(-1)
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True)
        self.cache, self.allowed = out.past_key_values, top_p_mask(out.logits[:, -1], self.top_p)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill(~self.allowed, float("-inf"))

    @torch.no_grad()
    def advance(self, tokens: torch.Tensor) -> None:
        self.attention = torch.cat([self.attention, torch.ones_like(tokens[:, None])], 1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attention,
            position_ids=self.lengths[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.lengths = self.lengths + 1
        self.cache, self.allowed = out.past_key_values, top_p_mask(out.logits[:, -1], self.top_p)
