"""How the policy update's micro-batches are cut, measured on one real rollout: SmolLM2-135M on the
bench's prompts at the GPU setting (16 prompts × G = 8 × 256 new tokens, micro-batch 32), sampled here
on the CPU. For each plan: micro-batches, padded positions the training forward runs (and the share
that is padding), and the CPU time of one forward + backward + gradient clipping of the whole batch
(SGD at lr 0, so every plan sees the same weights).

    python benchmarks/micro_batch_ab.py [--threads 2] [--out results/bench/micro_batches-cpu.md]

Plans: ``groups, per row`` is what CUDA ran before session 5 (whole groups kept together although the
forward is one per row, so every row of a group pads to its longest); ``rows, per row`` is the CUDA
default now (rows cut by length alone); ``≤ N positions`` adds ``trainer.micro_batch_tokens``;
``groups, shared prompt`` is what the CPU ran before (a group's prompt runs once); ``rows, shared
prompt`` cuts by length and shares a prompt among the rows of a micro-batch that repeat it; the CPU
default now takes whichever of the two has fewer positions. TRL pads the whole batch to its longest
prompt and completion (positions only)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

import rlexp.trainer.optimize as optimize
from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.config.paths import CONF_DIR
from rlexp.core.batch import RolloutBatch
from rlexp.models.loading import load_model
from rlexp.rollout.hf import HFRollout
from rlexp.runs.setup import build
from rlexp.samplers.shuffle import PromptSampler
from rlexp.trainer.loop import resolve_autocast


def bench_config():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("bench", overrides=["bench_setting=gpu", "trainer.device=cpu"])


def rollout(cfg, lm, threads: int, cache: Path) -> RolloutBatch:
    """The bench's first step of prompts, G completions each (cached in ``cache``)."""
    if cache.exists():
        return torch.load(cache, weights_only=False)
    t = cfg.trainer
    torch.manual_seed(t.seed)
    data, fmt = build(cfg.dataset, "dataset"), build(cfg.prompt, "prompt")
    records = PromptSampler(data.train, t.prompts_per_step, t.seed).next_batch()
    prompts = [fmt.render(lm.tokenizer, r["question"]) for r in records]
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = HFRollout(max_new_tokens=t.max_new_tokens).generate(lm.model, lm.tokenizer, prompts, t.num_generations)
    print(f"rollout {time.perf_counter() - t0:.0f} s on {threads} threads")
    n = out.completion_ids.shape[0]
    batch = RolloutBatch(
        prompt_ids=out.prompt_ids,
        prompt_mask=out.prompt_mask,
        completion_ids=out.completion_ids,
        completion_mask=out.completion_mask,
        sampling_logprobs=out.logprobs,
        truncated=out.truncated,
        group_ids=torch.arange(n) // t.num_generations,
        prompts=[""] * n,
        completions=out.texts,
        records=[{}] * n,
    )
    torch.save(batch, cache)
    return batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--budget", type=int, default=12288)
    ap.add_argument("--cache", default="/tmp/rlexp_micro_batch_ab.pt")
    ap.add_argument("--out", default="results/bench/micro_batches-cpu.md")
    ap.add_argument("--positions-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=2, help="time every plan this many times, keep the fastest")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = bench_config()
    lm = load_model(cfg.model, torch.device("cpu"))
    model = lm.model
    batch = rollout(cfg, lm, args.threads, Path(args.cache))
    lengths = batch.lengths
    g = torch.Generator().manual_seed(0)
    batch.advantages = torch.randn(len(batch), generator=g)
    autocast = resolve_autocast("auto", next(model.parameters()))
    algo = Algorithm(name="grpo", advantage=grpo, loss=ppo_clip)
    original = optimize.plan_micro_batches

    def planner(keep_groups: bool, share: bool):
        """micro-batches with or without whole groups, and with or without the shared prompt forward"""

        def plan(b, micro, _share, tokens):
            p, pm, cm = b.prompt_ids, b.prompt_mask, b.completion_mask
            rows = plans.micro_batches(
                len(b), micro, b.lengths, tokens, pm.sum(1), b.group_ids if keep_groups else None
            )
            return [plans.MicroBatch(idx, p, pm, cm, share) for idx in rows]

        return plan

    plans = [
        ("groups, per row (CUDA before)", planner(True, False), False, args.micro_batch, None),
        ("rows, per row (CUDA now)", planner(False, False), False, args.micro_batch, None),
        (f"rows, per row, ≤ {args.budget} positions, no row cap", planner(False, False), False, 0, args.budget),
        ("groups, shared prompt (CPU before)", planner(True, True), True, args.micro_batch, None),
        ("rows, shared prompt where rows repeat one", planner(False, True), True, args.micro_batch, None),
        ("shared prompt, the plan with fewer positions (CPU now)", original, True, args.micro_batch, None),
    ]
    best: dict[str, dict] = {}
    for round_ in range(args.rounds):
        for name, plan_fn, share, micro, budget in plans:
            optimize.plan_micro_batches = plan_fn
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            plan = plan_fn(batch, micro, share, budget)
            positions = sum(mb.positions for mb in plan)
            seconds = None
            if not args.positions_only:
                t0 = time.perf_counter()
                m = optimize.policy_update(
                    model,
                    opt,
                    None,
                    batch,
                    algo,
                    mu=1,
                    micro_batch=micro,
                    temperature=1.0,
                    max_grad_norm=1.0,
                    autocast_dtype=autocast,
                    share_prompts=share,
                    micro_batch_tokens=budget,
                )
                seconds = time.perf_counter() - t0
                assert m["train/micro_batches"] == len(plan)
            row = {
                "plan": name,
                "round": round_,
                "micro_batches": len(plan),
                "positions": positions,
                "padding_share": 1 - sum(mb.tokens for mb in plan) / positions,
                "train_s": seconds,
            }
            print(json.dumps(row), flush=True)
            if name not in best or (seconds or 0) < (best[name]["train_s"] or 0):
                best[name] = row
        if args.positions_only:
            break
    optimize.plan_micro_batches = original
    rows = list(best.values())
    p_len, c_len = batch.prompt_mask.sum(1), lengths
    trl = len(batch) * (int(p_len.max()) + int(c_len.max()))
    real = int(p_len.sum() + c_len.sum())
    lines = [
        f"# Micro-batch plans on one SmolLM2 rollout (16 × 8 × 256, micro-batch {args.micro_batch})",
        "",
        f"`python benchmarks/micro_batch_ab.py --threads {args.threads}`: {len(batch)} completions, "
        f"mean length {float(c_len.float().mean()):.1f}, max {int(c_len.max())}, "
        f"{int((c_len == int(c_len.max())).sum())} at the max; prompts {int(p_len.min())}–{int(p_len.max())} tokens. "
        f"Train: one forward + backward + clipping of the whole batch on this CPU ({args.threads} threads, "
        f"autocast {str(autocast).replace('torch.', '')}), the fastest of {args.rounds} rounds over the plans.",
        "",
        "| plan | micro-batches | padded positions | padding share | train s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        t = "-" if r["train_s"] is None else f"{r['train_s']:.1f}"
        lines.append(f"| {r['plan']} | {r['micro_batches']} | {r['positions']:,} | {r['padding_share']:.2f} | {t} |")
    lines.append(
        f"| TRL (whole batch padded) | {len(batch) // args.micro_batch} | {trl:,} | {1 - real / trl:.2f} | - |"
    )
    lines += [
        "",
        "Padded positions: rows × (prompt + completion window) per micro-batch, a shared prompt counted "
        "once; padding share: the part of them that is padding.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
