"""End-of-sweep summary in the sweep directory:

- ``optimization_results.yaml`` — upstream-compatible (``name``, ``best_params``, ``best_value``; or
  ``solutions`` = the Pareto front for several objectives) plus the best trial's number and job
  folder, the trial counts per state, and parameter importances;
- ``trials.csv`` — every trial (Optuna's trials dataframe);
- ``optimization_history*.png``, ``pareto_front.png`` (several objectives), ``param_importances*.png``,
  ``intermediate_values.png`` (when jobs reported per-step values);
- ``summary.md`` — the same in a table, with the optuna-dashboard command.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from pathlib import Path

import optuna
from omegaconf import OmegaConf
from optuna.trial import TrialState

from rlexp.sweeping.storage import redact
from rlexp.trainer.checkpoint import human_size

log = logging.getLogger(__name__)


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_")


def importances(study: optuna.Study, n_objectives: int) -> list[dict[str, float]]:
    """fANOVA parameter importances per objective ({} when there are too few finished trials)."""
    out = []
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    for i in range(n_objectives):
        target = (lambda t, i=i: t.values[i]) if n_objectives > 1 else None
        if len({t.values[i] for t in complete}) < 2:  # fANOVA would split a constant evenly: meaningless
            log.info("parameter importances unavailable: every complete trial scored the same")
            out.append({})
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(study, target=target)
            out.append({k: round(float(v), 4) for k, v in imp.items()})
        except (RuntimeError, ValueError) as e:  # fewer than two complete trials, or no varying parameter
            log.info("parameter importances unavailable: %s", e)
            out.append({})
    return out


def pareto_front(study: optuna.Study) -> list:
    return sorted(study.best_trials, key=lambda t: t.number)


def plots(study: optuna.Study, out: Path, names: list[str]) -> list[str]:
    """PNG figures of the study; returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    written = []
    multi = len(names) > 1
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]

    def save(ax_or_axes, fname):
        ax = ax_or_axes.flat[0] if hasattr(ax_or_axes, "flat") else ax_or_axes
        fig = ax.figure
        fig.set_size_inches(8, 5)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        written.append(fname)

    def attempt(what: str, make, fname: str) -> None:
        try:
            save(make(), fname)
        except Exception as e:  # optuna refuses plots it has no data for
            log.info("no %s plot: %s", what, e)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna's matplotlib backend is marked experimental
        for i, name in enumerate(names):
            target = (lambda t, i=i: t.values[i]) if multi else None
            attempt(
                f"optimisation-history ({name})",
                lambda: ovm.plot_optimization_history(study, target=target, target_name=name),
                f"optimization_history_{_safe(name)}.png" if multi else "optimization_history.png",
            )
        if multi and len(names) in (2, 3) and complete:
            attempt("Pareto-front", lambda: ovm.plot_pareto_front(study, target_names=names), "pareto_front.png")
        if any(t.intermediate_values for t in study.get_trials(deepcopy=False)) and not multi:
            attempt("intermediate-values", lambda: ovm.plot_intermediate_values(study), "intermediate_values.png")
        if len(complete) >= 2:
            for i, name in enumerate(names):
                target = (lambda t, i=i: t.values[i]) if multi else None
                attempt(
                    f"importance ({name})",
                    lambda: ovm.plot_param_importances(study, target=target, target_name=name),
                    f"param_importances_{_safe(name)}.png" if multi else "param_importances.png",
                )
    return written


def write_summary(
    study: optuna.Study, sweep_dir: str, objectives: list[str], storage_url: str, make_plots: bool = True
) -> dict:
    """Write the summary files (module docstring) and return the results dict."""
    out = Path(sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    names = objectives or [f"value_{i}" if len(study.directions) > 1 else "value" for i in range(len(study.directions))]
    directions = [d.name.lower() for d in study.directions]
    counts = dict(Counter(t.state.name for t in trials))
    results: dict = {
        "name": "optuna",
        "study_name": study.study_name,
        "storage": redact(storage_url),
        "objectives": names,
        "directions": directions,
        "trials": counts,
    }
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if len(directions) == 1:
        if complete:
            best = study.best_trial
            results.update(
                best_params=dict(best.params),
                best_value=best.value,
                best_trial=best.number,
                best_job_dir=best.user_attrs.get("job_dir"),
            )
        else:
            results.update(best_params=None, best_value=None, best_trial=None)
    else:
        results["solutions"] = (
            [
                {
                    "number": t.number,
                    "params": dict(t.params),
                    "values": list(t.values),
                    "job_dir": t.user_attrs.get("job_dir"),
                }
                for t in pareto_front(study)
            ]
            if complete
            else []
        )
    results["importances"] = dict(zip(names, importances(study, len(names)))) if len(complete) >= 2 else {}
    from rlexp.sweeping.retention import kept_weights

    results["weights_kept"] = [{"trial": n, "path": str(p), "bytes": b} for n, p, b in kept_weights(study)]
    OmegaConf.save(OmegaConf.create(results), out / "optimization_results.yaml")
    try:
        study.trials_dataframe().to_csv(out / "trials.csv", index=False)
    except Exception as e:  # pandas missing or an exotic attribute type
        log.info("trials.csv not written: %s", e)
    figures = plots(study, out, names) if make_plots and trials else []
    (out / "summary.md").write_text(markdown(results, trials, figures, storage_url))
    _log(results)
    return results


def markdown(results: dict, trials: list, figures: list[str], storage_url: str) -> str:
    names = results["objectives"]
    lines = [
        f"# Sweep `{results['study_name']}`",
        "",
        f"Objectives: {', '.join(f'{n} ({d})' for n, d in zip(names, results['directions']))}  ",
        f"Trials: {', '.join(f'{k} {v}' for k, v in sorted(results['trials'].items()))}  ",
        f"Storage: `{results['storage']}` — browse with `optuna-dashboard {redact(storage_url)}`",
        "",
    ]
    if "solutions" in results:
        lines += (
            ["## Pareto front", ""]
            + [f"- trial {s['number']}: {dict(zip(names, s['values']))} {s['params']}" for s in results["solutions"]]
            + [""]
        )
    elif results.get("best_trial") is not None:
        lines += [
            "## Best trial",
            "",
            f"trial {results['best_trial']}: {names[0]} = {results['best_value']:.6g}  ",
            f"params: `{results['best_params']}`  ",
            f"job: `{results.get('best_job_dir')}`",
            "",
        ]
    kept = results.get("weights_kept") or []
    total = sum(k["bytes"] for k in kept)
    lines += [
        f"Weights kept ({human_size(total)} in all): "
        + (", ".join(f"trial {k['trial']} `{k['path']}` ({human_size(k['bytes'])})" for k in kept) or "none"),
        "",
    ]
    if results.get("importances"):
        lines += ["## Parameter importances (fANOVA)", ""]
        for name, imp in results["importances"].items():
            lines.append(f"- {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in imp.items()))
        lines.append("")
    lines += [
        "## Trials",
        "",
        "| # | state | " + " | ".join(names) + " | params | error |",
        "|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for t in sorted(trials, key=lambda t: t.number):
        vals = list(t.values) if t.values else [None] * len(names)
        cells = [f"{v:.6g}" if isinstance(v, float) else "" for v in vals]
        err = str(t.user_attrs.get("error", "")).replace("|", "/")[:80]
        lines.append(f"| {t.number} | {t.state.name} | " + " | ".join(cells) + f" | {dict(t.params)} | {err} |")
    lines += [""] + [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def _log(results: dict) -> None:
    log.info("Trials: %s", results["trials"])
    if "solutions" in results:
        log.info("Pareto front: %d trial(s)", len(results["solutions"]))
        for s in results["solutions"]:
            log.info("    trial %d: values %s params %s", s["number"], s["values"], s["params"])
    else:
        log.info(
            "Best trial %s: value %s params %s",
            results.get("best_trial"),
            results.get("best_value"),
            results.get("best_params"),
        )
    for name, imp in (results.get("importances") or {}).items():
        log.info("Importances (%s): %s", name, imp)
