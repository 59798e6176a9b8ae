"""`rlexp <command> [hydra overrides...]`: train | eval | list | compare | bench."""
from __future__ import annotations

import sys

USAGE = """usage: rlexp <command> [overrides...]

commands:
  train     train a policy (Hydra app; `rlexp train --help`, `-m` for multiruns)
  eval      evaluate a model or checkpoint on benchmarks (Hydra app; `rlexp eval benchmark=offline eval.n=8`)
  list      list config options: `rlexp list algorithms|models|datasets|rewards|...`
  compare   compare runs over seeds: table, markdown/CSV, PNG curves (`rlexp compare --help`)
  replay    upload the metrics a tracking server missed (`rlexp replay <run_dir>`)
  bench     our trainer vs TRL's GRPOTrainer, step by step (Hydra app; `rlexp bench bench_setting=cpu|gpu|gpu_large`)
"""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        sys.argv = ["rlexp train", *rest]
        from rlexp.train import main as train_main
        train_main()
    elif cmd == "eval":
        sys.argv = ["rlexp eval", *rest]
        from rlexp.evaluate import main as eval_main
        eval_main()
    elif cmd == "list":
        from rlexp.listing import main as list_main
        list_main(rest)
    elif cmd == "compare":
        from rlexp.compare import main as compare_main
        compare_main(rest)
    elif cmd == "bench":
        sys.argv = ["rlexp bench", *rest]
        from rlexp.bench import main as bench_main
        bench_main()
    elif cmd == "replay":
        from rlexp.replay import main as replay_main
        replay_main(rest)
    else:
        print(f"rlexp: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
