"""The Python API: what the command line does, for notebooks and submitit users.

A suite is named as on the command line (`param-demo` is workflows/param-demo.toml) or given by
path; `overrides` fix a parameter for every point, as `--set` does. Every function returns what a
script needs next (an exit code, job ids, a pandas frame, files) and raises ReproflowError, with the
field and the fix in its message, on bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reproflow.paths import project_root
from reproflow.suite import Suite, named_suite, override_strings

if TYPE_CHECKING:
    import pandas as pd

    from reproflow.claims import Claim


def load_suite(suite: str | Path, overrides: Mapping[str, Any] | None = None) -> Suite:
    """The suite with its experiments and points (parameters resolved), without running anything."""
    return named_suite(str(suite), override_strings(overrides or {}))


def run_suite(suite: str | Path, experiments: Sequence[str] = (), *, results: str | Path = "results",
        overrides: Mapping[str, Any] | None = None, procs: int | None = None, network: str | None = None,
        force: bool = False) -> int:
    """Run the suite's experiments (all, or those named) on this machine, one process group each;
    points measured before are skipped unless `force`. Returns 0, or the first failing exit code."""
    from reproflow.local import LocalExecutor

    sets = override_strings(overrides or {})
    loaded = named_suite(str(suite), sets)
    executor = LocalExecutor(Path(results), project_root(), force, procs, tuple(sets), network)
    worst = 0
    for exp in loaded.select(list(experiments)):
        if exp.launch.nodes > 1 and not procs:
            print(f"reproflow: {exp.name} asks for {exp.launch.nodes} nodes; running its "
                  f"{executor.world_size(exp)} ranks on this machine (use `reproflow submit` or sbatch for real nodes)")
        code = executor.run(loaded, exp)
        if code < 0:  # a rank killed by a signal: report it as a shell does (128 + signal)
            print(f"reproflow: experiment {exp.name} ended: a rank was killed by signal {-code}", file=sys.stderr)
            code = 128 - code
        elif code:
            print(f"reproflow: experiment {exp.name} ended with exit code {code}"
                  + (" (some points failed; see *.failed.json)" if code == 3 else ""), file=sys.stderr)
        worst = worst or code
    return worst


def submit_suite(suite: str | Path, experiments: Sequence[str] = (), *, results: str | Path = "results",
           overrides: Mapping[str, Any] | None = None, nodes: int | None = None, procs: int | None = None,
           partition: str | None = None, image: str = "", mounts: str = "", retries: int = 0,
           wait: bool = False) -> list[str]:
    """Submit the suite's experiments to Slurm through submitit (`results` must be on storage the nodes
    share); returns the Slurm job ids. With `wait` or `retries`, waits for them and resubmits jobs that
    failed for the infrastructure (at most `retries` times, without the failed nodes)."""
    from reproflow.submit import SubmititExecutor

    sets = override_strings(overrides or {})
    loaded = named_suite(str(suite), sets)
    executor = SubmititExecutor(Path(results), project_root(), nodes, procs, partition, image, mounts,
                                force=False, sets=tuple(sets))
    ids: list[str] = []
    for exp in loaded.select(list(experiments)):
        if wait or retries:
            ids += [j for attempt in executor.supervise(loaded, exp, retries) for j in attempt.job_ids]
        else:
            ids += executor.submit(loaded, exp)
    return ids


def read_results(folder: str | Path = "results") -> pd.DataFrame:
    """Every row under the results folder as one long frame (torn files quarantined, points whose job
    failed its health gate left out), as the report reads them."""
    from reproflow.report import load_results

    return load_results(Path(folder))


def build_report(folder: str | Path = "results", out: str | Path = "reports",
                 families: Sequence[str] = ()) -> list[Path]:
    """Tables, figures, the claims and the report page (report.html, report.md) from the rows under
    `folder` into `out`; with `families`, only their tables and figures. Returns the files written."""
    from reproflow.report import build_reports

    return build_reports(Path(folder), Path(out), project_root(), families)


def check_claims(folder: str | Path = "results", out: str | Path = "reports") -> list[Claim]:
    """The papers' claims checked again on the rows under `folder` (claims.csv and .md rewritten in `out`)."""
    from reproflow import report

    return report.check_claims(Path(folder), Path(out), project_root())[0]
