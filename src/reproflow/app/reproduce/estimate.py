"""What a reproduction will cost: points, minutes and node-hours per step, from this machine's earlier
runs or the plan's estimates; and the runs kept for the next estimate."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reproflow.app.reproduce.plan import LOCAL, SLURM, Folders, Step
from reproflow.launch.status import experiment_status
from reproflow.spec.suite import named_suite
from reproflow.store.files import atomic_write

if TYPE_CHECKING:
    from reproflow.app.reproduce.steps import StepResult


def suite_points(argv: list[str], results: Path) -> tuple[int, int] | None:
    """(points, already measured) of a `run SUITE -e ...` step (measured: the point files `reproflow
    status` counts), or None for other commands."""
    if argv[0] != "run":
        return None
    suite = named_suite(argv[1], checks=False)  # points as declared; the checks run with the step
    chosen = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    measured = {(row.suite, row.experiment): row.done for row in experiment_status(results)}
    total = done = 0
    for exp in suite.select(chosen):
        total += len(exp.points)
        done += min(len(exp.points), measured.get((suite.name, exp.name), 0))
    return total, done


def read_timings(path: Path) -> dict[str, dict[str, float]]:
    """Measured minutes and points of earlier complete runs of each step on this machine."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Estimate:
    """What one step will cost: points, minutes and node-hours."""

    step: Step
    nodes: int
    points: int
    measured: int | None
    minutes: float
    source: str

    @property
    def node_hours(self) -> float:
        return self.nodes * self.minutes / 60


def estimate(steps: list[Step], folders: Folders, executor: str = LOCAL) -> list[Estimate]:
    """Per step: nodes (1, this machine, when local), points (and how many are measured already),
    expected minutes and node-hours. Minutes come from this machine's earlier complete runs, else the
    plan's estimate; steps whose points are all measured cost nothing."""
    timings = read_timings(folders.timings)
    out = []
    for step in steps:
        argv = folders.argv(step.command, step.reference)
        known = suite_points(argv, folders.results)
        points, measured = known if known else (step.points, None)
        on_slurm = known and executor == SLURM
        nodes = max(e.launch.nodes for e in named_suite(argv[1], checks=False).experiments) if on_slurm else 1
        past = timings.get(step.name)
        minutes, source = (past["minutes"], "measured here") if past else (step.minutes, "plan (2 cores)")
        if measured is not None and points:
            minutes *= (points - measured) / points
        out.append(Estimate(step, nodes, points, measured, minutes, source))
    return out


def format_estimate(rows: list[Estimate], executor: str) -> str:
    """The estimate as a table, with totals."""
    unit = "node-hours" if executor == SLURM else "hours here"
    lines = [f"{'step':<20} {'nodes':>5} {'points':>7} {'measured':>8} {'minutes':>8} {unit:>11}  source"]
    for r in rows:
        measured = "?" if r.measured is None else str(r.measured)
        lines.append(f"{r.step.name:<20} {r.nodes:>5} {r.points:>7} {measured:>8} {r.minutes:>8.1f} "
                     f"{r.node_hours:>11.3f}  {r.source}")
    lines.append(f"{'total':<20} {'':>5} {sum(r.points for r in rows):>7} {'':>8} {sum(r.minutes for r in rows):>8.1f} "
                 f"{sum(r.node_hours for r in rows):>11.3f}")
    if executor == SLURM:
        lines.append("node-hours = the nodes a step's suite asks for x its expected minutes (runs on the cluster's "
                     "hardware may differ from the 2-core estimate until they have run there once)")
    return "\n".join(lines)


def record_timing(folders: Folders, result: StepResult) -> None:
    """Keep a step's duration for later estimates when it measured every point itself."""
    if result.code or result.failed or result.skipped or not result.measured:
        return
    timings = read_timings(folders.timings)
    timings[result.step.name] = {"minutes": round(result.seconds / 60, 2), "points": result.measured}
    folders.timings.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(folders.timings, json.dumps(timings, indent=1, sort_keys=True) + "\n")
