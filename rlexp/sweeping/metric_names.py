"""The metric names an ``rlexp train`` job returns, known from its composed config before anything trains, so
that a sweep refuses an objective (or ``report_metric``) it would never find before its first trial.

The check is conservative; it refuses a name only when it is sure:

- in the namespaces whose every name follows from the config (``CLOSED``: ``reward/`` from ``reward.terms``,
  ``eval/`` from ``eval.size``, ``trainer.accuracy_term`` and ``+benchmark``, ``length/``, ``groups/``,
  ``advantage/``), a name that is not one of them;
- below a name that is itself a metric (``accuracy/mean``: ``accuracy`` is the metric);
- anywhere else (algorithm-, stage- and option-specific namespaces: ``loss/``, ``clip/``, ``kl/``,
  ``dynamic_sampling/``, ...; names nobody listed here yet), only a near miss of a known name (one or two
  characters off: ``clip/hgh_frac``). Other names there pass: the job's own check still names a metric it did
  not return (``rlexp.sweeping.objectives``).

A benchmark's metrics (``eval/<bench>/<metric>``) are checked on the benchmark's name; the metric part only
for near misses of ``BENCH_METRICS``. Names are the README's "Metrics" table and ``rlexp.evaluation``'s.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from rlexp.sweeping.objectives import metric_key
from rlexp.sweeping.settings import SweepConfigError

# what every step of a training run logs, whatever the options (rlexp/trainer/metrics.py, loop.py, optimize.py)
ALWAYS = (
    "reward/mean",
    "reward/std",
    "reward/unscored",
    "groups/zero_variance_frac",
    "advantage/mean",
    "advantage/std",
    "advantage/abs_mean",
    "length/mean",
    "length/max",
    "length/min",
    "length/truncated_frac",
    "batch/completions",
    "loss/total",
    "grad_norm",
    "lr",
    "train/micro_batches",
    "train/padding_share",
    "train/optimizer_steps",
    "time/generate_s",
    "time/reward_s",
    "time/train_s",
    "time/step_s",
    "throughput/completion_tokens_per_s",
    "throughput/generate_tokens_per_s",
)
# logged with some algorithms, stages or options: known here for near-miss suggestions, never required
SOMETIMES = (
    "entropy/mean",
    "entropy/selected_frac",
    "kl/mean",
    "kl/reward_penalty_mean",
    "clip/low_frac",
    "clip/high_frac",
    "clip/region_frac",
    "clip/dual_frac",
    "clip/low_seq_min",
    "clip/high_seq_max",
    "clip/bound_frac",
    "ratio/mean",
    "ratio/min",
    "ratio/max",
    "mismatch/kl",
    "mismatch/log_ratio_abs",
    "mismatch/ratio_max",
    "mismatch/ratio_min",
    "mismatch/tokens",
    "topr/tapered_frac",
    "topr/negative_frac",
    "m2po/masked_frac",
    "ce_gppo/preserved_frac",
    "aspo/weight_mean",
    "aspo/dual_clip_pos_frac",
    "aspo/dual_clip_neg_frac",
    "gbpo/abs_gap",
    "gbpo/target_ratio",
    "gbpo/above_median_frac",
    "gbpo/below_median_frac",
    "stable_reinforce/pre_clip_frac",
    "stable_reinforce/filtered_frac",
    "dppo/masked_frac",
    "dppo/truncated_frac",
    "vespo/phi_mean",
    "cov/detached_frac",
    "cov/penalised_frac",
    "overlong/masked_frac",
    "remax/greedy_reward_mean",
    "remax/greedy_length_mean",
    "reference/ema_updates",
    "rollout_correction/weight_mean",
    "rollout_correction/affected_frac",
    "critic/value_loss",
    "critic/values_mean",
    "critic/returns_mean",
    "critic/explained_var",
    "critic/value_clip_frac",
    "critic/grad_norm",
    "critic/lr",
    "consistency/measured",
    "consistency/no_answer_frac",
    "consistency/rederive_rate",
    "consistency/likelihood_mean",
    "consistency/likelihood_rate",
    "consistency/shuffle_rate",
    "consistency/shuffle_measured",
    "dynamic_sampling/rounds",
    "dynamic_sampling/sampled_groups",
    "dynamic_sampling/kept_groups",
    "dynamic_sampling/dropped_groups",
    "dynamic_sampling/varied_frac",
    "time/group_stage_s",
    "time/rollout_wait_s",
    "time/rollout_overlap_s",
    "async/version_lag",
    "time/consistency_s",
    "time/greedy_generate_s",
    "rollout/kv_cache_mb",
    "rollout/micro_groups",
    "spec/drafted_frac",
    "spec/cache_prompts",
    "spec/accepted_frac",
    "spec/reused_tokens_mean",
    "spec/reused_token_frac",
    "spec/full_reuse_frac",
    "time/spec_verify_s",
)
# namespaces whose names all follow from the config: anything else there is refused
CLOSED = ("reward", "eval", "length", "groups", "advantage")
REWARD_TERM_STATS = ("mean", "std", "failures")
# a benchmark's metrics, eval/<bench>/<metric> (rlexp.evaluation.metrics.summarize, evaluation.runner)
BENCH_METRICS = re.compile(
    r"pass_at_\d+|maj_at_\d+|accuracy|pass_at_1_ci_(low|high)|problems|samples_per_problem|score_mean|"
    r"no_answer_frac|time_s|length/(mean|median|truncated_frac)|consistency/\w+"
)
BENCH_EXAMPLES = (
    "accuracy",
    "pass_at_1",
    "maj_at_8",
    "pass_at_1_ci_low",
    "pass_at_1_ci_high",
    "score_mean",
    "no_answer_frac",
    "time_s",
    "length/mean",
    "length/median",
    "length/truncated_frac",
)
ACCURACY_METRICS = (
    "accuracy",
    "eval/accuracy",
    "groups/all_correct_frac",
    "groups/all_wrong_frac",
    "length/correct_mean",
    "length/wrong_mean",
)
NEAR_MISS = 0.9  # difflib ratio from which a name outside the closed namespaces counts as a typo of a known one


class MetricNameError(SweepConfigError):
    """An objective names a metric the sweep's jobs will not return; the message names the key and the metric."""


@dataclass
class ProducedMetrics:
    """What decides the names a train job returns (its final step's metrics and its last evaluation's)."""

    reward_terms: set[str] = field(default_factory=set)
    accuracy_term: bool = False
    greedy_eval: bool = False  # eval.size > 0: eval/accuracy (with an accuracy term), eval/length/*
    benchmarks: set[str] = field(default_factory=set)
    several_benchmarks: bool = False  # eval/mean/{accuracy,pass_at_1}

    def union(self, other: ProducedMetrics | None) -> ProducedMetrics:
        if other is None:
            return self
        return ProducedMetrics(
            self.reward_terms | other.reward_terms,
            self.accuracy_term or other.accuracy_term,
            self.greedy_eval or other.greedy_eval,
            self.benchmarks | other.benchmarks,
            self.several_benchmarks or other.several_benchmarks,
        )

    def names(self) -> set[str]:
        """Every exact name these jobs may return (benchmarks' own metrics aside)."""
        out = set(ALWAYS)
        out |= {f"reward/{t}/{s}" for t in self.reward_terms for s in REWARD_TERM_STATS}
        if self.accuracy_term:
            out |= {"accuracy", "groups/all_correct_frac", "groups/all_wrong_frac"}
            out |= {"length/correct_mean", "length/wrong_mean"}  # when the step has such completions
        if self.greedy_eval:
            out |= {"eval/length/mean", "eval/length/truncated_frac"}
            if self.accuracy_term:  # the gain over the step-0 evaluation (trainer.eval_at_start)
                out |= {"eval/accuracy", "eval/accuracy_gain"}
        if self.several_benchmarks:
            out |= {"eval/mean/accuracy", "eval/mean/pass_at_1"}
        return out

    def evaluates(self) -> bool:
        return self.greedy_eval or bool(self.benchmarks)


def _select(cfg: DictConfig, key: str, default=None):
    try:
        return OmegaConf.select(cfg, key, default=default, throw_on_missing=False)
    except Exception:  # an interpolation only the job can resolve
        return default


def produced_metrics(cfg: DictConfig) -> ProducedMetrics | None:
    """The metric-deciding parts of a composed ``rlexp train`` config; None for another app's config."""
    terms = _select(cfg, "reward.terms")
    trainer = _select(cfg, "trainer")
    if not isinstance(terms, DictConfig) or not isinstance(trainer, DictConfig) or _select(cfg, "eval") is None:
        return None
    names = {str(k) for k in terms.keys()}
    acc = _select(cfg, "trainer.accuracy_term")
    size = _select(cfg, "eval.size", 0)
    try:
        size = int(size or 0)
    except (TypeError, ValueError):
        size = 1  # unknown here: assume evaluation runs (the conservative side)
    bench = _select(cfg, "benchmark")
    benchmarks = {str(k) for k in bench.keys()} if isinstance(bench, DictConfig) else set()
    return ProducedMetrics(names, acc is not None and str(acc) in names, size > 0, benchmarks, len(benchmarks) > 1)


def _close(name: str, candidates: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    return difflib.get_close_matches(name, sorted(set(candidates)), n=n, cutoff=cutoff)


def _near_miss(name: str, candidates: Iterable[str]) -> list[str]:
    return [c for c in _close(name, candidates, n=3, cutoff=NEAR_MISS) if c != name]


def _refuse(key: str, shown: str, why: str, hints: list[str]) -> MetricNameError:
    hint = f"; closest: {', '.join(hints)}" if hints else ""
    return MetricNameError(f"{key}: {shown!r} {why}{hint} (hydra.sweeper.check_objective=false skips this check)")


def check_metric_name(name: str, produced: ProducedMetrics, key: str = "hydra.sweeper.objective") -> None:
    """Raise ``MetricNameError`` (one line naming ``key``, the name and the closest valid names) when the jobs
    described by ``produced`` will surely not return the metric ``name``."""
    shown, m = str(name), metric_key(name)
    exact = produced.names()
    bench_names = {f"eval/{b}/{s}" for b in sorted(produced.benchmarks) for s in BENCH_EXAMPLES}
    candidates = exact | set(SOMETIMES) | bench_names
    if m in exact or m in SOMETIMES:
        return
    parts = m.split("/")
    if parts[0] == "eval" and len(parts) >= 3 and parts[1] in produced.benchmarks:
        metric = "/".join(parts[2:])
        if BENCH_METRICS.fullmatch(metric):
            return
        near = _near_miss(metric, BENCH_EXAMPLES)
        if not near:
            return  # a benchmark metric nobody listed here: the job's own check names it if it is missing
        raise _refuse(key, shown, f"is not a metric of benchmark {parts[1]!r}", [f"eval/{parts[1]}/{x}" for x in near])
    for i in range(1, len(parts)):  # below a metric: accuracy/mean, eval/accuracy/mean
        leaf = "/".join(parts[:i])
        if leaf in candidates:
            why = f"is not a metric ({leaf!r} is one and has no sub-metrics)"
            raise _refuse(key, shown, why, _close(m, candidates))
    if parts[0] == "eval" and not produced.evaluates():
        raise _refuse(
            key,
            shown,
            "needs evaluation, which these trials do not run (eval.size=0, no +benchmark): set eval.size > 0 "
            "or add +benchmark=<entry>",
            [],
        )
    if m in ACCURACY_METRICS and not produced.accuracy_term:
        why = "needs an accuracy term: trainer.accuracy_term is null or not one of reward.terms"
        raise _refuse(key, shown, f"{why} {sorted(produced.reward_terms)}", [])
    if parts[0] in CLOSED:
        why = "is not a metric these trials return"
        if parts[0] == "reward" and len(parts) == 3:
            why += f" (reward terms: {sorted(produced.reward_terms)})"
        elif parts[0] == "eval" and len(parts) >= 3:
            why += f" (benchmarks: {sorted(produced.benchmarks)})" if produced.benchmarks else " (no +benchmark)"
        raise _refuse(key, shown, why, _close(m, candidates))
    if len(parts) == 1 and BENCH_METRICS.fullmatch(m):  # pass@1 without its benchmark
        hints = [f"eval/{b}/{m}" for b in sorted(produced.benchmarks)][:3]
        raise _refuse(key, shown, "is a benchmark metric: name it eval/<benchmark>/" + m, hints)
    near = _near_miss(m, candidates)
    if near:
        raise _refuse(key, shown, "is not a metric these trials return", near)
