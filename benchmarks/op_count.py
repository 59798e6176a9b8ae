"""Count the ATen ops one training forward/backward dispatches: rlexp's shared-prompt path, its
one-forward-per-row path, and TRL's form (one forward, full log-softmax). On a GPU a small model's
training step is bound by launching kernels, so the op count stands in for its host time; this is
what ``trainer.share_prompt_forward=null`` (shared on the CPU, not on CUDA) rests on.

    python benchmarks/op_count.py            # SmolLM2-135M (the offline default), 2 prompts x 8 x 16 tokens

Measured (session 3, CPU): shared 15,763 top-level ops, per row 8,346, TRL's form 7,128."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf
from torch.profiler import profile

from rlexp.models.loading import load_model
from rlexp.rollout.hf import HFRollout
from rlexp.train import CONF_DIR
from rlexp.trainer.policy import token_logprobs


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    lm = load_model(OmegaConf.load(f"{CONF_DIR}/model/smollm2_135m.yaml"), torch.device("cpu"))
    model, tok = lm.model, lm.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in ("What is 3 + 4?", "What is 12 * 3?")]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = HFRollout(max_new_tokens=16).generate(model, tok, prompts, 8)

    def ours(share: bool):
        lp, _ = token_logprobs(model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, 1.0,
                               with_entropy=True, autocast_dtype=torch.bfloat16, share_prompts=share)
        (lp * out.completion_mask).sum().backward()

    def trl_form():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ids = torch.cat([out.prompt_ids, out.completion_ids], 1)
            mask = torch.cat([out.prompt_mask, out.completion_mask], 1)
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=out.completion_ids.shape[1] + 1).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, out.completion_ids[..., None]).squeeze(-1)
        (lp * out.completion_mask).sum().backward()

    for name, fn in (("shared prompt forward", lambda: ours(True)), ("one forward per row", lambda: ours(False)),
                     ("TRL's form", trl_form)):
        fn()   # warm
        with profile() as prof:
            fn()
        events = [e for e in prof.events() if e.name.startswith("aten::")]
        top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
        print(f"{name:22s} top-level ATen ops {len(top):6d}   all ATen ops {len(events):6d}")


if __name__ == "__main__":
    main()
