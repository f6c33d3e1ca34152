"""Point-to-point messages and sums between ranks: MPI through mpi4py, or torch.distributed.

The reference runs everything over MPI (MVAPICH2-GDR). torch's CPU build has no MPI backend, so the
`mpi` backend passes torch tensors straight to mpi4py (as bytes, so every dtype travels alike); the
`gloo` / `nccl` backends use the job's torch.distributed process group instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def mpi_reads_gpu_memory() -> bool:
    """Whether MPI is told it takes CUDA buffers ($REPROFLOW_MPI_CUDA_AWARE=1: a CUDA-aware Open MPI,
    MVAPICH2-GDR). Otherwise device tensors travel through host copies, which every MPI takes."""
    return os.environ.get("REPROFLOW_MPI_CUDA_AWARE", "0") == "1"


class MpiComm:
    """mpi4py's COMM_WORLD. Waits poll with a short sleep: on an oversubscribed machine a spinning
    MPI wait would take the cores the computing ranks need. A wait longer than `timeout_s` raises
    (under `python -m mpi4py` that aborts the job) instead of waiting forever for a dead rank.
    A request is (MPI request, tensor, host copy to write back into the tensor on completion or None)."""

    name = "mpi"

    def __init__(self, device: torch.device, timeout_s: float = 600.0) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.world = MPI.COMM_WORLD
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.device = device
        self.timeout_s = timeout_s
        self.staged = device.type == "cuda" and not mpi_reads_gpu_memory()

    def _buffer(self, t: torch.Tensor) -> torch.Tensor:
        # MPI reads device buffers directly; queued kernels must have written them first. An MPI that
        # cannot read GPU memory gets a host copy instead (the copy waits for those kernels too).
        if self.staged:
            return t.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return t

    def isend(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        """Start sending contiguous `t` to `dst`."""
        buf = self._buffer(t)
        return (self.world.Isend(_bytes(buf), dest=dst, tag=tag), buf, None)

    def irecv(self, t: torch.Tensor, src: int, tag: int) -> Any:
        """Start receiving into contiguous `t` from `src`."""
        buf = torch.empty(t.shape, dtype=t.dtype) if self.staged else self._buffer(t)
        return (self.world.Irecv(_bytes(buf), source=src, tag=tag), t, buf if self.staged else None)

    def wait(self, requests: Sequence[Any]) -> None:
        """Wait for every request."""
        reqs = [r for r, _, _ in requests]
        pause, deadline = 0.0, time.monotonic() + self.timeout_s
        while not self._mpi.Request.Testall(reqs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: MPI messages unfinished after {self.timeout_s:.0f} s; a peer "
                                   "rank has died or hangs")
            time.sleep(pause)
            pause = min(1e-3, pause * 2 or 2e-5)
        for _, t, host in requests:
            if host is not None:
                t.copy_(host)

    def group(self, members: Sequence[Sequence[int]]) -> Any:
        """Collective over all ranks: a communicator for the member list holding this rank (or None)."""
        mine = [i for i, ranks in enumerate(members) if self.rank in ranks]
        color = mine[0] if mine else self._mpi.UNDEFINED
        sub = self.world.Split(color, self.rank)
        return None if sub == self._mpi.COMM_NULL else sub

    def all_reduce(self, t: torch.Tensor, group: Any) -> None:
        """Sum contiguous `t` in place over `group`."""
        buf = self._buffer(t)
        req = group.Iallreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)
        self.wait([(req, t, buf if self.staged else None)])


class TorchComm:
    """The job's torch.distributed process group (gloo on CPUs, NCCL on GPUs)."""

    def __init__(self, backend: str, rank: int, size: int) -> None:
        self.name = backend
        self.rank = rank
        self.size = size

    def isend(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        """Start sending contiguous `t` to `dst`."""
        return dist.isend(t, dst, tag=tag)

    def irecv(self, t: torch.Tensor, src: int, tag: int) -> Any:
        """Start receiving into contiguous `t` from `src`."""
        return dist.irecv(t, src, tag=tag)

    def wait(self, requests: Sequence[Any]) -> None:
        """Wait for every request."""
        for r in requests:
            r.wait()

    def group(self, members: Sequence[Sequence[int]]) -> Any:
        """Collective over all ranks: the process group of the member list holding this rank (or None)."""
        found = None
        for ranks in members:
            g = dist.new_group(sorted(ranks))
            if self.rank in ranks:
                found = g
        return found

    def all_reduce(self, t: torch.Tensor, group: Any) -> None:
        """Sum `t` in place over `group`."""
        dist.all_reduce(t, group=group)


Comm = MpiComm | TorchComm


def make_comm(backend: str, device: torch.device, rank: int, size: int) -> Comm:
    """The communicator of `--backend`: 'mpi' for mpi4py, else torch.distributed."""
    if backend == "mpi":
        return MpiComm(device)
    return TorchComm(backend, rank, size)
