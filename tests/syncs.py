"""A check for host synchronisations, usable on the CPU: ``HostSyncs`` records the ATen calls that,
on CUDA, make the host wait for the device — a scalar read (``item``, ``bool``, ``float``), an op whose
output shape depends on the data (``nonzero``, boolean indexing, ``unique``, ``masked_select``,
``repeat_interleave`` without ``output_size``) or a tensor comparison returning a Python bool.
Host-side copies (``.cpu()``, ``.tolist()`` of a CPU tensor) do not dispatch on the CPU and are not
seen."""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
SYNCING = {
    aten._local_scalar_dense,
    aten.nonzero,
    aten.masked_select,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.equal,
    aten.is_nonzero,
    aten.multinomial,
}


class HostSyncs(TorchDispatchMode):
    """``calls``: each syncing op, as ``op <- caller`` (the innermost rlexp function). Calls made
    inside a function named in ``host_side`` are not recorded (work on host copies, e.g. the
    micro-batch plan, which on CUDA never touches the device)."""

    def __init__(self, host_side: tuple[str, ...] = ()):
        super().__init__()
        self.calls: list[str] = []
        self.host_side = set(host_side)

    def _caller(self) -> str | None:
        frame, where = sys._getframe(2), None
        while frame is not None:
            if frame.f_code.co_name in self.host_side:
                return None
            if where is None and "/rlexp/" in frame.f_code.co_filename:
                where = f"{frame.f_code.co_name}:{frame.f_lineno}"
            frame = frame.f_back
        return where or "?"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        bool_index = packet in (aten.index, aten.index_put, aten.index_put_) and any(
            torch.is_tensor(i) and i.dtype == torch.bool for i in (args[1] or []) if i is not None
        )
        data_shape = func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None
        if packet in SYNCING or bool_index or data_shape:
            caller = self._caller()
            if caller is not None:
                self.calls.append(f"{func} <- {caller}")
        return func(*args, **kwargs)


class OpTrace(TorchDispatchMode):
    """What a CUDA graph would freeze: the ATen calls in order with their non-tensor arguments (a
    captured graph replays them with the values of capture time), and the storages each call reads
    that the traced code did not make itself (a graph reads them at their capture-time addresses).
    ``fresh`` lists tensors made from host data (``torch.tensor(...)``: a host-to-device copy on CUDA,
    not allowed while capturing)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []
        self.read: set[int] = set()
        self.fresh: list[str] = []
        self._made: set[int] = set()

    @staticmethod
    def _storage(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        self.calls.append((str(func), tuple(repr(x) for x in leaves if not torch.is_tensor(x))))
        for t in leaves:
            if torch.is_tensor(t) and t.numel() and self._storage(t) not in self._made:
                self.read.add(self._storage(t))
        if func.overloadpacket is aten.lift_fresh:
            self.fresh.append(str(func))
        out = func(*args, **kwargs)
        for t in torch.utils._pytree.tree_leaves(out):
            if torch.is_tensor(t) and t.numel() and self._storage(t) not in self.read:
                self._made.add(self._storage(t))
        return out
