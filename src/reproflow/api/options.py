"""The command-line option sets that `reproflow run`, `submit` and the families' own commands share,
and the typed arguments of the API they become."""

from __future__ import annotations

import argparse
from pathlib import Path

from reproflow.api import Placement
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


def generated_suite_options(p: argparse.ArgumentParser) -> None:
    """The options of family commands that write a suite and run it here or submit it (placement)."""
    p.add_argument("--results", type=Path, default=Path("results"), help="where result rows go")
    p.add_argument("--submit", action="store_true", help="submit to Slurm (through submitit) instead of running here")
    p.add_argument("--after", action="append", default=[], metavar="JOBID", help="with --submit: after these jobs")
    p.add_argument("--image", default="", help="with --submit: Enroot squash file for Pyxis")
    p.add_argument("--mounts", default="", help="with --submit: Pyxis --container-mounts")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    p.set_defaults(measures=True)  # a run of the catalog, as `run` is (app/cli.py)


def placement(args: argparse.Namespace) -> Placement:
    """Where the command's options say its work runs (generated_suite_options; absent ones: the defaults)."""
    return Placement(results=Path(getattr(args, "results", "results")), submit=getattr(args, "submit", False),
                     after=tuple(getattr(args, "after", ())), image=getattr(args, "image", ""),
                     mounts=getattr(args, "mounts", ""), force=getattr(args, "force", False),
                     dry_run=getattr(args, "dry_run", False))
