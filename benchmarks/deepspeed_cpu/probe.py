"""Does DeepSpeed ZeRO-2/3 step on CPU processes with gloo here? Two optimiser steps of a tiny Llama on 2 processes
with different inputs, a torch AdamW inside the engine; under ZeRO-3 also a different number of forwards per process
inside ``zero.GatheredParameters`` (what a rollout on each process needs) and the consolidated full state dict.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 .venv-deepspeed/bin/torchrun --standalone --nproc_per_node 2 \\
        benchmarks/deepspeed_cpu/probe.py 3

DeepSpeed's CPU backend JIT-compiles its shared-memory collectives op (ninja, c++) at ``init_distributed`` unless it
is marked incompatible first (done below): then nothing is compiled and gloo does the collectives.

Result on the 2-core CPU machine (deepspeed 0.19.8, torch 2.13): accelerator cpu, backend gloo; ZeRO-2 and ZeRO-3
both step (global grad norm 0.5847 on both processes); gathered forwards of uneven counts run; the consolidated state
dict has 21 tensors on the main process (None elsewhere)."""

import sys

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from transformers import LlamaConfig, LlamaForCausalLM

stage = int(sys.argv[1])
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no JIT build of the shm op: gloo only
deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
print(rank, "accelerator", get_accelerator()._name, get_accelerator().communication_backend_name(), flush=True)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    tie_word_embeddings=True,
)
model = LlamaForCausalLM(config)
engine, _, _, _ = deepspeed.initialize(
    model=model,
    optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
    config={
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": stage},
        "gradient_clipping": 1.0,
        "zero_allow_untested_optimizer": True,
    },
)
for i in range(2):
    loss = engine(input_ids=torch.tensor([[1 + rank + i, 2, 3, 4]])).logits.float().logsumexp(-1).mean()
    engine.backward(loss)
    engine.step()
print(rank, "steps ok, global grad norm", engine.get_global_grad_norm(), flush=True)
if stage == 3:
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())), torch.no_grad():
        for _ in range(2 + 3 * rank):  # a different number of forwards per process
            engine.module(input_ids=torch.tensor([[1, 2]]))
    print(rank, "gathered forwards ok", flush=True)
    full = engine._zero3_consolidated_16bit_state_dict()
    print(rank, "consolidated", None if full is None else len(full), flush=True)
