"""Time policy_update, the train phase of one default GRPO step (64 rows of 8 groups, 40 prompt + up to 24 completion
tokens, bf16 autocast, shared prompt forward), on a fixed synthetic batch with SmolLM2, in whichever rlexp tree is
first on sys.path (works with the trees before and after the restructure). Prints the median of 5 after 1 warm-up:

    PYTHONPATH=<tree> python benchmarks/train_phase_ab.py <label>
"""

import statistics
import sys
import time

import torch
from omegaconf import OmegaConf

try:
    from rlexp.config.paths import CONF_DIR
    from rlexp.core.batch import RolloutBatch
except ImportError:
    from rlexp.algorithms.batch import RolloutBatch
    from rlexp.train import CONF_DIR
from hydra.utils import instantiate

from rlexp.models.loading import load_model
from rlexp.trainer.optimize import policy_update

torch.manual_seed(0)
lm = load_model(OmegaConf.load(f"{CONF_DIR}/model/smollm2_135m.yaml"), torch.device("cpu"))
model = lm.model
algo = instantiate(OmegaConf.load(f"{CONF_DIR}/algorithm/grpo.yaml"), _convert_="all")
N, P, T = 64, 40, 24
g = torch.Generator().manual_seed(0)
prompt = torch.randint(10, 40000, (8, P), generator=g).repeat_interleave(8, 0)
lengths = torch.randint(4, T + 1, (N,), generator=g)
cmask = (torch.arange(T)[None] < lengths[:, None]).long()
batch = RolloutBatch(
    prompt_ids=prompt,
    prompt_mask=torch.ones(N, P, dtype=torch.long),
    completion_ids=torch.randint(10, 40000, (N, T), generator=g) * cmask,
    completion_mask=cmask,
    sampling_logprobs=-torch.rand(N, T, generator=g) * cmask,
    truncated=torch.zeros(N, dtype=torch.bool),
    group_ids=torch.arange(8).repeat_interleave(8),
    prompts=[""] * N,
    completions=[""] * N,
    records=[{}] * N,
)
batch.reward = torch.rand(N, generator=g)
batch.advantages = algo.advantage(batch)
opt = torch.optim.AdamW(model.parameters(), lr=1e-9)
times = []
for i in range(6):
    t = time.perf_counter()
    policy_update(
        model,
        opt,
        None,
        batch,
        algo,
        mu=1,
        micro_batch=32,
        temperature=1.0,
        max_grad_norm=1.0,
        autocast_dtype=torch.bfloat16,
        share_prompts=True,
    )
    times.append(time.perf_counter() - t)
print(
    sys.argv[1], "train phase s:", [round(x, 2) for x in times], "median of 5:", round(statistics.median(times[1:]), 3)
)
