"""``rlexp <command> [overrides...]``: dispatches to the command modules of ``rlexp.commands``."""

from __future__ import annotations

import importlib
import os
import sys

USAGE = """usage: rlexp [--verbose] <command> [overrides...]

commands:
  train     train a policy (Hydra app; `rlexp train --help`, `-m` for multiruns)
  eval      evaluate a model or checkpoint on benchmarks (Hydra app; `rlexp eval benchmark=offline eval.n=8`)
  list      list config options (`rlexp list algorithms|models|...`), parts (`rlexp list parts`) or papers
            (`rlexp list papers [--json]`)
  compare   compare runs over seeds: table, markdown/CSV, PNG curves (`rlexp compare --help`)
  reproduce reproduce a paper's claim: the missing runs, the table beside the paper's, the verdict, the claims
            ledger (`rlexp reproduce <experiment> [--scale cpu|gpu] [--dry-run]`; `rlexp reproduce --help`)
  pipeline  train an experiment's stages in order, each its own run from the model the one before saved
            (SFT -> RL, RL -> re-distillation: `rlexp pipeline <experiment> [--out DIR] [--dry-run]`)
  replay    upload the metrics a tracking server missed (`rlexp replay <run_dir>`)
  bench     our trainer vs TRL's GRPOTrainer, step by step (Hydra app; `rlexp bench bench_setting=cpu|gpu|gpu_large`)

An error is one line `error: ...` (exit status 2 for a configuration error, 1 otherwise); `--verbose` (before or
after the command) or HYDRA_FULL_ERROR=1 prints its traceback too.
"""

# command -> (module, whether it is a Hydra app reading sys.argv)
COMMANDS = {
    "train": ("rlexp.commands.train", True),
    "eval": ("rlexp.commands.evaluate", True),
    "bench": ("rlexp.commands.bench", True),
    "list": ("rlexp.commands.listing", False),
    "compare": ("rlexp.commands.compare", False),
    "reproduce": ("rlexp.commands.reproduce", False),
    "pipeline": ("rlexp.commands.pipeline", False),
    "replay": ("rlexp.commands.replay", False),
}


VERBOSE = "--verbose"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = VERBOSE in argv  # a global flag, before or after the command: never passed on (not a Hydra override)
    argv = [a for a in argv if a != VERBOSE]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    cmd, rest = argv[0], argv[1:]
    if os.getcwd() not in sys.path:  # as `python -m rlexp` does: modules beside the user (custom rewards) import
        sys.path.append(os.getcwd())
    if cmd not in COMMANDS:
        print(f"rlexp: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    from rlexp.commands.errors import report, run_command, run_hydra_app, verbose_env

    verbose = verbose or verbose_env()
    module, hydra_app = COMMANDS[cmd]
    try:
        command = importlib.import_module(module)
        if hydra_app:
            run_hydra_app(command.main, [f"rlexp {cmd}", *rest], verbose)
        else:
            run_command(command.main, rest, verbose)
    except KeyboardInterrupt as e:
        sys.exit(stopped(e))
    except Exception as e:  # an import failing (a missing dependency)
        sys.exit(report(e, verbose))


def stopped(e: KeyboardInterrupt) -> int:
    """A run stopped by SIGTERM/SIGINT (``rlexp.trainer.stopping``): one line on stderr, exit 128 + the signal.
    Standard output may be a pipe whose reader died with the same Ctrl-C (``| tee``): it goes to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    try:
        print(f"rlexp: {e or 'interrupted'}", file=sys.stderr)
    except OSError:
        pass
    return getattr(e, "exit_code", 130)


if __name__ == "__main__":
    main()
