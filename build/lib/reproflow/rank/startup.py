"""A rank's start-up, bounded and told: the stage each rank has reached, and a limit on reaching the first point.

Between a launcher starting a rank and the rank's first point lie the interpreter, MPI_Init under an MPI
launcher, the imports, the process group's rendezvous and the health gate; a rank can wait at any of them
for a peer that never comes. Each rank writes the stage it reached to `<$REPROFLOW_START>/rank<N>` (one
line, replaced whole), so the local launcher can bound the start-up and say what each rank waited for;
and each rank bounds its own start-up too (`bounded`), which is what bounds it under srun or torchrun.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from reproflow.store.files import atomic_write

ENV = "REPROFLOW_START"
# A rank's own limit waits this much longer where a launcher watches, so the launcher, which sees every
# rank, speaks first.
LAUNCHER_FIRST_S = 30.0
# Set by MPI launchers for each rank: hydra/MPICH and srun --mpi=pmi2, PMIx, Open MPI, MVAPICH's mpirun_rsh.
MPI_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
# The stages in order, each with what a rank that stopped there waits for.
BEGUN, JOINING, GATE, READY = "begun", "joining", "gate", "ready"
WAITING = {
    BEGUN: "past its imports and MPI_Init, reading the suite and exchanging host names over MPI",
    JOINING: "joining the process group",
    GATE: "gathering the ranks' hosts and in the health gate's all-reduce",
    READY: "at its first point",
}
# What a rank that recorded nothing waits for.
SILENT = "no word from it: in the interpreter's start, its imports, or MPI_Init (the launcher's wire-up)"
EXIT_STARTUP = 125


def env_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """A rank's number from its launcher's environment (torchrun's RANK or an MPI launcher's; this process's
    by default), before MPI or the process group is asked; None outside a launcher."""
    for name in ("RANK", *MPI_RANK_VARIABLES):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return None


@dataclass(frozen=True)
class Stage:
    """What a rank last recorded: its stage, its process id and a detail (the rendezvous address, ...)."""

    stage: str
    pid: int
    detail: str

    def waiting(self) -> str:
        """What a rank that stopped at this stage waits for, in words."""
        text = WAITING.get(self.stage, self.stage)
        return f"{text} ({self.detail})" if self.detail else text


# The stage this rank stands at, and what cancels its bound (`bounded`) once it is ready.
_now = [Stage(BEGUN, os.getpid(), "")]
_bounds: list[Callable[[], None]] = []


def reached(stage: str, detail: str = "") -> None:
    """Record that this rank reached `stage`: for its own bound (`watch`), and in its file where a launcher
    watches."""
    _now[:] = [Stage(stage, os.getpid(), detail)]
    if stage == READY:
        _unbound()
    folder, rank = os.environ.get(ENV), env_rank()
    if folder and rank is not None:
        atomic_write(Path(folder) / f"rank{rank}", f"{stage}\t{os.getpid()}\t{detail}\n")


def stages(folder: Path) -> dict[int, Stage]:
    """Every rank's last recorded stage in `folder`, by rank; ranks that recorded nothing are absent."""
    found: dict[int, Stage] = {}
    for path in folder.glob("rank*"):
        parts = path.read_text(errors="replace").rstrip("\n").split("\t", 2) if path.is_file() else []
        if len(parts) == 3 and path.name[4:].isdigit() and parts[1].isdigit():
            found[int(path.name[4:])] = Stage(parts[0], int(parts[1]), parts[2])
    return found


@contextlib.contextmanager
def bounded(limit_s: float, rank: int, where: str) -> Iterator[None]:
    """Bound this rank's start-up, within the block, until it reaches READY: past `limit_s` (longer where a
    launcher watches) it says which stage it stood at, prints every thread's stack and exits with
    EXIT_STARTUP. faulthandler's own timer backs the bound up: it needs no interpreter lock, which a rank
    stuck in a C call may hold."""
    if os.environ.get(ENV):
        limit_s += LAUNCHER_FIRST_S

    def expire() -> None:
        print(f"reproflow: rank {rank} on {where} did not reach its first point within {limit_s:g} s "
              f"(launch.startup_s); it was {_now[0].waiting()}. Its threads:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(EXIT_STARTUP)

    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(limit_s + 15, exit=True, file=sys.stderr)
    _bounds[:] = [timer.cancel, faulthandler.cancel_dump_traceback_later]
    try:
        yield
    finally:
        _unbound()


def _unbound() -> None:
    for cancel in _bounds:
        cancel()
    _bounds.clear()
