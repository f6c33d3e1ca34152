"""Activation memory on any device: the bytes autograd keeps for backward, counted per storage.

CPUs have no allocator statistics; what a forward pass keeps for backward is what grows with the
batch and the activation size, and the same count works on GPUs beside the allocator's figures.
"""

from __future__ import annotations

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
