"""Rollout with transformers ``generate``: batched sampling that also records, token by token, the
log-probability of each sampled token under the temperature-scaled sampling distribution, so the
importance ratio needs no extra forward pass.

The log-probs are captured by a logits processor that sits before the temperature/top-k/top-p
warpers (transformers merges custom processors there): at step t it gathers the log-prob of the
token chosen at step t−1 from the distribution it saw then, so only one step's (N, V) log-softmax
is alive at a time. They are the log-probs of softmax(logits / temperature) — the distribution the
trainer's ratio uses (TRL's convention), which equals the sampling distribution when top-k/top-p
are off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rlexp.rollout.decode import CAPTURED, GRAPHS, DecodeLoop, Sampling


class SampledLogprobRecorder(LogitsProcessor):
    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, last_tokens[:, None]).squeeze(-1))
        out = torch.stack(self.steps, 1) if self.steps else torch.zeros(last_tokens.shape[0], 0)
        self.prev, self.steps = None, []
        return out


@dataclass
class RolloutOutput:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row has no EOS."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    has_eos = is_eos.any(-1)
    first = torch.where(
        has_eos, is_eos.int().argmax(-1), torch.full_like(has_eos, completion_ids.shape[1], dtype=torch.long)
    )
    pos = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    mask = (pos[None, :] <= first[:, None]).long()
    return mask, ~has_eos


ENGINES = ("generate", "loop")
INFERENCE_DTYPES = ("auto", None, "bfloat16", "float16")


class HFRollout:
    """Sampling with a transformers model. ``engine``: ``generate`` (transformers ``model.generate``
    with the log-prob recorder) or ``loop`` (``rlexp.rollout.decode``: one prefill per prompt, sampling
    on the device, no per-token host synchronisation on CUDA). ``micro_batch`` bounds how many
    sequences are decoded together (memory); ``cache_implementation="static"`` gives a static KV cache
    and, with ``decode_graph``, CUDA graphs: ``compile`` (the model call through ``torch.compile``
    reduce-overhead, a one-time compile per shape), ``capture`` (whole token steps, sampling
    included, captured by rlexp; see ``rlexp.rollout.decode``) or ``capture_compiled`` (the same
    steps compiled by Inductor, then captured) — so ``pad_to_multiple_of`` buckets
    prompt lengths to bound the shapes."""

    def __init__(
        self,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        micro_batch: int = 0,
        cache_implementation: str | None = None,
        pad_to_multiple_of: int | None = None,
        inference_dtype: str | None = "auto",
        engine: str = "loop",
        stop_check_every: int = 8,
        decode_graph: str | None = "compile",
    ):
        if engine not in ENGINES:
            raise ValueError(f"rollout.engine={engine!r} is not one of {list(ENGINES)}")
        if cache_implementation not in (None, "static", "dynamic") and engine == "loop":
            raise ValueError(
                f"rollout.cache_implementation={cache_implementation!r}: engine=loop supports null/dynamic or static"
            )
        if decode_graph not in GRAPHS:
            raise ValueError(f"rollout.decode_graph={decode_graph!r} is not one of {list(GRAPHS)}")
        if decode_graph in CAPTURED and (engine != "loop" or cache_implementation != "static"):
            raise ValueError(
                f"rollout.decode_graph={decode_graph} needs rollout.engine=loop and "
                f"rollout.cache_implementation=static (got {engine!r}, {cache_implementation!r})"
            )
        self._loop = (
            DecodeLoop(static=cache_implementation == "static", graph=decode_graph, stop_check_every=stop_check_every)
            if engine == "loop"
            else None
        )
        if max_new_tokens <= 0:
            raise ValueError(f"rollout.max_new_tokens must be > 0, got {max_new_tokens}")
        if temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0, got {temperature}")
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.micro_batch, self.cache_implementation = micro_batch, cache_implementation
        self.pad_to_multiple_of = pad_to_multiple_of
        if inference_dtype not in INFERENCE_DTYPES:
            raise ValueError(f"rollout.inference_dtype={inference_dtype!r} is not one of {list(INFERENCE_DTYPES)}")
        self.inference_dtype = inference_dtype
        self._shadow = None

    @property
    def shadow(self):
        """The half-precision copy of the policy that generates, once made (else None)."""
        return self._shadow

    def _shadow_dtype(self, model) -> torch.dtype | None:
        if self.inference_dtype != "auto":
            return getattr(torch, self.inference_dtype) if self.inference_dtype else None
        device = next(model.parameters()).device.type
        if not torch.is_autocast_enabled(device):
            return None
        dtype = torch.get_autocast_dtype(device)
        return dtype if next(model.parameters()).dtype != dtype else None

    def inference_model(self, model):
        """The model that generates: the policy itself, or a half-precision copy whose weights are
        refreshed from the policy before every rollout — half the memory traffic per decoded
        token, a KV cache of one dtype, and no per-step casts: under CPU autocast the fp32 KV cache
        (RoPE promotes keys to fp32) is re-cast to bf16 for attention at every token (SmolLM2, 16
        rows, 1 thread: 86 ms per decode step with autocast, 70 ms with a bf16 copy).
        ``inference_dtype``: ``auto`` makes the copy in the autocast dtype when called under autocast
        (as the trainer does) and uses the policy as is otherwise."""
        dtype = self._shadow_dtype(model)
        if dtype is None:
            return model
        if self._shadow is None or next(self._shadow.parameters()).dtype != dtype:
            import copy

            self._shadow = copy.deepcopy(model).to(dtype).eval().requires_grad_(False)
        with torch.no_grad():
            for dst, src in zip(self._shadow.parameters(), model.parameters()):
                dst.copy_(src)
        return self._shadow

    def generation_copy(self, model):
        """A copy of ``model`` that this engine never refreshes, in the dtype ``inference_model`` would generate
        in (called under the same autocast), else the policy's own: the one-step-off-policy rollout
        (``rlexp.trainer.async_rollout``) refreshes it itself and generates from it (``generate(...,
        use_shadow=False)``) in another thread while the policy trains."""
        import copy

        dtype = self._shadow_dtype(model)
        out = copy.deepcopy(model)
        for p in out.parameters():
            p.grad = None
        return (out.to(dtype) if dtype is not None else out).eval().requires_grad_(False)

    @torch.no_grad()
    def generate(
        self,
        model,
        tokenizer,
        prompts: list[str],
        num_generations: int = 1,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        use_shadow: bool = True,
    ) -> RolloutOutput:
        """``use_shadow=False``: generate with ``model`` as given (a ``generation_copy``), not the shadow."""
        if use_shadow:
            model = self.inference_model(model)
        if self._loop is not None:
            per_call = max(1, self.micro_batch // num_generations) if self.micro_batch else len(prompts)
            parts = [
                self._generate_loop(
                    model,
                    tokenizer,
                    prompts[i : i + per_call],
                    num_generations,
                    greedy,
                    max_new_tokens or self.max_new_tokens,
                )
                for i in range(0, len(prompts), per_call)
            ]
            return parts[0] if len(parts) == 1 else _concat(parts, tokenizer.pad_token_id)
        rows = [p for p in prompts for _ in range(num_generations)]
        step = self.micro_batch or len(rows)
        parts = [
            self._generate(model, tokenizer, rows[i : i + step], greedy, max_new_tokens or self.max_new_tokens)
            for i in range(0, len(rows), step)
        ]
        return parts[0] if len(parts) == 1 else _concat(parts, tokenizer.pad_token_id)

    def _encode(self, model, tokenizer, rows):
        device = next(model.parameters()).device
        enc = tokenizer(
            rows,
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
            pad_to_multiple_of=self.pad_to_multiple_of,
        ).to(device)
        eos = model.generation_config.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos if eos is not None else tokenizer.eos_token_id]
        return enc, eos_ids

    def _generate_loop(self, model, tokenizer, prompts, num_generations, greedy, max_new_tokens) -> RolloutOutput:
        enc, eos_ids = self._encode(model, tokenizer, prompts)
        sampling = Sampling(self.temperature, 0 if greedy else self.top_k, 1.0 if greedy else self.top_p, greedy)
        was_training = model.training
        model.eval()
        completion, logprobs = self._loop.run(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            num_generations,
            max_new_tokens,
            eos_ids,
            tokenizer.pad_token_id,
            sampling,
        )
        model.train(was_training)
        G = num_generations
        return _finish(
            tokenizer,
            enc["input_ids"].repeat_interleave(G, 0),
            enc["attention_mask"].repeat_interleave(G, 0),
            completion,
            logprobs,
            eos_ids,
        )

    def _generate(self, model, tokenizer, rows, greedy, max_new_tokens) -> RolloutOutput:
        enc, eos_ids = self._encode(model, tokenizer, rows)
        recorder = SampledLogprobRecorder(self.temperature)
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos_ids,
            logits_processor=LogitsProcessorList([recorder]),
        )
        if self.cache_implementation:
            kwargs["cache_implementation"] = self.cache_implementation
        if greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or None)
        was_training = model.training
        model.eval()
        out = model.generate(**enc, **kwargs)
        model.train(was_training)
        completion = out[:, enc["input_ids"].shape[1] :]
        logprobs = (
            recorder.finish(completion[:, -1])
            if completion.shape[1]
            else torch.zeros_like(completion, dtype=torch.float)
        )
        return _finish(tokenizer, enc["input_ids"], enc["attention_mask"], completion, logprobs, eos_ids)


def _finish(tokenizer, prompt_ids, prompt_mask, completion, logprobs, eos_ids) -> RolloutOutput:
    """Mask everything after each row's first EOS, decode the texts."""
    mask, truncated = completion_mask_from_ids(completion, eos_ids)
    completion = torch.where(mask.bool(), completion, torch.full_like(completion, tokenizer.pad_token_id))
    texts = tokenizer.batch_decode(completion, skip_special_tokens=True)
    return RolloutOutput(
        prompt_ids, prompt_mask, completion, mask, logprobs.to(completion.device) * mask, truncated, texts
    )


def _concat(parts: list[RolloutOutput], pad_id: int) -> RolloutOutput:
    def pad(ts, left, value=0):
        w = max(t.shape[1] for t in ts)
        out = []
        for t in ts:
            z = torch.full((t.shape[0], w - t.shape[1]), value, dtype=t.dtype, device=t.device)
            out.append(torch.cat([z, t], 1) if left else torch.cat([t, z], 1))
        return torch.cat(out)

    prompt_mask = pad([p.prompt_mask for p in parts], True)
    return RolloutOutput(
        pad([p.prompt_ids for p in parts], True, pad_id),
        prompt_mask,
        pad([p.completion_ids for p in parts], False, pad_id),
        pad([p.completion_mask for p in parts], False),
        pad([p.logprobs for p in parts], False),
        torch.cat([p.truncated for p in parts]),
        [t for p in parts for t in p.texts],
    )
