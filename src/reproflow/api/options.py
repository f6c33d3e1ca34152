"""The command-line option sets that `reproflow run`, `submit` and the families' own commands share,
and the typed arguments of the API they become."""

from __future__ import annotations

import argparse
from pathlib import Path

from reproflow.api import Placement
from reproflow.launch.containers import RUNTIMES
from reproflow.launch.job import MPI_LAUNCHERS, Job
from reproflow.spec.errors import ReproflowError
from reproflow.spec.params import whole


def suite_options(p: argparse.ArgumentParser, with_suite: bool = True) -> None:
    """The suite, its experiments, the results folder, --force, --dry-run and --set."""
    if with_suite:
        p.add_argument("suite", help="suite name (workflows/<name>.toml) or path")
        p.add_argument("-e", "--experiment", action="append", default=[],
                       help="run only this experiment (repeatable; default: all)")
    p.add_argument("--results", default="results", help="results folder (shared by all nodes on clusters)")
    p.add_argument("--force", action="store_true", help="measure again points that already have results")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="fix a parameter for every point, e.g. --set end_size=1M --set iters=5")


def rank_options(p: argparse.ArgumentParser, nodes_help: str) -> None:
    """--nodes and --procs-per-node, Slurm's words, on every command that starts ranks; --procs, which
    once meant the ranks in all here and the ranks per node on Slurm, refused naming them."""
    p.add_argument("--nodes", type=whole(1), default=None, help=f"{nodes_help} (default: the suite's launch)")
    p.add_argument("--procs-per-node", type=whole(1), default=None,
                   help="ranks per node (default: the suite's launch)")
    p.add_argument("--procs", action=_Renamed, nargs="?", help=argparse.SUPPRESS)


class _Renamed(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error("--procs is gone: give --nodes N and --procs-per-node P (ranks per node), as Slurm names them")


def run_options(p: argparse.ArgumentParser, with_suite: bool = False) -> None:
    """The options of `reproflow run`; family commands that are run shorthands add them without the suite."""
    suite_options(p, with_suite)
    rank_options(p, "emulated hosts (nodes) to start the ranks on, here")
    p.add_argument("--network", default=None, metavar="RATE",
                   help="emulate each host's link at RATE each way, e.g. 1gbit (root and iproute2); '' for "
                   "loopback (default: the suite's launch.network)")
    p.add_argument("--explain", action="store_true",
                   help="print each point's plan (families that plan, e.g. resharding), run nothing")


def job_options(p: argparse.ArgumentParser, when: str = "") -> None:
    """How submitted jobs run (launch.job.Job's fields, one option each), on every command that submits:
    `submit`, `reproduce --executor slurm`, the families' --submit. `when` prefixes each help."""
    p.add_argument("--partition", default="", help=f"{when}Slurm partition (default: the suite's, else the cluster's)")
    p.add_argument("--time", default="", metavar="[D-]HH:MM:SS",
                   help=f"{when}each job's time limit (default: the experiment's launch)")
    p.add_argument("--image", default="", help=f"{when}squash file from `make containers` (default: none, the "
                   "hosts' Python environment)")
    p.add_argument("--runtime", choices=RUNTIMES, default="pyxis",
                   help=f"{when}how the image starts: Pyxis (srun --container-image), Slurm's OCI support (srun "
                        "--container, oci.conf) or Apptainer (default: %(default)s)")
    p.add_argument("--mounts", default="", help=f"{when}folders bound into the container, src:dst,... (default: "
                   "the working folder and the results)")
    p.add_argument("--exclude", default="", metavar="NODES",
                   help=f"{when}nodes the jobs must not run on: node7,node12 or @FILE (reproflow nodes writes "
                        "exclude.txt)")
    p.add_argument("--after", action="append", default=[], metavar="JOBID",
                   help=f"{when}start only after these jobs succeed (afterok; repeatable or comma-separated)")
    p.add_argument("--array", action="store_true", help=f"{when}one array task per point instead of one job")
    p.add_argument("--max-parallel", type=whole(0), default=0, help=f"{when}with --array: at most this many tasks "
                   "at once")
    p.add_argument("--retries", type=whole(0), default=0,
                   help=f"{when}wait for the jobs, and resubmit infrastructure failures up to this many times, "
                        "without the nodes that failed (same rank count; rows get attempt and retry_of). "
                        "Experiment failures are never retried")
    p.add_argument("--mpi-launcher", choices=MPI_LAUNCHERS, default="auto",
                   help=f"{when}how MPI experiments start: srun, mpirun_rsh (MVAPICH2), hydra (MPICH by hand), or "
                        "auto: hydra under --runtime oci, mpirun_rsh if found and no image, else srun")
    p.add_argument("--srun-mpi", default="", metavar="PLUGIN",
                   help=f"{when}srun's --mpi plugin for MPI experiments (default: the one the image names, else "
                        "pmix)")


def job(args: argparse.Namespace) -> Job:
    """The Job the command's options give (job_options and rank_options; absent ones: the defaults)."""
    given = {name: getattr(args, name) for name in ("nodes", "procs_per_node", "partition", "time", "image",
                                                    "runtime", "mounts", "array", "max_parallel", "retries",
                                                    "mpi_launcher", "srun_mpi") if hasattr(args, name)}
    after = tuple(j for item in getattr(args, "after", ()) for j in item.split(",") if j)
    return Job(**given, after=after, exclude=_node_list(getattr(args, "exclude", "")))


def _node_list(text: str) -> tuple[str, ...]:
    """--exclude's nodes: comma-separated names, or @FILE holding them (as `reproflow nodes` writes)."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise ReproflowError(f"--exclude {text}: cannot read the file ({exc.strerror}); give node names "
                                 "(node7,node12) or @FILE with them.") from None
    return tuple(n.strip() for n in text.replace("\n", ",").split(",") if n.strip())


def generated_suite_options(p: argparse.ArgumentParser) -> None:
    """The options of family commands that write a suite and run it here or submit it (placement)."""
    p.add_argument("--results", type=Path, default=Path("results"), help="where result rows go")
    p.add_argument("--submit", action="store_true", help="submit each step to Slurm instead of running it here")
    job_options(p, "with --submit: ")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    p.set_defaults(measures=True)  # a run of the catalog, as `run` is (app/cli.py)


def placement(args: argparse.Namespace) -> Placement:
    """Where the command's options say its work runs (generated_suite_options; absent ones: the defaults)."""
    return Placement(results=Path(getattr(args, "results", "results")), submit=getattr(args, "submit", False),
                     job=job(args), force=getattr(args, "force", False), dry_run=getattr(args, "dry_run", False))
