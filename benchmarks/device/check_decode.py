"""GPU check of the decode loop (``rollout.engine=loop``) before the benchmark uses it: greedy tokens
against transformers ``generate``, recorded sampling log-probs against the training forward, and new
tokens/s at the bench's GPU shape (16 prompts x 8 x 256). ``DECODE_GRAPH=capture`` checks rlexp's captured
CUDA graph instead of torch.compile. Prints DECODE_OK or DECODE_BAD last."""

import json
import os
import time
import traceback
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlexp.core.forward import token_logprobs
from rlexp.models.loading import load_model
from rlexp.rollout.hf import HFRollout

dev = torch.device(os.environ.get("CHECK_DEVICE", "cuda"))
small = dev.type == "cpu"  # a quick CPU run of this script checks the script itself
cfg = OmegaConf.load("conf/model/smollm2_135m.yaml")
cfg.gguf_path = os.environ["RLEXP_GGUF"]
lm = load_model(cfg, dev)
tok = lm.tokenizer
questions = [
    f"Calculate {17 * i + 3} - {5 * i} * {i % 7 + 2} + {i * i}. Give the final answer after '####'."
    for i in range(2 if small else 16)
]
new_tokens = 12 if small else 256
prompts = [
    tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
    for q in questions
]


def timed(fn):
    torch.cuda.synchronize() if dev.type == "cuda" else None
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    return out, time.perf_counter() - t


def check(graph: str) -> dict:
    """Greedy against generate, then sampling speed and log-probs, for one rollout.decode_graph."""
    print(f"--- decode_graph={graph}")
    loop = HFRollout(
        max_new_tokens=new_tokens,
        engine="loop",
        cache_implementation="static",
        pad_to_multiple_of=64,
        inference_dtype="bfloat16",
        decode_graph=graph,
    )
    ref = HFRollout(max_new_tokens=new_tokens, inference_dtype="bfloat16")
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        # greedy: the static-cache loop (at the bench shape, 16 x 8) against generate (dynamic cache)
        g_ref = ref.generate(lm.model, tok, prompts, 1, greedy=True)
        (g_loop, t_first) = timed(lambda: loop.generate(lm.model, tok, prompts, 8, greedy=True))
        prefix, rows_same = [], 0
        for i in range(len(prompts)):
            a, b = g_ref.completion_ids[i], g_loop.completion_ids[8 * i]
            n = min(len(a), len(b), int(g_ref.completion_mask[i].sum()))
            eq = (a[:n] == b[:n]).int()
            prefix.append(int(eq.cumprod(0).sum()) / max(n, 1))
            same = [bool(torch.equal(g_loop.completion_ids[8 * i], g_loop.completion_ids[8 * i + j])) for j in range(8)]
            rows_same += all(same)
        print(
            f"greedy: identical prefix / generate's length, mean over prompts {sum(prefix) / len(prefix):.2f} "
            f"(bf16; first call incl. compile/capture {t_first:.1f}s); "
            f"prompts whose 8 greedy rows are identical: {rows_same}/{len(prompts)}"
        )
        for a, b in zip(g_ref.texts[:2], g_loop.texts[:16:8]):
            print("  generate:", repr(a[:80]), "\n  loop:    ", repr(b[:80]))
        # sampling at the bench shape; the first call compiles / captures the sampling graph
        calls = []
        for k in range(1 if small else 4):
            torch.manual_seed(k)
            out, dt = timed(lambda: loop.generate(lm.model, tok, prompts, 8))
            n = int(out.completion_mask.sum())
            calls.append({"s": dt, "steps": out.completion_ids.shape[1], "tokens": n})
            print(
                f"loop sample call {k}: {dt:.2f}s, {out.completion_ids.shape[1]} steps, {n} tokens, "
                f"{out.completion_ids.numel() / dt:.0f} row-steps/s, {n / dt:.0f} completion tokens/s"
            )
    lp, _ = token_logprobs(
        lm.model,
        out.prompt_ids,
        out.prompt_mask,
        out.completion_ids,
        out.completion_mask,
        1.0,
        autocast_dtype=torch.bfloat16,
    )
    diff = float(((lp.detach() - out.logprobs).abs() * out.completion_mask).sum() / out.completion_mask.sum())
    finite = bool(out.logprobs.isfinite().all())
    print(f"sampled log-prob vs training forward: mean |diff| {diff:.4f}, finite {finite}")
    greedy_prefix = sum(prefix) / len(prefix)
    good = finite and diff <= 0.1 and greedy_prefix >= 0.5
    steady = calls[1:] or calls
    return {
        "graph": graph,
        "ok": good,
        "first_call_s": t_first,
        "greedy_prefix": greedy_prefix,
        "logprob_mean_abs_diff": diff,
        "sample_calls": calls,
        "row_steps_per_s": sum(c["steps"] for c in steady) * 8 * len(prompts) / sum(c["s"] for c in steady),
    }


# DECODE_GRAPH: one rollout.decode_graph or a comma list (compile | capture | capture_compiled)
results = []
for graph in os.environ.get("DECODE_GRAPH", "compile").split(","):
    try:
        results.append(check(graph))
    except Exception:  # a graph that fails on this machine is reported, the others still run
        traceback.print_exc()
        results.append({"graph": graph, "ok": False, "error": traceback.format_exc(limit=3)})
print("| decode_graph | ok | first call s | row-steps/s (calls 2-4) | greedy prefix | log-prob diff |")
for r in results:
    print(
        f"| {r['graph']} | {r['ok']} | {r.get('first_call_s', float('nan')):.1f} | "
        f"{r.get('row_steps_per_s', float('nan')):.0f} | {r.get('greedy_prefix', float('nan')):.2f} | "
        f"{r.get('logprob_mean_abs_diff', float('nan')):.4f} |"
    )
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "check_decode.json").write_text(json.dumps(results, indent=1) + "\n")
print("DECODE_OK" if all(r["ok"] for r in results) else "DECODE_BAD")
