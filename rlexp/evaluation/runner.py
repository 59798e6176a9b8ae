"""Benchmark evaluation: n samples per problem → extracted answers → checker → pass@k, maj@k,
accuracy (+ bootstrap CI), length, truncation and consistency per benchmark; a per-problem JSONL
(prompt, samples, extracted answers, correctness) and a ``summary.json`` in the output directory.

Used by ``rlexp eval`` and, as ``evaluator(model, tokenizer, step)``, by the training loop
(``trainer.eval_every``). Metric names: ``eval/<benchmark>/<metric>`` with ``pass_at_k`` /
``maj_at_k`` for pass@k / maj@k (MLflow names cannot contain ``@``), ``accuracy``,
``pass_at_1_ci_low``/``_high``, ``length/mean``, ``length/median``, ``length/truncated_frac``,
``consistency/*`` (see ``evaluation.consistency``); with several benchmarks also ``eval/mean/*``
(the unweighted mean over benchmarks of accuracy and pass_at_1).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlexp.core.progress import Bars
from rlexp.evaluation.benchmarks import Benchmark
from rlexp.evaluation.metrics import cluster_answers, summarize

log = logging.getLogger(__name__)

CORRECT = 1.0 - 1e-9  # a sample is correct when its checker score reaches 1 (reasoning-gym gives partial credit)


@dataclass
class EvalSettings:
    n: int = 1  # samples per problem
    ks: list[int] | None = None  # pass@k for these k <= n (None: every k in 1..n)
    maj_ks: list[int] | None = None  # maj@k for these k <= n (None: k = n)
    maj_tie: str = "random"  # random (expected value over tied answers) | first (verl)
    maj_missing: str = "abstain"  # a missing answer abstains | vote: it is a (wrong) vote (verl)
    max_subsets: int = 2000  # maj@k: exact over all k-subsets up to this many, else sampled
    greedy: bool | None = None  # None: greedy iff n == 1
    max_new_tokens: int | None = None  # None: the benchmark's, else the rollout's
    limit: int | None = None  # problems per benchmark (None: the benchmark's limit / all)
    batch_problems: int = 8  # problems per generate call (each with n samples)
    bootstrap: int = 1000  # bootstrap resamples for the pass@1 CI (0: off)
    ci_level: float = 0.95
    seed: int = 0
    write_samples: bool = True
    paraphrases: int = 0  # each problem asked again in this many other wordings (rlexp.evaluation.paraphrase)
    paraphrase_source: str = "template"

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"eval.n={self.n} must be >= 1")
        if self.batch_problems < 1:
            raise ValueError(f"eval.batch_problems={self.batch_problems} must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"eval.limit={self.limit} must be >= 1 (or null)")
        if self.maj_tie not in ("random", "first"):
            raise ValueError(f"eval.maj_tie={self.maj_tie!r} is not one of ('random', 'first')")
        if self.maj_missing not in ("abstain", "vote"):
            raise ValueError(f"eval.maj_missing={self.maj_missing!r} is not one of ('abstain', 'vote')")
        from rlexp.config.schema import check_eval_ks

        check_eval_ks(self.n, self.ks, self.maj_ks)  # every k in 1..n (ConfigError naming eval.ks and eval.n)


@dataclass
class EvalResult:
    metrics: dict[str, float] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


class BenchmarkEvaluator:
    """Evaluates ``benchmarks`` with ``rollout``; ``consistency`` is a ``ConsistencyMeter`` or None.
    ``exclude_questions`` drops problems whose question is in it (a training run's own data)."""

    def __init__(
        self,
        benchmarks: dict[str, Benchmark],
        rollout,
        settings: EvalSettings,
        consistency=None,
        out_dir: str | Path | None = None,
        exclude_questions=(),
        prefix: str = "eval",
        progress: bool = False,
    ):
        if not benchmarks:
            raise ValueError("benchmark: no benchmark selected (e.g. benchmark=offline)")
        self.benchmarks, self.rollout, self.s = benchmarks, rollout, settings
        self.consistency, self.prefix = consistency, prefix
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.exclude = frozenset(exclude_questions)
        self.progress = progress  # bars per benchmark and problem batch (off inside a training run's own bar)

    def __call__(self, model, tokenizer, step: int) -> dict[str, float]:
        out = self.out_dir / f"step_{step:06d}" if self.out_dir is not None else None
        return self.evaluate(model, tokenizer, step, out).metrics

    def evaluate(self, model, tokenizer, step: int = 0, out_dir: str | Path | None = None) -> EvalResult:
        result = EvalResult()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        bars = Bars(self.progress, log)
        # sampling here must not move the training RNG
        with torch.random.fork_rng(devices=devices), bars:
            overall = bars.add("benchmarks", len(self.benchmarks)) if len(self.benchmarks) > 1 else None
            for name, bench in self.benchmarks.items():
                torch.manual_seed(self.s.seed)
                t0 = time.perf_counter()
                metrics, rows = self.run_benchmark(bench, model, tokenizer, bars)
                if overall is not None:
                    bars.advance(overall, info=name)
                metrics["time_s"] = time.perf_counter() - t0
                result.metrics.update({f"{self.prefix}/{name}/{k}": v for k, v in metrics.items()})
                if out_dir is not None and self.s.write_samples:
                    path = Path(out_dir) / f"{name}.jsonl"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with path.open("w") as f:
                        for row in rows:
                            f.write(json.dumps(row, default=str) + "\n")
                    result.files.append(path)
                log.info(
                    "eval %s (step %d): %s",
                    name,
                    step,
                    {
                        k: round(v, 4)
                        for k, v in metrics.items()
                        if k in ("accuracy", "pass_at_1", f"maj_at_{self.s.n}")
                    },
                )
        if len(self.benchmarks) > 1:
            for key in ("accuracy", "pass_at_1"):
                vals = [
                    result.metrics[f"{self.prefix}/{b}/{key}"]
                    for b in self.benchmarks
                    if f"{self.prefix}/{b}/{key}" in result.metrics
                ]
                if vals:
                    result.metrics[f"{self.prefix}/mean/{key}"] = float(np.mean(vals))
        if out_dir is not None:
            summary = Path(out_dir) / "summary.json"
            summary.parent.mkdir(parents=True, exist_ok=True)
            summary.write_text(json.dumps({"step": step, "metrics": result.metrics}, indent=2))
            result.files.append(summary)
        return result

    # ---- one benchmark ---------------------------------------------------------------------------
    def run_benchmark(self, bench: Benchmark, model, tokenizer, bars: Bars | None = None) -> tuple[dict, list[dict]]:
        s, n = self.s, self.s.n
        records = bench.records(s.limit, self.exclude)
        if not records:
            raise ValueError(
                f"benchmark.{bench.name}: no problems left (limit={s.limit}, {len(self.exclude)} excluded)"
            )
        prompts = [bench.prompt.render(tokenizer, r["question"]) for r in records]
        greedy = (n == 1) if s.greedy is None else s.greedy
        log.info("eval %s: %d problems x %d %s samples", bench.name, len(records), n, "greedy" if greedy else "sampled")
        max_new = s.max_new_tokens or bench.max_new_tokens
        check_prompt_lengths(bench.name, records, prompts, model, tokenizer, max_new or self.rollout.max_new_tokens)
        texts, lengths, truncated = [], [], []
        bars = bars or Bars(enabled=False)
        task = bars.add(f"eval {bench.name}", len(prompts), unit=" problems")
        for i in range(0, len(prompts), s.batch_problems):
            out = self.rollout.generate(
                model, tokenizer, prompts[i : i + s.batch_problems], n, greedy=greedy, max_new_tokens=max_new
            )
            texts.extend(out.texts)
            lengths.extend(out.completion_mask.sum(-1).tolist())
            truncated.extend(out.truncated.tolist())
            bars.update(task, min(i + s.batch_problems, len(prompts)), info=f"x {n} samples")
        recs_rep = [r for r in records for _ in range(n)]
        answers = [bench.extractor(c, r) for c, r in zip(texts, recs_rep)]
        scores = bench.checker.check(answers, recs_rep)
        exec_status = list(getattr(bench.checker, "last_results", None) or [None] * len(texts))
        correct = [float(sc >= CORRECT) for sc in scores]
        grid = lambda xs: [xs[p * n : (p + 1) * n] for p in range(len(records))]
        vote = bench.answer_format is not None
        clusters, correct_of = None, None
        if vote:
            clusters, correct_of = [], []
            for p, rec in enumerate(records):
                cl = cluster_answers(
                    answers[p * n : (p + 1) * n], lambda a, b, r=rec: bench.checker.equivalent(a, b, r)
                )
                co = {}
                for cid, ok in zip(cl, correct[p * n : (p + 1) * n]):
                    if cid is not None:
                        co.setdefault(cid, ok)
                clusters.append(cl)
                correct_of.append(co)
        metrics = summarize(
            grid(correct),
            clusters,
            correct_of,
            grid(lengths),
            grid(truncated),
            s.ks,
            s.maj_ks,
            s.maj_tie,
            s.max_subsets,
            s.bootstrap,
            s.ci_level,
            s.seed,
            s.maj_missing,
        )
        metrics["score_mean"] = float(np.mean(scores))
        metrics["no_answer_frac"] = float(np.mean([a is None for a in answers]))
        if s.paraphrases and vote:
            bars.update(task, len(prompts), info="paraphrases ...")
            metrics.update(self._paraphrase_metrics(bench, model, tokenizer, records, grid(answers), greedy, max_new))
        per = [{} for _ in texts]
        if self.consistency is not None and bench.answer_format is not None:
            bars.update(task, len(prompts), info="consistency rates ...")
            cm, per_c = self.consistency.measure(
                model,
                tokenizer,
                [pr for pr in prompts for _ in range(n)],
                texts,
                bench.answer_format,
                bench.extractor.strict,
                lambda a, b, i: bench.checker.equivalent(a, b, recs_rep[i]),
                records=recs_rep,
            )
            metrics.update(cm)
            per[: len(per_c)] = per_c
            bars.update(task, len(prompts), info="done")
        rows = []
        for p, rec in enumerate(records):
            samples = []
            for j in range(p * n, (p + 1) * n):
                sample = {
                    "completion": texts[j],
                    "answer": answers[j],
                    "score": scores[j],
                    "correct": bool(correct[j]),
                    "num_tokens": int(lengths[j]),
                    "truncated": bool(truncated[j]),
                }
                if exec_status[j] is not None:
                    sample["execution"] = exec_status[j]
                if per[j]:
                    sample["consistency"] = per[j]
                samples.append(sample)
            rows.append(
                {
                    "benchmark": bench.name,
                    "id": rec["id"],
                    "question": rec["question"],
                    "prompt": prompts[p],
                    "gold": rec["answer"],
                    "num_correct": int(sum(correct[p * n : (p + 1) * n])),
                    "samples": samples,
                }
            )
        return metrics, rows

    def _paraphrase_metrics(self, bench, model, tokenizer, records, answers, greedy, max_new) -> dict[str, float]:
        """``paraphrase/accuracy`` and ``paraphrase/agreement`` of one benchmark (``rlexp.evaluation.paraphrase``):
        every problem asked again in ``eval.paraphrases`` other wordings, with the same samples per problem."""
        from rlexp.evaluation.paraphrase import agreement, paraphrased_records

        s, n = self.s, self.s.n
        agree, correct = [], []
        for reworded in paraphrased_records(records, s.paraphrases, s.paraphrase_source, s.seed):
            prompts = [bench.prompt.render(tokenizer, r["question"]) for r in reworded]
            texts = []
            for i in range(0, len(prompts), s.batch_problems):
                chunk = prompts[i : i + s.batch_problems]
                texts += self.rollout.generate(model, tokenizer, chunk, n, greedy=greedy, max_new_tokens=max_new).texts
            reps = [r for r in reworded for _ in range(n)]
            again = [bench.extractor(c, r) for c, r in zip(texts, reps)]
            correct += [float(sc >= CORRECT) for sc in bench.checker.check(again, reps)]
            grid = [again[p * n : (p + 1) * n] for p in range(len(records))]
            agree += agreement(answers, grid, lambda a, b, i: bench.checker.equivalent(a, b, records[i]))
        return {"paraphrase/accuracy": float(np.mean(correct)), "paraphrase/agreement": float(np.mean(agree))}


def check_prompt_lengths(name: str, records: list[dict], prompts: list[str], model, tokenizer, max_new: int) -> None:
    """Refuse, before generating, a problem whose prompt does not leave ``max_new`` tokens in the model's context
    (issue 16: it was generated past the context); one line naming the benchmark, the problem and both lengths."""
    from rlexp.config.schema import ConfigError
    from rlexp.data.lengths import model_context

    context = model_context(model)
    if not context or not prompts:
        return
    room = context - max_new
    near = [i for i, p in enumerate(prompts) if len(p.encode("utf-8")) > room - 16]  # a token is at least a byte
    if not near:
        return
    ids = tokenizer([prompts[i] for i in near], add_special_tokens=False)["input_ids"]
    over = [(i, len(x)) for i, x in zip(near, ids) if len(x) > room]
    if over:
        i, tokens = over[0]
        raise ConfigError(
            f"benchmark.{name} problem {records[i].get('id')!r}: its prompt is {tokens} tokens, more than the "
            f"model's context of {context} tokens minus {max_new} new tokens ({len(over)} of {len(prompts)} problems "
            "are; lower eval.max_new_tokens or evaluate a model with a longer context)"
        )


def settings_from_config(cfg_eval, seed: int) -> EvalSettings:
    """``EvalSettings`` from the ``eval`` config node (keys that are not settings are ignored). In ``rlexp eval``
    the whole config is checked first (``schema.validate_eval``: unknown keys, the device, eval.ks against
    eval.n), before any benchmark or model loads; the train app has checked its own in ``schema.validate``."""
    from dataclasses import fields

    from omegaconf import OmegaConf

    _validate_eval_app(cfg_eval)
    names = {f.name for f in fields(EvalSettings)}
    values = {k: v for k, v in OmegaConf.to_container(cfg_eval, resolve=True).items() if k in names}
    return EvalSettings(**{**values, "seed": seed})


def _validate_eval_app(node) -> None:
    """``schema.validate_eval`` on the whole config of ``rlexp eval`` that ``node`` belongs to (nothing for a node of
    the train app, which ``schema.validate`` has checked, or a plain one)."""
    from omegaconf import DictConfig, OmegaConf

    from rlexp.config.schema import EvalAppConfig, validate_eval

    root = node._get_root() if isinstance(node, DictConfig) else None
    if root is not None and OmegaConf.get_type(root) is EvalAppConfig:
        validate_eval(root)


def build_benchmarks(cfg_benchmark) -> dict[str, Benchmark]:
    """Instantiate every entry under ``benchmark`` (its key is its name); in ``rlexp eval`` after the config's
    checks (``_validate_eval_app``)."""
    from hydra.utils import instantiate
    from omegaconf import DictConfig

    _validate_eval_app(cfg_benchmark)

    if not cfg_benchmark:
        raise ValueError("benchmark: no benchmark selected (e.g. benchmark=offline or benchmark=[gsm8k,math500])")
    out = {}
    for name, node in cfg_benchmark.items():
        if not isinstance(node, DictConfig) or "_target_" not in node:
            raise ValueError(f"benchmark.{name} has no _target_ (is it a benchmark entry?)")
        out[name] = instantiate(node, name=name)
    return out


def training_evaluator(cfg, data, rollout, consistency=None) -> BenchmarkEvaluator:
    """The benchmark evaluator of a training run (``+benchmark=<entry>``, every trainer.eval_every
    steps): per-problem files under <run_dir>/eval/step_<step>/, the run's own training and held-out
    questions excluded, ``eval.temperature`` (when set) through a copy of the rollout."""
    from hydra.utils import instantiate

    if cfg.eval.temperature is not None and cfg.eval.temperature != getattr(rollout, "temperature", None):
        rollout = instantiate(cfg.rollout, temperature=cfg.eval.temperature)
    exclude = {r["question"] for r in [*data.train, *data.eval]}
    return BenchmarkEvaluator(
        build_benchmarks(cfg.benchmark),
        rollout,
        settings_from_config(cfg.eval, cfg.trainer.seed),
        consistency,
        out_dir=Path(cfg.trainer.run_dir) / "eval",
        exclude_questions=exclude,
    )
