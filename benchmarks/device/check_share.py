"""GPU check: the shared-prompt training forward gives finite gradients equal to the full forward
(tiny model and SmolLM2, with and without bf16 autocast). Prints SHARE_OK or SHARE_BAD last."""

import os

import torch
from omegaconf import OmegaConf

from rlexp.core.forward import token_logprobs
from rlexp.models.loading import load_model
from rlexp.rollout.hf import HFRollout

ok = True
dev = torch.device("cuda")
for name in ("smollm2_135m",):
    cfg = OmegaConf.load(f"conf/model/{name}.yaml")
    if name == "smollm2_135m":
        cfg.gguf_path = os.environ["RLEXP_GGUF"]
    lm = load_model(cfg, dev)
    tok = lm.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {i} + {3 * i}?" * (i + 1)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(4)
    ]
    torch.manual_seed(0)
    out = HFRollout(max_new_tokens=160).generate(lm.model, tok, prompts, 8)
    for ac in (None, torch.bfloat16):
        res = {}
        for share in (False, True):
            lm.model.zero_grad()
            lp, _ = token_logprobs(
                lm.model,
                out.prompt_ids,
                out.prompt_mask,
                out.completion_ids,
                out.completion_mask,
                1.0,
                autocast_dtype=ac,
                share_prompts=share,
            )
            (lp * out.completion_mask).sum().backward()
            g = torch.cat([p.grad.flatten() for p in lm.model.parameters() if p.grad is not None])
            res[share] = (lp * out.completion_mask, g)
        finite = bool(torch.isfinite(res[True][1]).all()) and bool(torch.isfinite(res[False][1]).all())
        rel = float((res[True][1] - res[False][1]).norm() / res[False][1].norm()) if finite else float("nan")
        dlp = float((res[True][0] - res[False][0]).abs().max())
        print(name, "autocast", ac, "finite", finite, "grad rel diff", rel, "logp max diff", dlp, flush=True)
        ok &= finite and rel < (1e-3 if ac is None else 5e-2)
print("SHARE_OK" if ok else "SHARE_BAD")
