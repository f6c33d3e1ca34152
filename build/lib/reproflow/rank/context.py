"""What a family's run function sees on its rank: process group, device, and small helpers.

The process group is created from the standard torch.distributed environment variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), which torchrun, reproflow's local
launcher and the Slurm path all set, so one code path serves every executor.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from reproflow.rank.ports import free_port
from reproflow.rank.startup import GATE, JOINING, MPI_RANK_VARIABLES, reached
from reproflow.spec.errors import ReproflowError

# torch 2.13 renamed the flat-tensor collectives and warns on the old names; the GPU images'
# older torch releases only have the old ones. Same functions either way; families call these.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def choose_device_and_backend(device: str, backend: str) -> tuple[str, str]:
    """Resolve 'auto' settings: CUDA + NCCL where a GPU is visible, else CPU + gloo."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ReproflowError(
            "launch.device is 'cuda' but this torch sees no GPU "
            f"(torch {torch.__version__}). Set device = 'auto' or 'cpu', or run on a GPU node."
        )
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ReproflowError("launch.backend 'nccl' needs device 'cuda'. Use backend 'gloo' on CPU.")
    if backend == "nccl" and not dist.is_nccl_available():
        raise ReproflowError("launch.backend is 'nccl' but this torch build has no NCCL. Use 'gloo'.")
    return device, backend


def gpu_of(local_rank: int, gpus: int, backend: str) -> int:
    """The GPU of a node's `local_rank`-th rank: its own, or shared round-robin when a node runs more
    ranks than it has GPUs, which only gloo allows (NCCL refuses two ranks on one GPU)."""
    if local_rank < gpus:
        return local_rank
    if backend == "nccl":
        raise ReproflowError(
            f"local rank {local_rank} has no GPU of its own ({gpus} on this node) and NCCL needs one GPU per "
            "rank. Run at most one rank per GPU (launch.procs_per_node), or set launch.backend = 'gloo' to "
            "share GPUs (spatial's comm_backend = 'mpi' moves its tensors over MPI either way).")
    return local_rank % gpus


def adopt_mpi_environment() -> None:
    """Under an MPI launcher, take RANK, WORLD_SIZE, LOCAL_RANK and (unless set) the rendezvous from MPI.

    Ranks started by mpirun, `srun --mpi` or mpirun_rsh have no torchrun variables; rank 0's host
    and a free port on it become MASTER_ADDR / MASTER_PORT, so gloo or NCCL join beside MPI.
    """
    if "RANK" in os.environ or not any(v in os.environ for v in MPI_RANK_VARIABLES):
        return
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    hosts = comm.allgather(socket.gethostname())
    if "MASTER_ADDR" not in os.environ:
        port = free_port() if rank == 0 else 0
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = comm.bcast((hosts[0], str(port)))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(comm.Get_size()),
                      LOCAL_RANK=str(hosts[:rank].count(hosts[rank])),
                      LOCAL_WORLD_SIZE=str(hosts.count(hosts[rank])))


@dataclass
class RunContext:
    """The rank's view of its job. Created once per job by the worker."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    hostname: str
    # Ranks per host: torchrun's LOCAL_WORLD_SIZE; the local executor emulates hosts with it.
    # Ranks [h * host_size, (h + 1) * host_size) share host h.
    host_size: int
    _hosts: list[str] | None = None

    @classmethod
    def from_env(cls, device: str, backend: str, timeout_s: float) -> RunContext:
        """Join the job's process group using the torch.distributed environment variables (or MPI's)."""
        adopt_mpi_environment()
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise ReproflowError(
                f"the worker needs {', '.join(missing)} in its environment. Start it through "
                "`reproflow run`, torchrun, or the rendered sbatch script, not directly."
            )
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        host_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        device, backend = choose_device_and_backend(device, backend)
        if device == "cuda":
            dev = torch.device("cuda", gpu_of(local_rank, torch.cuda.device_count(), backend))
            torch.cuda.set_device(dev)
        else:
            dev = torch.device("cpu")
        reached(JOINING, f"its store at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}, served by rank 0")
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=_dt.timedelta(seconds=timeout_s)
        )
        reached(GATE)
        return cls(rank, world, local_rank, dev, backend, os.environ.get("REPROFLOW_HOST") or socket.gethostname(),
                   host_size)

    def hosts(self) -> list[str]:
        """Every rank's hostname, in rank order. A collective the first time (the worker calls it at
        start on every rank), then remembered."""
        if self._hosts is None:
            self._hosts = [str(h) for h in self.gather_objects(self.hostname)]
        return self._hosts

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def sync(self) -> None:
        """Wait for queued device work (a no-op on CPU), so a host timer sees finished work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        """All ranks meet; device work is finished first."""
        self.sync()
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def gather_floats(self, value: float) -> list[float]:
        """Every rank's value, in rank order, on every rank."""
        mine = torch.tensor([value], dtype=torch.float64, device=self.device)
        out = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine)
        return [float(t.item()) for t in out]

    def gather_objects(self, obj: object) -> list[object]:
        """Every rank's picklable object, in rank order, on every rank."""
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def failures(self, problem: str) -> str:
        """Every rank's non-empty `problem` as 'rank r: ...; ...', on every rank; '' when none has one.

        Lets a failure found on some ranks fail the same step on all of them, before any rank
        waits in a collective for a rank that gave up.
        """
        if self.all_agree(not problem):
            return ""
        return "; ".join(f"rank {r}: {e}" for r, e in enumerate(self.gather_objects(problem)) if e)

    def all_agree(self, ok: bool) -> bool:
        """True on every rank only when `ok` is true on every rank."""
        flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) == 0

    def log(self, message: str) -> None:
        """Print on rank 0 only, flushed, so progress shows live in Slurm output files."""
        if self.rank == 0:
            print(message, flush=True, file=sys.stdout)
