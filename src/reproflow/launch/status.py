"""`reproflow status`: what is measured, what failed, and the Slurm state of submitted jobs."""

from __future__ import annotations

import getpass
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from reproflow.launch.shell import run, run_lines
from reproflow.spec.suite import JOB_ID_RE
from reproflow.store.files import json_object, read_regular
from reproflow.store.results import failure_files, result_files


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
    wanted = sorted(set(recorded))
    base = ["sacct", "-X", "-n", "-P", "-o", "JobID,JobName%60,State,Start,End,NodeList"]
    # The time window finds this user's jobs by name; -j finds recorded ones too, including pending
    # jobs whose dependencies are unmet (their eligible time is unknown, so no time window lists them).
    queries = [[*base, "-u", getpass.getuser(), "-S", f"now-{days}days"]]
    if wanted:
        queries.append([*base, "-j", ",".join(wanted)])
    found: dict[str, SlurmJob] = {}
    for cmd in queries:
        proc = run(cmd)
        if proc is None or proc.returncode:
            return None
        for line in proc.stdout.splitlines():
            fields = line.split("|")
            if len(fields) != 6:
                continue
            job_id, name, state, start, end, nodes = fields
            if job_id in wanted or job_id.split("_")[0] in wanted or name.startswith("reproflow-"):
                # "CANCELLED by 0" -> "CANCELLED"
                found[job_id] = SlurmJob(job_id, name, state.split()[0] if state else "UNKNOWN", start, end, nodes)
    # Held jobs never become eligible, so sacct lists them only by id: ask squeue for live jobs.
    live = run_lines(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%j|%T|%S|%e|%N"])
    for fields in (line.split("|") for line in live):
        if len(fields) == 6 and fields[0] not in found and fields[1].startswith("reproflow-"):
            start, end = (v if v not in ("N/A", "Unknown") else "" for v in fields[3:5])
            found[fields[0]] = SlurmJob(fields[0], fields[1], fields[2], start, end, fields[5])
    return sorted(found.values(), key=lambda j: [int(x) if x.isdigit() else 0 for x in j.job_id.split("_")])


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
        try:
            lines = read_regular(path).splitlines()
        except OSError:
            continue
        # A line that is not a job record (damaged, or written by hand) is passed over, not trusted.
        records = (json_object(line) for line in lines if line.strip())
        jobs += [r for r in records if r and JOB_ID_RE.fullmatch(str(r.get("job_id", "")))
                 and isinstance(r.get("suite"), str)]
    return jobs


def cluster_name() -> str:
    """The Slurm cluster's name (slurm.conf ClusterName), for a run's manifest; '' where scontrol cannot say."""
    for line in run_lines(["scontrol", "show", "config"]) if shutil.which("scontrol") else []:
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return ""
