"""Rollout with vLLM (Efficient Memory Management for LLM Serving with PagedAttention, 2023),
colocated with the trainer on the same GPU, for users with GPUs.

Written against vLLM's documented offline API (``vllm.LLM``, ``SamplingParams``, token-id prompts,
``logprobs=0`` returning the sampled token's log-prob, ``logprobs_mode="processed_logprobs"`` so the
log-prob is taken after temperature scaling — the distribution our ratio uses). The engine runs in
this process (``distributed_executor_backend="external_launcher"``, a world of one: vLLM's default
V1 engine would run the model in a separate process, out of reach of the weight push; TRL's colocate
mode does the same). Before every ``generate`` the policy's current weights are pushed into the
engine (``load_weights`` on the engine's model, then ``reset_prefix_cache`` so no KV computed with
stale weights is reused). With ``enable_sleep_mode`` the engine sleeps at level 2 (weights and KV
cache released) outside ``generate``, so training gets the GPU memory back.

vLLM cannot be installed on the project's CPU machines and its GPU machines cannot download it, so
the suite checks only that the config composes and that using it without vllm names what is missing;
the GPU test (tests/rollout/test_vllm.py) needs vllm and CUDA. It is kept behind the same interface as
``HFRollout`` so nothing else depends on it.
"""

from __future__ import annotations

import torch

from rlexp.rollout.hf import RolloutOutput


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
    ):
        if max_new_tokens <= 0:
            raise ValueError(f"rollout.max_new_tokens must be > 0, got {max_new_tokens}")
        if temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0, got {temperature}")
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.sleep = enable_sleep_mode
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
        )
        self.llm = None

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

    def _engine(self, model):
        if self.llm is None:
            try:
                from vllm import LLM
            except ImportError as e:
                raise ImportError("rollout=vllm needs the vllm package (pip install vllm) and a CUDA GPU") from e
            import os

            for key, value in (
                ("RANK", "0"),
                ("LOCAL_RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", str(_free_port())),
            ):
                os.environ.setdefault(key, value)  # the external launcher's world: this process alone
            self.llm = LLM(model=model.name_or_path, **self.engine_kwargs)
            if self.sleep:
                self.llm.sleep(level=2)
        return self.llm

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        llm = self._engine(model)
        if self.sleep:
            llm.wake_up(tags=["weights"])  # level 2 discarded them: map memory, then push the policy's
        engine_model = llm.llm_engine.model_executor.driver_worker.model_runner.model
        from rlexp.models.peft import is_peft, merged_state_dict

        # LoRA: vLLM takes the base weights with the adapters merged in, under the base model's names
        state = merged_state_dict(model) if is_peft(model) else model.state_dict()
        engine_model.load_weights(((name, p.detach()) for name, p in state.items()))
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
        self.sync_weights(model)  # first: makes the engine, or says that vllm is missing
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
        if self.sleep:
            self.llm.wake_up(tags=["kv_cache"])
        try:
            outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in enc], params, use_tqdm=False)
        finally:
            if self.sleep:
                self.llm.sleep(level=2)  # give training the memory back
        device = next(model.parameters()).device
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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
