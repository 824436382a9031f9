"""A minimal live-tensor-bytes tracker for the estimator benchmark's fallback measurement.

Follows every tensor storage an op returns (TorchDispatchMode) and subtracts it when the storage is
freed (weakref.finalize on the preserved UntypedStorage PyObject). Used only when no trial
metrics.json with memory_source == 'cpu-tracker' exists (grpo_sweep's own tracker, memtracker.py).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self._seen.pop(key, 0)

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu":
            return
        st = t.untyped_storage()
        key, nbytes = id(st), st.nbytes()
        old = self._seen.get(key)
        if old is None:
            self._seen[key] = nbytes
            self.live += nbytes
            weakref.finalize(st, self._free, key)
        elif nbytes != old:
            self._seen[key] = nbytes
            self.live += nbytes - old
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def reset_peak(self) -> None:
        self.peak = self.live
