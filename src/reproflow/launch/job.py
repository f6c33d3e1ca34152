"""A Slurm job's options: one keyword-only dataclass, validated once, used by every submit path.

`reproflow submit`, `reproduce --executor slurm`, the families' `--submit` and the API all build a
`Job`; the executor (launch/submit.py) writes it into the job script (#SBATCH lines and the variables
templates/job.sh reads), so the options mean the same on every path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from reproflow.launch.containers import RUNTIMES
from reproflow.launch.render import shell_value
from reproflow.spec.errors import ReproflowError
from reproflow.spec.suite import JOB_ID_RE, PARTITION_RE, TIME_RE

NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # a host name, as Slurm's NodeName is
MPI_LAUNCHERS = ("auto", "srun", "mpirun_rsh", "hydra")  # templates/job.sh's MPI_LAUNCHER
SRUN_MPI_RE = re.compile(r"[a-z0-9_]*")  # srun --mpi plugins: pmix, pmix_v4, pmi2, cray_shasta, none


@dataclass(frozen=True, kw_only=True)
class Job:
    """How a suite's experiments are submitted (each field as sbatch or templates/job.sh names it)."""

    nodes: int | None = None  # --nodes; None: each experiment's launch
    procs_per_node: int | None = None  # ranks per node (--ntasks-per-node); None: the launch's
    partition: str = ""  # --partition; '': the suite's, else the cluster's default
    time: str = ""  # --time, Slurm's [D-]HH:MM:SS; '': each experiment's launch
    image: str = ""  # squash file; '': the hosts' Python environment
    runtime: str = "pyxis"  # CONTAINER_RUNTIME: pyxis, oci or apptainer
    mounts: str = ""  # CONTAINER_MOUNTS, src:dst,...; '': the working folder and the results
    exclude: tuple[str, ...] = ()  # --exclude: nodes the jobs must not run on
    after: tuple[str, ...] = ()  # --dependency=afterok: jobs that must succeed first
    array: bool = False  # --array: one task per point still to measure
    max_parallel: int = 0  # --array's %N: at most N tasks at once; 0: no cap
    retries: int = 0  # resubmissions of infrastructure failures, without the failed nodes
    mpi_launcher: str = "auto"  # MPI_LAUNCHER: srun, mpirun_rsh, hydra or auto
    srun_mpi: str = ""  # SRUN_MPI: srun's --mpi plugin; '': the image's, else pmix

    def __post_init__(self) -> None:
        for name in ("nodes", "procs_per_node"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ReproflowError(f"--{name.replace('_', '-')} {value!r}: give a whole number >= 1, or leave it "
                                     "out for the suite's launch.")
        for name in ("max_parallel", "retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ReproflowError(f"--{name.replace('_', '-')} {value!r}: give a whole number >= 0.")
        if self.partition and not PARTITION_RE.fullmatch(self.partition):
            raise ReproflowError(f"--partition {self.partition[:40]!r} is not a Slurm partition name: use letters, "
                                 "digits, '_', '.', '-' (several separated by commas).")
        if self.time and not TIME_RE.fullmatch(self.time):
            raise ReproflowError(f"--time {self.time[:40]!r} is not a Slurm time: give [D-]HH:MM:SS, e.g. "
                                 "--time 01:30:00.")
        if self.runtime not in RUNTIMES:
            raise ReproflowError(f"--runtime {self.runtime[:40]!r} is not one of {', '.join(RUNTIMES)}.")
        if self.mpi_launcher not in MPI_LAUNCHERS:
            raise ReproflowError(f"--mpi-launcher {self.mpi_launcher[:40]!r} is not one of "
                                 f"{', '.join(MPI_LAUNCHERS)}.")
        if not SRUN_MPI_RE.fullmatch(self.srun_mpi):
            raise ReproflowError(f"--srun-mpi {self.srun_mpi[:40]!r} is not an srun --mpi plugin name: give one "
                                 "`srun --mpi=list` prints, e.g. pmix or pmi2.")
        for node in self.exclude:
            if not NODE_RE.fullmatch(node):
                raise ReproflowError(f"--exclude {node[:40]!r} is not a node name: give Slurm's node names, "
                                     "comma-separated (node7,node12), or @FILE holding them (reproflow nodes writes "
                                     "exclude.txt).")
        for job in self.after:
            if not JOB_ID_RE.fullmatch(job):
                raise ReproflowError(f"--after {job[:40]!r} is not a Slurm job id. Give the ids sbatch or "
                                     "`reproflow submit` printed (e.g. --after 1234 or --after 1234,1235).")
        # Checked before anything reaches a job script, where a newline would end the line it is on.
        shell_value("--image", self.image)
        shell_value("--mounts", self.mounts)

    def argv(self) -> list[str]:
        """The command-line options that give this job (what `reproduce` passes each step it submits)."""
        out: list[str] = []
        for field in fields(self):
            value, default = getattr(self, field.name), field.default
            option = "--" + field.name.replace("_", "-")
            if value == default:
                continue
            if isinstance(value, bool):
                out.append(option)
            elif isinstance(value, tuple):
                out += [option, ",".join(value)]
            else:
                out += [option, str(value)]
        return out
