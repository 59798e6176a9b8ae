"""SPEC-RL's speculative rollouts on this CPU: the time of a fresh rollout (no drafts) against the same prompts'
next rollout, which drafts from it (``rollout.speculative_reuse``), with the policy unchanged (every draft
accepted: the verification forward is the whole cost) and with its weights moved by Gaussian noise of the given
scale (drafts cut, the rest decoded).

    python benchmarks/spec_reuse.py --model tiny --prompts 8 --group 8 --tokens 48
    python benchmarks/spec_reuse.py --model smollm2_135m --prompts 4 --group 8 --tokens 48 --noise 0.002
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.data.sources import reasoning_gym_task
from rlexp.models.loading import load_model
from rlexp.rollout.hf import HFRollout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--verify-micro-batch", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lm = load_model(OmegaConf.load(f"{CONF_DIR}/model/{a.model}.yaml"), torch.device("cpu"))
    data = reasoning_gym_task(name="basic_arithmetic", seed=0, train_size=a.prompts, eval_size=1)
    texts = [
        lm.tokenizer.apply_chat_template(
            [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
        )
        for r in data.train[: a.prompts]
    ]
    moved = copy.deepcopy(lm.model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(a.noise * torch.randn(p.shape, generator=g))
    print(f"{a.model}: {a.prompts} prompts x G={a.group} x {a.tokens} new tokens, {a.threads} threads, fp32")
    print("| rollout | time (s) | verify (s) | accepted frac | reused tokens / completion | fully reused |")
    print("|---|---|---|---|---|---|")
    for label, second in (("same policy", lm.model), (f"weights + N(0, {a.noise}^2)", moved)):
        r = HFRollout(
            max_new_tokens=a.tokens,
            temperature=0.7,
            inference_dtype=None,
            speculative_reuse={"enabled": True, "lenience": 1.0, "verify_micro_batch": a.verify_micro_batch},
        )
        torch.manual_seed(0)
        t0 = time.perf_counter()
        r.generate(lm.model, lm.tokenizer, texts, a.group, reuse=True)
        fresh = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = r.generate(second, lm.tokenizer, texts, a.group, reuse=True)
        s = out.stats
        print(f"| fresh | {fresh:.1f} | - | - | - | - |")
        print(
            f"| drafted, {label} | {time.perf_counter() - t0:.1f} | {s['time/spec_verify_s']:.1f} | "
            f"{s['spec/accepted_frac']:.3f} | {s['spec/reused_tokens_mean']:.1f} | {s['spec/full_reuse_frac']:.2f} |"
        )


if __name__ == "__main__":
    main()
