"""Activation memory on any device: the bytes autograd keeps for backward, counted per storage.

CPUs have no allocator statistics; what a forward pass keeps for backward is what grows with the
batch and the activation size, and the same count works on GPUs beside the allocator's figures.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import torch


class SavedBytes:
    """Within `with SavedBytes(exclude) as saved:`, every storage autograd saves is counted once,
    except those of `exclude` (parameters, inputs); `saved.total` is their sum."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.exclude:
            self.storages[ptr] = t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    @property
    def total(self) -> int:
        """Bytes of the saved storages."""
        return sum(self.storages.values())


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_MAX = 32 * 2**20  # the largest mmap threshold glibc accepts on 64-bit


def keep_freed_memory() -> bool:
    """Keep freed CPU memory in this process's heap (glibc: buffers up to 32 MiB from the heap, never
    trimmed), the state a long training process reaches by itself; True where it took effect.

    A fresh process maps every large tensor anew and page-faults it in, and glibc raises its mmap
    threshold only as buffers happen to be freed, so two processes running the same ops time them
    differently: an op profile in a fresh process timed the tiny GPT's backward 20 % and its Adam
    step 40 % above what training measured after a few iterations."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX) and libc.mallopt(_M_TRIM_THRESHOLD, 2**30))
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own policy
        return False
