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

import time
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rlexp.core.masks import completion_mask_from_ids  # noqa: F401 (re-exported: rollouts and tests import it here)
from rlexp.rollout.decode import CAPTURED, GRAPHS, DecodeLoop, Sampling
from rlexp.rollout.speculative import RolloutCache, SpeculativeReuse, accepted_lengths
from rlexp.rollout.temperature import build_token_temperature


class TokenTemperatureProcessor(LogitsProcessor):
    """engine=generate with a per-token temperature schedule: divides each row's scores by τ_t / T before the
    recorder (which records log-softmax(scores / T), i.e. of logits / τ_t) and transformers' temperature warper
    (÷ T), so the sampled distribution is softmax(logits / τ_t). Keeps each step's (N,) temperatures."""

    def __init__(self, schedule, temperature: float, prompt_width: int):
        self.schedule, self.temperature, self.prompt_width = schedule, temperature, prompt_width
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        temps = self.schedule(scores, input_ids.shape[1] - self.prompt_width, self.temperature)
        self.steps.append(temps)
        return scores.float() / (temps / self.temperature)[:, None]

    def temperatures(self) -> torch.Tensor | None:
        return torch.stack(self.steps, 1) if self.steps else None


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
    stats: dict = field(default_factory=dict)  # per-rollout scalars for the trainer's metrics
    temperatures: torch.Tensor | None = None  # (N, T) per-token sampling temperatures (a token_temperature schedule)
    # multi-turn episodes (rlexp.rollout.multi_turn): (N, T) 1 on the policy's tokens, 0 on the environment's, and
    # each row's episode record (turns, per-turn rewards, counters)
    policy_tokens: torch.Tensor | None = None
    episodes: list[dict] | None = None


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
    prompt lengths to bound the shapes.

    ``micro_group_size`` (engine=loop): Infinite Sampling's micro sampling groups — each prompt's G completions
    are decoded in rounds of that many over one prefill of the prompt (``DecodeLoop.run``), with one sampling
    stream per completion, so the tokens do not depend on the size. ``speculative_reuse`` (engine=loop):
    SPEC-RL's speculative rollouts (``rlexp.rollout.speculative``) for the calls that ask for it (``reuse=True``:
    the trainer's rollouts)."""

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
        micro_group_size: int = 0,
        speculative_reuse: dict | None = None,
        token_temperature: dict | None = None,
    ):
        self.action_mask = None  # NLPO's TopPActionMask, set by the trainer (both engines; not speculative reuse)
        self._token_temperature = None
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
        if micro_group_size < 0:
            raise ValueError(f"rollout.micro_group_size must be >= 0, got {micro_group_size}")
        self.micro_group_size = micro_group_size
        spec = SpeculativeReuse(**(speculative_reuse or {}))
        self.speculative = spec if spec.enabled else None
        self.cache = RolloutCache() if self.speculative else None
        needs_loop = [
            k for k, on in (("micro_group_size", micro_group_size), ("speculative_reuse.enabled", spec.enabled)) if on
        ]
        for key in needs_loop:
            if self._loop is None or self._loop.graph in CAPTURED:
                raise ValueError(
                    f"rollout.{key} needs rollout.engine=loop without a captured decode graph "
                    f"(got engine={engine!r}, decode_graph={decode_graph!r})"
                )
        # a per-token temperature schedule (rlexp.rollout.temperature: EAD, HAPO); the trainer sets the method's
        self.token_temperature = build_token_temperature(token_temperature, "rollout.token_temperature")
        if self.speculative and (top_k or top_p < 1.0):
            raise ValueError(
                "rollout.speculative_reuse.enabled: the cached draft log-probs are those of softmax(logits / "
                f"temperature), not of a top-k/top-p filtered distribution; set rollout.top_k=0 and rollout.top_p=1.0 "
                f"(got {top_k}, {top_p})"
            )

    @property
    def token_temperature(self):
        """The per-token temperature schedule sampled with (None: ``temperature`` everywhere)."""
        return self._token_temperature

    @token_temperature.setter
    def token_temperature(self, schedule) -> None:
        if schedule is not None:
            if self.speculative is not None:
                raise ValueError(
                    "a per-token temperature (algorithm.sampling_temperature / rollout.token_temperature) cannot be "
                    "used with rollout.speculative_reuse (its drafts' log-probs are at the one rollout temperature)"
                )
            if self._loop is not None and self._loop.graph in CAPTURED:
                raise ValueError(
                    f"a per-token temperature (algorithm.sampling_temperature / rollout.token_temperature) needs the "
                    f"eager decode loop: rollout.decode_graph={self._loop.graph!r} captures one temperature"
                )
        self._token_temperature = schedule

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
            from rlexp.models.copies import weights_copy

            self._shadow = weights_copy(model).to(dtype).eval().requires_grad_(False)
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
        reuse: bool = False,
        use_shadow: bool = True,
    ) -> RolloutOutput:
        """``reuse``: draft from (and cache) earlier completions of the same prompts (``speculative_reuse``).
        ``use_shadow=False``: generate with ``model`` as given (a ``generation_copy``), not the shadow."""
        if use_shadow:
            model = self.inference_model(model)
        if reuse and self.speculative is not None and not greedy:
            return self._generate_speculative(model, tokenizer, prompts, num_generations, max_new_tokens)
        if self._loop is not None:
            rows = self._rows_per_prompt(num_generations)
            per_call = max(1, self.micro_batch // rows) if self.micro_batch else len(prompts)
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
            return self._with_temperature_stats(parts[0] if len(parts) == 1 else _concat(parts, tokenizer.pad_token_id))
        rows = [p for p in prompts for _ in range(num_generations)]
        step = self.micro_batch or len(rows)
        parts = [
            self._generate(model, tokenizer, rows[i : i + step], greedy, max_new_tokens or self.max_new_tokens)
            for i in range(0, len(rows), step)
        ]
        return self._with_temperature_stats(parts[0] if len(parts) == 1 else _concat(parts, tokenizer.pad_token_id))

    def _with_temperature_stats(self, out: RolloutOutput) -> RolloutOutput:
        """The per-token temperatures' metrics (``<method>/temperature_*``) in ``out.stats``, when sampled with some."""
        if out.temperatures is not None and self._token_temperature is not None:
            temps = out.temperatures.to(out.completion_mask.device)
            out.stats = {**out.stats, **self._token_temperature.stats(temps, out.completion_mask)}
        return out

    def _rows_per_prompt(self, num_generations: int) -> int:
        """Completions of one prompt decoded together (a micro group, else the group)."""
        return min(num_generations, self.micro_group_size) if self.micro_group_size else num_generations

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
        sampling = Sampling(
            self.temperature,
            0 if greedy else self.top_k,
            1.0 if greedy else self.top_p,
            greedy,
            None if greedy else self._token_temperature,
        )
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
            micro_group=self.micro_group_size,
            row_streams=self.micro_group_size > 0,
            action_mask=None if greedy else self.action_mask,  # NLPO: sampling among the masking model's top-p
        )
        model.train(was_training)
        G = num_generations
        out = _finish(
            tokenizer,
            enc["input_ids"].repeat_interleave(G, 0),
            enc["attention_mask"].repeat_interleave(G, 0),
            completion,
            logprobs,
            eos_ids,
        )
        out.stats = {f"rollout/{k}": v for k, v in self._loop.last_stats.items()}
        out.temperatures = self._loop.last_temperatures
        return out

    def _sampling(self, greedy: bool = False) -> Sampling:
        return Sampling(self.temperature, 0 if greedy else self.top_k, 1.0 if greedy else self.top_p, greedy)

    def _decode_rows(self, model, ids, mask, G, max_new_tokens, eos_ids, pad_id, budgets=None, greedy=False):
        """``DecodeLoop.run`` over left-padded prompts (U, P), ``micro_batch`` rows at a time (whole groups); the
        (U·G, T) tokens and log-probs, right-padded."""
        U = ids.shape[0]
        per_call = max(1, self.micro_batch // self._rows_per_prompt(G)) if self.micro_batch else U
        toks, lps = [], []
        for i in range(0, U, per_call):
            t, lp = self._loop.run(
                model,
                ids[i : i + per_call],
                mask[i : i + per_call],
                G,
                max_new_tokens,
                eos_ids,
                pad_id,
                self._sampling(greedy),
                micro_group=self.micro_group_size,
                row_streams=self.micro_group_size > 0,
                budgets=None if budgets is None else budgets[i * G : (i + per_call) * G],
            )
            toks.append(t)
            lps.append(lp)
        return _pad_right(toks, pad_id), _pad_right(lps, 0.0)

    @torch.no_grad()
    def generate_from_ids(
        self,
        model,
        tokenizer,
        ids: torch.Tensor,
        mask: torch.Tensor,
        max_new_tokens: int,
        use_shadow: bool = True,
        greedy: bool = False,
    ) -> RolloutOutput:
        """One sampled continuation of each left-padded token-id context (U, P) — AnytimeReasoner's budget summaries
        (``rlexp.algorithms.group_stages.anytime``): a prompt, a truncated reasoning and an end-of-thinking marker,
        as ids, so the reasoning's sampled tokens are never re-tokenised; a multi-turn episode's next turn
        (``rlexp.rollout.multi_turn``). Sampled at the rollout's temperature (and top-k/top-p; ``greedy``: argmax),
        ``max_new_tokens`` at most; the output's prompt fields are the contexts."""
        if use_shadow:
            model = self.inference_model(model)
        eos = model.generation_config.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos if eos is not None else tokenizer.eos_token_id]
        pad = tokenizer.pad_token_id
        m = self.pad_to_multiple_of
        if m and ids.shape[1] % m:  # bucket the context width as the prompts' (bounds compiled shapes)
            extra = m - ids.shape[1] % m
            ids = torch.nn.functional.pad(ids, (extra, 0), value=pad)
            mask = torch.nn.functional.pad(mask, (extra, 0), value=0)
        was_training = model.training
        model.eval()
        try:
            if self._loop is not None:
                completion, logprobs = self._decode_rows(
                    model, ids, mask, 1, max_new_tokens, eos_ids, pad, greedy=greedy
                )
            else:
                recorder = SampledLogprobRecorder(self.temperature)
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                    eos_token_id=eos_ids,
                    logits_processor=LogitsProcessorList([recorder]),
                    **(
                        {"do_sample": False}
                        if greedy
                        else {
                            "do_sample": True,
                            "temperature": self.temperature,
                            "top_p": self.top_p,
                            "top_k": self.top_k or None,
                        }
                    ),
                )
                completion = out[:, ids.shape[1] :]
                logprobs = (
                    recorder.finish(completion[:, -1])
                    if completion.shape[1]
                    else torch.zeros_like(completion, dtype=torch.float)
                )
        finally:
            model.train(was_training)
        return _finish(tokenizer, ids, mask, completion, logprobs, eos_ids)

    def _generate_speculative(self, model, tokenizer, prompts, G, max_new_tokens) -> RolloutOutput:
        """SPEC-RL (``rlexp.rollout.speculative``): prompts without cached drafts are decoded as usual; the others'
        drafts are verified by one forward of the current policy, reused up to their first rejected token and
        continued from there by the decode loop (each continuation within what is left of ``max_new_tokens``)."""
        from rlexp.core.forward import token_logprobs

        T_max = max_new_tokens or self.max_new_tokens
        enc, eos_ids = self._encode(model, tokenizer, prompts)
        ids, pmask = enc["input_ids"], enc["attention_mask"]
        device, pad = ids.device, tokenizer.pad_token_id
        U = ids.shape[0]
        drafts = [self.cache.get(p, G) for p in prompts]
        drafted = [u for u in range(U) if drafts[u] is not None]
        fresh = [u for u in range(U) if drafts[u] is None]
        rows_ids: list = [None] * (U * G)
        rows_lp: list = [None] * (U * G)
        was_training = model.training
        model.eval()
        stats = {"spec/drafted_frac": len(drafted) / max(U, 1), "spec/cache_prompts": float(len(self.cache))}
        verify_s = 0.0
        accepted = drafted_tokens = full = 0
        if fresh:
            tok, lp = self._decode_rows(model, ids[fresh], pmask[fresh], G, T_max, eos_ids, pad)
            for i, u in enumerate(fresh):
                for j in range(G):
                    rows_ids[u * G + j], rows_lp[u * G + j] = tok[i * G + j], lp[i * G + j]
        if drafted:
            t0 = time.perf_counter()
            d = [drafts[u][j] for u in drafted for j in range(G)]
            lengths = torch.tensor([min(len(x), T_max) for x, _ in d], device=device)
            W = int(lengths.max())
            d_ids = torch.full((len(d), W), pad, dtype=torch.long, device=device)
            d_old = torch.zeros(len(d), W, device=device)
            for r, (x, q) in enumerate(d):
                n = int(lengths[r])
                d_ids[r, :n], d_old[r, :n] = x[:n].to(device), q[:n].to(device)
            d_mask = (torch.arange(W, device=device)[None] < lengths[:, None]).long()
            p_ids, p_mask = ids[drafted].repeat_interleave(G, 0), pmask[drafted].repeat_interleave(G, 0)
            d_new = self._verify(model, token_logprobs, p_ids, p_mask, d_ids, d_mask, G)
            cut = accepted_lengths(d_old, d_new, d_mask, self.speculative.lenience)
            verify_s = time.perf_counter() - t0
            accepted, drafted_tokens = int(cut.sum()), int(lengths.sum())
            partial = (cut < lengths).nonzero().flatten().tolist()
            full = len(d) - len(partial)
            cont = {}
            if partial:  # continue from the first rejected position: context = prompt + accepted prefix
                ctx = [torch.cat([p_ids[r][p_mask[r].bool()], d_ids[r, : int(cut[r])]]) for r in partial]
                width = max(len(c) for c in ctx)
                c_ids = torch.full((len(ctx), width), pad, dtype=torch.long, device=device)
                c_mask = torch.zeros(len(ctx), width, dtype=pmask.dtype, device=device)
                for i, c in enumerate(ctx):
                    c_ids[i, width - len(c) :], c_mask[i, width - len(c) :] = c, 1
                budgets = T_max - cut[partial]
                tok, lp = self._decode_rows(model, c_ids, c_mask, 1, int(budgets.max()), eos_ids, pad, budgets)
                left = budgets.tolist()  # a row's tokens past its budget are padding: cut them off
                cont = {r: (tok[i, : left[i]], lp[i, : left[i]]) for i, r in enumerate(partial)}
            for r in range(len(d)):
                u, j = drafted[r // G], r % G
                k = int(cut[r])
                x, lp_r = d_ids[r, :k], d_new[r, :k]
                if r in cont:
                    x, lp_r = torch.cat([x, cont[r][0]]), torch.cat([lp_r, cont[r][1]])
                rows_ids[u * G + j], rows_lp[u * G + j] = x, lp_r
        model.train(was_training)
        completion = _pad_right([x[None] for x in rows_ids], pad)
        logprobs = _pad_right([x[None].float() for x in rows_lp], 0.0)
        out = _finish(
            tokenizer, ids.repeat_interleave(G, 0), pmask.repeat_interleave(G, 0), completion, logprobs, eos_ids
        )
        for u, p in enumerate(prompts):
            rows = slice(u * G, (u + 1) * G)
            self.cache.put(p, out.completion_ids[rows], out.logprobs[rows], out.completion_mask[rows])
        n_rows = U * G
        stats.update(
            {
                "spec/accepted_frac": accepted / drafted_tokens if drafted_tokens else 0.0,
                "spec/reused_tokens_mean": accepted / n_rows,
                "spec/reused_token_frac": accepted / max(float(out.completion_mask.sum()), 1.0),
                "spec/full_reuse_frac": full / n_rows,
                "time/spec_verify_s": verify_s,
            }
        )
        out.stats = stats
        return out

    def _verify(self, model, token_logprobs, p_ids, p_mask, d_ids, d_mask, G):
        """π_new's (N, T) log-probs of the drafts at the sampling temperature, ``verify_micro_batch`` rows (whole
        groups) per forward, each prompt run once per group, under the caller's autocast."""
        device = p_ids.device
        autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        n = self.speculative.verify_micro_batch
        step = max(G, n // G * G) if n else p_ids.shape[0]
        parts = []
        for i in range(0, p_ids.shape[0], step):
            s = slice(i, i + step)
            lp, _ = token_logprobs(
                model, p_ids[s], p_mask[s], d_ids[s], d_mask[s], self.temperature, autocast_dtype=autocast
            )
            parts.append(lp.float() * d_mask[s])
        return torch.cat(parts)

    def state_dict(self) -> dict | None:
        """The speculative-reuse cache (None without one): saved with checkpoints."""
        return {"speculative_cache": self.cache.state_dict()} if self.cache is not None else None

    def load_state_dict(self, state: dict | None) -> None:
        if self.cache is not None and state and "speculative_cache" in state:
            self.cache.load_state_dict(state["speculative_cache"])

    def _generate(self, model, tokenizer, rows, greedy, max_new_tokens) -> RolloutOutput:
        enc, eos_ids = self._encode(model, tokenizer, rows)
        recorder = SampledLogprobRecorder(self.temperature)
        processors = [recorder]
        scheduled = None  # a per-token temperature schedule: before the recorder, which then records log π_τt
        if self._token_temperature is not None and not greedy:
            scheduled = TokenTemperatureProcessor(self._token_temperature, self.temperature, enc["input_ids"].shape[1])
            processors.insert(0, scheduled)
        mask = getattr(self, "action_mask", None)  # NLPO: sampling restricted to the masking policy's top-p
        if mask is not None and not greedy:
            processors.insert(0, mask.processor(enc["attention_mask"]))  # before the recorder: renormalised log-probs
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos_ids,
            logits_processor=LogitsProcessorList(processors),
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
        out = _finish(tokenizer, enc["input_ids"], enc["attention_mask"], completion, logprobs, eos_ids)
        if scheduled is not None:
            out.temperatures = scheduled.temperatures()
        return out


def _finish(tokenizer, prompt_ids, prompt_mask, completion, logprobs, eos_ids) -> RolloutOutput:
    """Mask everything after each row's first EOS, decode the texts."""
    mask, truncated = completion_mask_from_ids(completion, eos_ids)
    completion = torch.where(mask.bool(), completion, torch.full_like(completion, tokenizer.pad_token_id))
    texts = tokenizer.batch_decode(completion, skip_special_tokens=True)
    # where, not a product: past EOS a masking processor (NLPO) may have made the forced pad token's log-prob −inf
    logprobs = torch.where(mask.bool(), logprobs.to(completion.device), torch.zeros((), device=completion.device))
    return RolloutOutput(prompt_ids, prompt_mask, completion, mask, logprobs, truncated, texts)


def _pad_right(parts: list[torch.Tensor], value) -> torch.Tensor:
    """Row-wise concatenation of (n, t) tensors, each right-padded with ``value`` to the widest."""
    w = max(t.shape[1] for t in parts)
    return torch.cat([torch.nn.functional.pad(t, (0, w - t.shape[1]), value=value) for t in parts])


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
        {k: max(p.stats.get(k, 0.0) for p in parts) for k in parts[0].stats},  # per call: the largest
        pad([p.temperatures for p in parts], False) if all(p.temperatures is not None for p in parts) else None,
    )
