"""Measuring one step: wall time per phase, peak memory (CPU: VmHWM; CUDA: the allocator's peak) and the dtype
the matmuls actually ran in."""

from __future__ import annotations

import os
import threading
import time

import torch


def _read_hwm_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_mb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # Linux without psutil
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Meter:
    """Wall time and peak memory of one step. ``start()`` / ``stop()`` bracket it; ``sync()`` waits
    for queued CUDA work so that the clock measures finished work."""

    def __init__(self, device: torch.device, rss_interval_s: float = 0.005):
        self.device = device
        self.cuda = device.type == "cuda"
        self.t_start = self.t_stop = 0.0
        self.mem_start = 0.0
        self.interval = rss_interval_s
        self._hwm_reset = False
        if not self.cuda:
            self._hwm_reset = self._reset_hwm()
        self.memory_method = (
            "torch.cuda.max_memory_allocated"
            if self.cuda
            else "peak RSS (VmHWM, reset per step)"
            if self._hwm_reset
            else f"peak RSS (psutil sampled every {rss_interval_s * 1000:g} ms)"
        )
        self._peak = 0.0
        self._stop_sampler = threading.Event()
        self._sampler = None

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return _read_hwm_kb() is not None
        except OSError:
            return False

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _sample(self) -> None:
        while not self._stop_sampler.wait(self.interval):
            self._peak = max(self._peak, _rss_mb())

    def start(self) -> None:
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.mem_start = torch.cuda.memory_allocated(self.device) / 2**20
        else:
            _malloc_trim()  # freed heap of the other trainer's step back to the OS: the start RSS is live memory
            self.mem_start = _rss_mb()
            if self._hwm_reset:
                self._reset_hwm()
            else:
                self._peak = self.mem_start
                self._stop_sampler.clear()
                self._sampler = threading.Thread(target=self._sample, daemon=True)
                self._sampler.start()
        self.t_start = time.perf_counter()

    def stop(self) -> tuple[float, dict[str, float]]:
        self.sync()
        self.t_stop = time.perf_counter()
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif self._hwm_reset:
            peak = _read_hwm_kb() / 1024
        else:
            self._stop_sampler.set()
            self._sampler.join()
            peak = max(self._peak, _rss_mb())
        return self.t_stop - self.t_start, {
            "peak_mem_mb": peak,
            "mem_delta_mb": max(peak - self.mem_start, 0.0),
            "load1": os.getloadavg()[0],
        }


class DtypeProbe:
    """Forward hook on the first Linear layer of each watched model: the dtypes its outputs had with
    gradients off (generation) and on (training). Ours also watches the rollout's half-precision copy
    of the policy (``rollout.inference_dtype``) once it exists."""

    def __init__(self, model):
        self.seen = {"generate": set(), "train": set()}
        self._watched: set[int] = set()
        self.watch(model)

    def watch(self, model) -> None:
        if model is None or id(model) in self._watched:
            return
        self._watched.add(id(model))
        layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        layer.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.seen["train" if torch.is_grad_enabled() else "generate"].add(str(output.dtype).replace("torch.", ""))

    def summary(self) -> dict[str, str]:
        return {k: "/".join(sorted(v)) or "-" for k, v in self.seen.items()}
