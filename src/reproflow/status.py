"""`reproflow status`: what is measured, what failed, and the Slurm state of submitted jobs."""

from __future__ import annotations

import getpass
import json
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from reproflow.results import failure_files, result_files


@dataclass(frozen=True)
class SlurmJob:
    """One job (or array task) as sacct reports it."""

    job_id: str
    name: str
    state: str
    start: str
    end: str
    nodelist: str


def sacct_jobs(recorded: Iterable[str], days: int = 30) -> list[SlurmJob] | None:
    """reproflow's jobs of the last `days` days: the recorded ids and every job named `reproflow-*`.

    None when sacct is missing or accounting is off (states are then unknown, not guessed).
    """
    if shutil.which("sacct") is None:
        return None
    cmd = ["sacct", "-X", "-n", "-P", "-u", getpass.getuser(), "-S", f"now-{days}days",
           "-o", "JobID,JobName%60,State,Start,End,NodeList"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    wanted = set(recorded)
    jobs = []
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 6:
            continue
        job_id, name, state, start, end, nodes = fields
        if job_id in wanted or job_id.split("_")[0] in wanted or name.startswith("reproflow-"):
            # "CANCELLED by 0" -> "CANCELLED"
            jobs.append(SlurmJob(job_id, name, state.split()[0] if state else "UNKNOWN", start, end, nodes))
    return jobs


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
