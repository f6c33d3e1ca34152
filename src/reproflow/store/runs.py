"""Runs: the id every row of one invocation carries, and the manifest the invoking process writes.

A run is one `reproflow run`, `submit` or `reproduce` (so one `make demo`). The invoking process
picks its id, puts it in REPROFLOW_RUN_ID for everything it starts (ranks, jobs, the steps of a
reproduction, which then join it rather than open runs of their own), and writes
`<results>/runs/<id>.json` when it starts and again when it ends: what was asked, where, with which
code and image, and how it ended. Ranks never write it. Rows of jobs started without a run (an
sbatch script submitted by hand) carry `job-<Slurm job id>`. The folders runs wrote to are listed in
the catalog's `folders.txt`, so that `reproflow runs` finds them.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reproflow.spec.errors import ParamError, ReproflowError, shown, text_problem
from reproflow.spec.paths import project_root
from reproflow.spec.suite import RESULTS_FOLDERS
from reproflow.store.files import append_line, atomic_write
from reproflow.store.provenance import git_commit, hardware, image_sha256
from reproflow.store.results import writable_results

RUN_ID_ENV = "REPROFLOW_RUN_ID"
# What a run id, or the start of one, is made of (new_run_id's and job_run_id's characters).
RUN_ID_START = re.compile(r"[A-Za-z0-9_.-]{1,128}")
RUNS = RESULTS_FOLDERS[1]  # <results>/runs/<run id>.json; no suite may take the name
CATALOG_ENV = "REPROFLOW_CATALOG"
# How a run ended, in its manifest.
RUNNING, COMPLETED, FAILED, INTERRUPTED = "running", "completed", "failed", "interrupted"
SUBMITTED = "submitted (its jobs' rows tell the rest)"


def now() -> str:
    """This moment in UTC, as every timestamp of the results."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def new_run_id() -> str:
    """A run id that sorts by start time and stays unique across hosts: 20261126-171500-3fa2c1."""
    return f"{_dt.datetime.now(_dt.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def row_run_id(job_id: str) -> str:
    """The run a rank's rows belong to: the invoking process's, else the job's own."""
    return os.environ.get(RUN_ID_ENV) or job_run_id(job_id)


def job_run_id(job_id: str) -> str:
    """The run of a job started outside any run (and of rows written before runs had ids): one per Slurm
    job, an array's tasks together."""
    return f"job-{job_id.split('_')[0]}"


def manifest_path(results: Path, run_id: str) -> Path:
    """Where a run's manifest lives."""
    return results / RUNS / f"{run_id}.json"


def catalog_home() -> Path:
    """The catalog's folder: REPROFLOW_CATALOG, else $XDG_DATA_HOME/reproflow (~/.local/share/reproflow)."""
    if os.environ.get(CATALOG_ENV):
        return Path(os.environ[CATALOG_ENV])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "reproflow"


def known_folders() -> list[Path]:
    """The results folders runs were recorded in, each once, in the order first seen."""
    listing = catalog_home() / "folders.txt"
    lines = listing.read_text().splitlines() if listing.exists() else []
    return [Path(line) for line in dict.fromkeys(line.strip() for line in lines) if line]


def register_folder(results: Path) -> None:
    """Add a results folder to the catalog's list (once). A path that is not one line of text (a line
    break, bytes that are not UTF-8) cannot be listed there, and is said so."""
    folder = results.resolve()
    problem = text_problem(str(folder))
    if problem:
        print(f"reproflow: the results folder {shown(str(folder))} {problem}: not added to the catalog "
              "(`runs` and `compare` find it with --results)", file=sys.stderr)
        return
    if folder not in known_folders():
        append_line(catalog_home() / "folders.txt", str(folder))


@contextmanager
def recorded_run(results: Path, command: Sequence[str], *, suites: Sequence[str], cluster: str, executor: str,
                 nodes: int | None = None, image: str = "", keep_empty: bool = True) -> Iterator[dict[str, Any]]:
    """Open a run for the body (its manifest written at start and at the end, with how it ended), or,
    inside a run already open (REPROFLOW_RUN_ID set), join that one and write nothing. Without
    `keep_empty`, a run that ends well having written nothing under `results` is taken back (a family's
    command that ran no suite: Aceso's search on the artifact's database).

    The body may set `exit_code` in the yielded record, and `ends_as` for the state of a success (jobs
    submitted and not waited for: SUBMITTED); an exception ends the run as failed or interrupted and goes
    on up.
    """
    if os.environ.get(RUN_ID_ENV):
        yield {"run_id": os.environ[RUN_ID_ENV]}
        return
    run_id = new_run_id()
    host = hardware()
    record: dict[str, Any] = {
        "run_id": run_id, "command": ["reproflow", *command], "results": str(results.resolve()),
        "suites": list(suites), "executor": executor, "cluster": cluster, "nodes": nodes,
        "host": platform.node(), "cpu_model": host["cpu_model"], "gpus": host["gpus"],
        "git_commit": git_commit(str(project_root())),
        "image": image, "image_sha256": image_sha256(image) if image else "",
        "start": now(), "end": "", "state": RUNNING, "exit_code": None}
    writable_results(results)
    path = manifest_path(results, run_id)
    made, started = _first_missing(results), time.time()
    atomic_write(path, json.dumps(record, indent=1) + "\n", under=results)
    register_folder(results)
    os.environ[RUN_ID_ENV] = run_id
    try:
        yield record
    except KeyboardInterrupt:
        record.update(state=INTERRUPTED, exit_code=130)
        raise
    except (ReproflowError, ParamError) as exc:
        if not _written_since(results, started):
            # Input refused before anything ran (a bad suite, a missing tool): no run to record.
            record["state"] = ""
            _remove(path, results, made)
        else:
            record.update(state=FAILED, exit_code=2, error=str(exc)[:500])
        raise
    except BaseException as exc:
        record.update(state=FAILED, exit_code=record.get("exit_code") or 1, error=str(exc)[:500])
        raise
    else:
        code = record.get("exit_code") or 0
        # A body that only hands work on (jobs submitted and not waited for) names how it ended instead.
        record.update(state=record.pop("ends_as", COMPLETED) if code == 0 else FAILED, exit_code=code)
        if code == 0 and not keep_empty and not _written_since(results, started):
            record["state"] = ""
            _remove(path, results, made)
    finally:
        del os.environ[RUN_ID_ENV]
        if record["state"]:
            record["end"] = now()
            atomic_write(path, json.dumps(record, indent=1) + "\n", under=results)
            print(f"reproflow: run {run_id} ({record['state']}): {path}", file=sys.stderr)


def _written_since(results: Path, started: float) -> bool:
    """Whether anything beside the runs' manifests and reproflow's hidden files (a writer's lock) was written
    under the results folder since `started`."""
    return any(p.stat().st_mtime >= started for p in results.rglob("*")
               if p.is_file() and not p.name.startswith(".") and p.relative_to(results).parts[0] != RUNS) \
        if results.is_dir() else False


def _first_missing(folder: Path) -> Path | None:
    """The outermost of `folder` and its parents that does not exist yet (None: `folder` exists)."""
    missing = None
    for f in (folder, *folder.absolute().parents):
        if f.exists() or f.is_symlink():
            return missing
        missing = f
    return missing


def _remove(manifest: Path, results: Path, made: Path | None) -> None:
    """Take back a manifest, its folder when empty, and the folders the run made for its results (from
    `made`, the outermost, down to `results`), each when empty."""
    manifest.unlink(missing_ok=True)
    folders = [manifest.parent]
    if made is not None:
        folders += [f for f in (results.absolute(), *results.absolute().parents) if f.is_relative_to(made.absolute())]
    for folder in folders:
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()
