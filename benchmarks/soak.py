"""Soak benchmark (issue 16; not a CI test): N concurrent tiny training runs of S steps each, half against one
SQLite store, half against one local ``mlflow server`` that is restarted in the middle of the runs. Then every
run is checked: its metrics.jsonl and its MLflow run hold each step 1..S exactly once (no step lost, none
duplicated), its MLflow run is FINISHED, and the process exited 0.

    python benchmarks/soak.py --runs 16 --steps 50 --out results/reliability/soak

Writes ``soak.json`` (per-run counts, timings, the restart window) and ``soak.md`` to ``--out``."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from mlflow import MlflowClient

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(work: Path, port: int, log) -> subprocess.Popen:
    cmd = [
        str(VENV_BIN / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{work / 'server.db'}",
        "--artifacts-destination",
        str(work / "server-artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_up(uri: str, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"mlflow server at {uri} did not come up")


def stop_server(proc: subprocess.Popen) -> None:
    import signal

    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def train_cmd(run_dir: Path, steps: int, seed: int) -> list[str]:
    return [
        str(VENV_BIN / "rlexp"),
        "train",
        "model=tiny",
        f"trainer.max_steps={steps}",
        "trainer.prompts_per_step=2",
        "trainer.num_generations=2",
        "trainer.max_new_tokens=8",
        "trainer.micro_batch_size=4",
        "trainer.checkpoint_every=10",
        "trainer.keep_checkpoints=0",
        "trainer.num_threads=1",
        "trainer.progress=false",
        f"trainer.seed={seed}",
        "dataset.train_size=64",
        "dataset.eval_size=4",
        "eval.size=0",
        "tracker=mlflow",
        f"hydra.run.dir={run_dir}",
    ]


def check_run(run_dir: Path, uri: str, steps: int) -> dict:
    from rlexp.tracking.base import read_jsonl

    rows = read_jsonl(run_dir / "metrics.jsonl")
    jsonl_steps = [r["step"] for r in rows]
    ids = json.loads((run_dir / "tracker_ids.json").read_text())
    client = MlflowClient(uri)
    run = client.get_run(ids["mlflow"])
    keys = sorted(k for k in rows[0] if k not in ("step", "time") and rows[0][k] is not None) if rows else []
    lost = dup = 0
    for key in keys:
        got = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        want = [r["step"] for r in rows if r.get(key) is not None]
        lost += len(set(want) - set(got))
        dup += len(got) - len(set(got))
    return {
        "run_dir": str(run_dir),
        "store": uri,
        "mlflow_run": run.info.run_id,
        "status": run.info.status,
        "jsonl_steps_ok": jsonl_steps == list(range(1, steps + 1)),
        "metric_keys": len(keys),
        "lost_values": lost,
        "duplicated_values": dup,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--work", default="outputs/soak")
    ap.add_argument("--out", default=None, help="where soak.json/soak.md go (default: the work directory)")
    ap.add_argument("--restart-after-step", type=int, default=None, help="default: half of --steps")
    ap.add_argument("--down-s", type=float, default=10.0, help="how long the server stays down")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).resolve() if args.out else work
    out.mkdir(parents=True, exist_ok=True)
    restart_at = args.restart_after_step or args.steps // 2

    port = free_port()
    server_uri = f"http://127.0.0.1:{port}"
    sqlite_uri = f"sqlite:///{work / 'mlruns.db'}"
    server_log = open(work / "server.log", "a")
    server = start_server(work, port, server_log)
    wait_up(server_uri)

    t0 = time.monotonic()
    procs = []
    for i in range(args.runs):
        uri = sqlite_uri if i % 2 == 0 else server_uri
        run_dir = work / f"run-{i:02d}"
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
        log = open(work / f"run-{i:02d}.log", "w")
        procs.append(
            (
                run_dir,
                uri,
                subprocess.Popen(
                    train_cmd(run_dir, args.steps, i), cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT
                ),
            )
        )
    print(f"{args.runs} runs started ({args.runs // 2} on {sqlite_uri}, {args.runs - args.runs // 2} on {server_uri})")

    from rlexp.tracking.base import read_jsonl

    def min_step_of_server_runs() -> int:
        return min(
            max((r["step"] for r in read_jsonl(d / "metrics.jsonl")), default=0) for d, u, _ in procs if u == server_uri
        )

    restart = {}
    while min_step_of_server_runs() < restart_at and any(p.poll() is None for _, _, p in procs):
        time.sleep(1)
    restart["down_at_s"] = round(time.monotonic() - t0, 1)
    stop_server(server)
    print(f"server stopped at {restart['down_at_s']} s (every server run past step {restart_at})")
    time.sleep(args.down_s)
    server = start_server(work, port, server_log)
    wait_up(server_uri)
    restart["up_at_s"] = round(time.monotonic() - t0, 1)
    print(f"server back at {restart['up_at_s']} s")

    codes = [p.wait() for _, _, p in procs]
    wall = round(time.monotonic() - t0, 1)
    before = [check_run(d, u, args.steps) for d, u, _ in procs]
    # a run that ended while the server was still down says so and names `rlexp replay` (its metrics.jsonl holds
    # every step): do as it says
    replayed = []
    for d, u, _ in procs:
        if "rlexp replay" in (work / f"{d.name}.log").read_text():
            r = subprocess.run(
                [str(VENV_BIN / "rlexp"), "replay", str(d)],
                capture_output=True,
                text=True,
                cwd=work,
                env={**os.environ, "MLFLOW_TRACKING_URI": u},
            )
            replayed.append({"run": d.name, "exit_code": r.returncode, "output": (r.stdout + r.stderr)[-500:]})
    results = [
        {**check_run(d, u, args.steps), "exit_code": c, "before_replay": {k: b[k] for k in ("status", "lost_values")}}
        for (d, u, _), c, b in zip(procs, codes, before)
    ]
    stop_server(server)

    ok = all(
        r["exit_code"] == 0
        and r["status"] == "FINISHED"
        and r["jsonl_steps_ok"]
        and r["lost_values"] == 0
        and r["duplicated_values"] == 0
        for r in results
    )
    summary = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "runs": args.runs,
        "steps": args.steps,
        "restart": {**restart, "after_step": restart_at, "down_s": args.down_s},
        "wall_s": wall,
        "load_avg_1m_at_end": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "ok": ok,
        "lost_values": sum(r["lost_values"] for r in results),
        "lost_values_before_replay": sum(b["lost_values"] for b in before),
        "replayed": replayed,
        "duplicated_values": sum(r["duplicated_values"] for r in results),
        "results": results,
    }
    (out / "soak.json").write_text(json.dumps(summary, indent=2))
    lines = [
        f"# Soak: {args.runs} concurrent tiny runs x {args.steps} steps, one SQLite store + one mlflow server "
        f"restarted mid-run",
        "",
        f"Command: `python benchmarks/{summary['command']}`; wall {wall} s on {os.cpu_count()} cores.",
        f"Server stopped at {restart['down_at_s']} s, back at {restart['up_at_s']} s.",
        "",
        "A run that ends while the server is still down waits `flush_timeout` (30 s), then exits naming "
        "`rlexp replay <run dir>`; the soak runs that command for each such run, as a user would. The columns "
        "before it are the state the training process left.",
        "",
        "| run | store | exit | status before replay | missing before replay | status | jsonl 1..S | metric keys "
        "| lost | duplicated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        store = "sqlite" if r["store"].startswith("sqlite") else "server"
        b = r["before_replay"]
        lines.append(
            f"| {Path(r['run_dir']).name} | {store} | {r['exit_code']} | {b['status']} | {b['lost_values']} | "
            f"{r['status']} | {r['jsonl_steps_ok']} | {r['metric_keys']} | {r['lost_values']} | "
            f"{r['duplicated_values']} |"
        )
    lines += [
        "",
        f"**{'PASS' if ok else 'FAIL'}**: {summary['lost_values']} values lost, "
        f"{summary['duplicated_values']} duplicated.",
    ]
    (out / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
