"""Count the ATen ops one training forward/backward dispatches: rlexp's shared-prompt path, its
one-forward-per-row path, and TRL's form (one forward, full log-softmax). On a GPU a small model's
training step is bound by launching kernels, so the op count stands in for its host time; this is
what ``trainer.share_prompt_forward=null`` (shared on the CPU, not on CUDA) rests on.

    python benchmarks/op_count.py            # SmolLM2-135M (the offline default), 2 prompts x 8 x 16 tokens
    python benchmarks/op_count.py --cuda-chunks   # log-prob chunks sized as on CUDA (2^26 logits)

Measured (session 3, CPU): shared 15,763 top-level ops, per row 8,346, TRL's form 7,128. Session 4: the
per-row path's extra ~1,200 ops are the log-prob chunks (``selected_logprobs``: 2^18 logits per chunk
on the CPU = 5 rows of SmolLM2's vocabulary, so 52 chunks of ~11 slicing/copy/reduction ops each for
these 256 tokens). With CUDA's 2^26-logit chunks (``--cuda-chunks``, one chunk here): shared 14,097,
per row 6,655, TRL's form 7,128 — on CUDA our per-row forward/backward dispatches 7 % fewer ops than
TRL's."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from torch.profiler import profile

from rlexp.config.paths import CONF_DIR
from rlexp.core.forward import token_logprobs
from rlexp.models.loading import load_model
from rlexp.rollout.hf import HFRollout


def main() -> None:
    import sys

    if "--cuda-chunks" in sys.argv:  # the chunk size selected_logprobs picks on CUDA
        import functools

        import rlexp.core.forward as policy

        policy.selected_logprobs = functools.partial(policy.selected_logprobs, chunk_elements=2**26)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    lm = load_model(OmegaConf.load(f"{CONF_DIR}/model/smollm2_135m.yaml"), torch.device("cpu"))
    model, tok = lm.model, lm.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in ("What is 3 + 4?", "What is 12 * 3?")
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = HFRollout(max_new_tokens=16).generate(model, tok, prompts, 8)

    def ours(share: bool):
        lp, _ = token_logprobs(
            model,
            out.prompt_ids,
            out.prompt_mask,
            out.completion_ids,
            out.completion_mask,
            1.0,
            with_entropy=True,
            autocast_dtype=torch.bfloat16,
            share_prompts=share,
        )
        (lp * out.completion_mask).sum().backward()

    def trl_form():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ids = torch.cat([out.prompt_ids, out.completion_ids], 1)
            mask = torch.cat([out.prompt_mask, out.completion_mask], 1)
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=out.completion_ids.shape[1] + 1).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, out.completion_ids[..., None]).squeeze(-1)
        (lp * out.completion_mask).sum().backward()

    for name, fn in (
        ("shared prompt forward", lambda: ours(True)),
        ("one forward per row", lambda: ours(False)),
        ("TRL's form", trl_form),
    ):
        fn()  # warm
        with profile() as prof:
            fn()
        events = [e for e in prof.events() if e.name.startswith("aten::")]
        top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
        print(f"{name:22s} top-level ATen ops {len(top):6d}   all ATen ops {len(events):6d}")


if __name__ == "__main__":
    main()
