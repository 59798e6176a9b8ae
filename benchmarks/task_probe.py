"""How well does the untrained model do on a task? Greedy accuracy on the held-out split and the sampled pass rate
(temperature 1, G samples per prompt: the fraction of groups with a correct sample is what GRPO can learn from),
for one or more config variants. Used to choose the default task (issue 30).

    python benchmarks/task_probe.py --n 64 --g 8 \\
        "dataset.options.max_digits=1" "dataset.options.max_digits=2" "prompt=boxed"

Each positional argument is a space-separated list of train-app overrides; prints one line per variant."""

from __future__ import annotations

import argparse
import shlex
import time

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from rlexp.config.paths import CONF_DIR
from rlexp.models.loading import load_model
from rlexp.rewards.terms import Sample
from rlexp.runs.setup import build_reward_term


def probe(overrides: list[str], n: int, g: int, loaded=None) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    data = instantiate(cfg.dataset)
    fmt = instantiate(cfg.prompt)
    rollout = instantiate(cfg.rollout)
    acc = build_reward_term(cfg.reward.terms.accuracy, "reward.terms.accuracy")
    fmt_term = (
        build_reward_term(cfg.reward.terms.format, "reward.terms.format") if "format" in cfg.reward.terms else None
    )
    loaded = loaded or load_model(cfg.model, torch.device("cpu"))
    model, tok = loaded.model, loaded.tokenizer
    records = data.eval[:n]
    prompts = [fmt.render(tok, r["question"]) for r in records]
    t0 = time.time()
    greedy = rollout.generate(model, tok, prompts, 1, greedy=True, max_new_tokens=cfg.trainer.max_new_tokens)
    lengths = greedy.completion_mask.sum(-1).tolist()
    samples = [
        Sample(p, c, r, i, int(m), bool(t))
        for i, (p, c, r, m, t) in enumerate(zip(prompts, greedy.texts, records, lengths, greedy.truncated.tolist()))
    ]
    greedy_acc = sum(acc(samples).scores) / n
    greedy_fmt = sum(fmt_term(samples).scores) / n if fmt_term else float("nan")
    torch.manual_seed(0)
    sampled = rollout.generate(model, tok, prompts, g, max_new_tokens=cfg.trainer.max_new_tokens)
    slen = sampled.completion_mask.sum(-1).tolist()
    srecs = [records[i // g] for i in range(n * g)]
    sprompts = [prompts[i // g] for i in range(n * g)]
    ss = [
        Sample(p, c, r, i // g, int(m), bool(t))
        for i, (p, c, r, m, t) in enumerate(zip(sprompts, sampled.texts, srecs, slen, sampled.truncated.tolist()))
    ]
    scores = acc(ss).scores
    per_group = [scores[i * g : (i + 1) * g] for i in range(n)]
    return {
        "overrides": " ".join(overrides),
        "greedy_acc": greedy_acc,
        "greedy_format": greedy_fmt,
        "greedy_len": sum(lengths) / n,
        "sampled_acc": sum(scores) / len(scores),
        "groups_with_a_correct": sum(any(s > 0 for s in grp) for grp in per_group) / n,
        "groups_mixed": sum(0 < sum(grp) < g for grp in per_group) / n,
        "seconds": round(time.time() - t0, 1),
        "example": greedy.texts[0][:160].replace("\n", "\\n"),
    }, loaded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="*", default=[""])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--g", type=int, default=8)
    args = ap.parse_args()
    loaded = None
    for v in args.variants:
        result, loaded = probe(shlex.split(v), args.n, args.g, loaded)
        print({k: round(x, 3) if isinstance(x, float) else x for k, x in result.items()}, flush=True)


if __name__ == "__main__":
    main()
