"""Infinite Sampling's micro sampling groups on this CPU: one rollout of U prompts × G completions decoded whole
(micro_group_size = G) or in rounds of g (``rollout.micro_group_size``), each in a fresh process. Reports the
wall time, the peak growth of the process's resident memory during the rollout (sampled every 2 ms by a thread),
the KV cache the decode loop allocated (``rollout/kv_cache_mb``) and whether the tokens equal the whole group's.

    python benchmarks/micro_groups.py --model tiny --prompts 8 --group 32 --tokens 64 --sizes 32,8,2
    python benchmarks/micro_groups.py --model smollm2_135m --prompts 4 --group 16 --tokens 48 --sizes 16,4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(model: str, prompts: int, group: int, tokens: int, size: int, threads: int) -> dict:
    import torch
    from omegaconf import OmegaConf

    from rlexp.config.paths import CONF_DIR
    from rlexp.data.sources import reasoning_gym_task
    from rlexp.models.loading import load_model
    from rlexp.rollout.hf import HFRollout

    torch.set_num_threads(threads)
    lm = load_model(OmegaConf.load(f"{CONF_DIR}/model/{model}.yaml"), torch.device("cpu"))
    data = reasoning_gym_task(name="basic_arithmetic", seed=0, train_size=prompts, eval_size=1)
    texts = [
        lm.tokenizer.apply_chat_template(
            [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
        )
        for r in data.train[:prompts]
    ]
    rollout = HFRollout(max_new_tokens=tokens, temperature=0.7, micro_group_size=size, inference_dtype=None)
    base, peak, stop = rss_mb(), [0.0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.002)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    out = rollout.generate(lm.model, lm.tokenizer, texts, group)
    seconds = time.perf_counter() - t0
    stop.set()
    w.join()
    return {
        "size": size,
        "seconds": seconds,
        "peak_rss_growth_mb": max(peak[0], rss_mb()) - base,
        "kv_cache_mb": out.stats["rollout/kv_cache_mb"],
        "rounds": out.stats["rollout/micro_groups"],
        "tokens": out.completion_ids.tolist(),
        "completion_tokens": int(out.completion_mask.sum()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--sizes", default="32,8,2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.model, a.prompts, a.group, a.tokens, a.one, a.threads)))
        return
    rows = []
    for size in [int(s) for s in a.sizes.split(",")]:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--one", str(size)]
        rows.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]))
    whole = rows[0]["tokens"]
    print(f"{a.model}: {a.prompts} prompts x G={a.group} x {a.tokens} new tokens, {a.threads} threads, fp32")
    print("| micro_group_size | rounds | time (s) | peak RSS growth (MB) | KV cache (MB) | tokens = first row's |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['size']} | {r['rounds']:.0f} | {r['seconds']:.1f} | {r['peak_rss_growth_mb']:.0f} | "
            f"{r['kv_cache_mb']:.1f} | {r['tokens'] == whole} |"
        )


if __name__ == "__main__":
    main()
