"""`reproflow status`: what is measured, what failed, and the Slurm state of submitted jobs."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from reproflow.results import failure_files, result_files

# Slurm job states reproflow reports as they are; sacct's "CANCELLED by <uid>" is shortened.
STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
          "PREEMPTED", "REQUEUED", "SUSPENDED", "BOOT_FAIL", "DEADLINE")


def sacct_states(job_ids: Iterable[str]) -> dict[str, str]:
    """Job id -> state from sacct (one call for all jobs); {} when sacct is not installed."""
    ids = sorted(set(job_ids))
    if not ids or shutil.which("sacct") is None:
        return {}
    try:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids)],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    states = {}
    for line in out.splitlines():
        if "|" in line:
            job, state = line.split("|", 1)
            states[job.strip()] = state.split()[0] if state.strip() else "UNKNOWN"
    return states


@dataclass(frozen=True)
class ExperimentStatus:
    """Point counts of one experiment's results folder."""

    suite: str
    experiment: str
    done: int
    failed: int


def _label(path: Path) -> str:
    # <label>-w<world>-<device>-<hash>.csv: the label identifies the point across settings.
    return path.name.split(".")[0].rsplit("-", 3)[0]


def experiment_status(results: Path) -> list[ExperimentStatus]:
    """Done and failed point counts per suite and experiment under `results`."""
    done: dict[tuple[str, str], set[str]] = {}
    failed: dict[tuple[str, str], set[str]] = {}
    for table, files in ((done, result_files(results)), (failed, failure_files(results))):
        for f in files:
            rel = f.relative_to(results).parts
            if len(rel) == 3:
                table.setdefault((rel[0], rel[1]), set()).add(_label(f))
    keys = sorted(set(done) | set(failed))
    return [ExperimentStatus(s, e, len(done.get((s, e), ())), len(failed.get((s, e), set()) - done.get((s, e),
            set()))) for s, e in keys]


def submitted_jobs(results: Path) -> list[dict[str, str]]:
    """Jobs recorded by `reproflow submit`, oldest first."""
    jobs = []
    for path in sorted(results.glob("*/jobs.jsonl")):
        jobs.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return jobs
