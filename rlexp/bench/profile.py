"""``bench.profile=true``: one extra step of our trainer under ``torch.profiler``, after the measured
steps (so it changes none of them), broken down by the trainer's phases (``Trainer`` marks them with
``record_function``: ``rlexp.generate``, ``rlexp.score``, ``rlexp.train``).

Per phase: wall time, the ATen ops the host dispatched (top-level calls, the launch-bound cost of a
small model), and on CUDA the kernels launched and their summed GPU time — GPU time far below the
wall time means the phase waits on the host (launches, Python, synchronisations), not on the GPU.
Kernels are attributed to a phase by their launching op's start time, so the autograd engine's
backward thread counts with the phase that ran ``backward``. Written next to the report as
``<setting>-<device>-profile.txt`` with the op table (top ops by self device or CPU time).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

PHASES = ("rlexp.generate", "rlexp.score", "rlexp.train")


def phase_summary(events, phases=PHASES) -> dict[str, dict[str, float]]:
    """{phase: wall_ms, aten_ops, kernels, kernel_ms} from a profiler's ``events()``."""
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in events if e.name in phases}
    out = {
        name: {"wall_ms": (end - start) / 1000, "aten_ops": 0, "kernels": 0, "kernel_ms": 0.0}
        for name, (start, end) in ranges.items()
    }

    def phase_of(t):
        for name, (start, end) in ranges.items():
            if start <= t <= end:
                return name
        return None

    for e in events:
        name = phase_of(e.time_range.start)
        if name is None:
            continue
        parent = e.cpu_parent
        if e.name.startswith("aten::") and not (parent is not None and parent.name.startswith("aten::")):
            out[name]["aten_ops"] += 1
        for k in getattr(e, "kernels", []) or []:
            out[name]["kernels"] += 1
            out[name]["kernel_ms"] += k.duration / 1000
    return out


def profile_step(step_fn, device: torch.device, path: Path, row_limit: int = 40) -> dict[str, dict[str, float]]:
    """Run ``step_fn()`` once under the profiler; write the phase table and the op table to ``path``;
    return the phase summary."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step_fn()
        if cuda:
            torch.cuda.synchronize(device)
    summary = phase_summary(prof.events())
    lines = [
        "| phase | wall ms | ATen ops (top-level) | kernels | kernel ms | kernel / wall |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        busy = f"{s['kernel_ms'] / s['wall_ms']:.2f}" if cuda and s["wall_ms"] else "n/a"
        lines.append(
            f"| {name} | {s['wall_ms']:.1f} | {s['aten_ops']} | {s['kernels'] if cuda else 'n/a'} | "
            f"{s['kernel_ms']:.1f} | {busy} |"
        )
    table = prof.key_averages().table(
        sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=row_limit
    )
    path.write_text(
        "# One profiled step of ours (after the measured steps)\n\n" + "\n".join(lines) + "\n\n" + table + "\n"
    )
    return summary
