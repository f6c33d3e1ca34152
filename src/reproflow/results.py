"""Result rows: one long-format CSV schema for every family, written atomically, one file a point.

Layout: `<results>/<suite>/<experiment>/<point-key>.csv`. A point whose file exists is done and
is skipped on reruns; a failed point leaves `<point-key>.failed.json` with the error instead.
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import reproflow
from reproflow.family import AGGREGATE, Measurement
from reproflow.params import canonical

SCHEMA_VERSION = 1

HEAD_COLUMNS = ("schema_version", "suite", "experiment", "family", "point")
MEASURE_COLUMNS = ("metric", "value", "unit", "repeat", "rank")
PROVENANCE_COLUMNS = (
    "job_id",
    "nodelist",
    "world_size",
    "backend",
    "device",
    "device_name",
    "torch_version",
    "nccl_version",
    "reproflow_version",
    "git_commit",
    "image",
    "image_sha256",
    "timestamp",
)
RESERVED = frozenset(HEAD_COLUMNS + MEASURE_COLUMNS + PROVENANCE_COLUMNS)


@dataclass(frozen=True)
class Provenance:
    """Where and how a job ran; written into every row."""

    job_id: str
    nodelist: str
    world_size: int
    backend: str
    device: str
    device_name: str
    torch_version: str
    nccl_version: str
    git_commit: str
    image: str
    image_sha256: str

    def columns(self) -> dict[str, Any]:
        """Provenance as row columns (timestamp is added at write time)."""
        return asdict(self) | {"reproflow_version": reproflow.__version__}


@cache
def git_commit(root: str) -> str:
    """The checkout's commit (with `-dirty` when it has local changes), or REPROFLOW_GIT_COMMIT.

    Containers bake the commit into REPROFLOW_GIT_COMMIT because they carry no .git folder.
    """
    if os.environ.get("REPROFLOW_GIT_COMMIT"):
        return os.environ["REPROFLOW_GIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def file_sha256(path: str) -> str:
    """sha256 of a file (the container's squash file), or '' when it is not a readable file.

    A `<file>.sha256` written by `make containers` after the file is used instead of reading
    gigabytes at every job start.
    """
    if not path or not os.path.isfile(path):
        return ""
    sidecar = path + ".sha256"
    if os.path.isfile(sidecar) and os.path.getmtime(sidecar) >= os.path.getmtime(path):
        with open(sidecar) as fh:
            recorded = fh.read().split()
        if recorded and len(recorded[0]) == 64:
            return recorded[0]
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def job_identity() -> tuple[str, str]:
    """(job id, image) from the environment the executors set.

    Slurm array tasks get `<job>_<task>`. A squash file given as image is recorded by path.
    """
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("REPROFLOW_JOB_ID") or f"pid{os.getpid()}"
    if os.environ.get("SLURM_ARRAY_TASK_ID") and os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return job, os.environ.get("REPROFLOW_IMAGE", "")


def machine_name() -> str:
    """Name of the processor a rank measured on, for the `device_name` column."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def point_path(results: Path, suite: str, experiment: str, key: str) -> Path:
    """Where a point's rows live."""
    return results / suite / experiment / f"{key}.csv"


def failure_path(csv_path: Path) -> Path:
    """Where a point's failure record lives."""
    return csv_path.with_suffix(".failed.json")


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_rows(
    head: Mapping[str, Any],
    params: Mapping[str, Any],
    measurements: Iterable[tuple[int, Measurement]],
    provenance: Provenance,
) -> list[dict[str, Any]]:
    """Rows in the shared schema from (repeat, measurement) pairs."""
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    prov = provenance.columns() | {"timestamp": stamp}
    base = {"schema_version": SCHEMA_VERSION, **head}
    fixed = {k: canonical(v) for k, v in params.items()}
    rows = []
    for repeat, m in measurements:
        clash = (set(m.coords) | set(fixed)) & RESERVED
        if clash:
            raise ValueError(f"columns {sorted(clash)} are reserved by the result schema")
        rows.append(
            base
            | fixed
            | {k: canonical(v) for k, v in m.coords.items()}
            | {
                "metric": m.metric,
                "value": m.value,
                "unit": m.unit,
                "repeat": repeat,
                "rank": AGGREGATE if m.rank is None else m.rank,
            }
            | prov
        )
    return rows


def rows_to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """CSV text; columns: schema head, parameters and coordinates, measurement, provenance."""
    middle: list[str] = []
    for row in rows:
        for key in row:
            if key not in RESERVED and key not in middle:
                middle.append(key)
    columns = list(HEAD_COLUMNS) + middle + list(MEASURE_COLUMNS) + list(PROVENANCE_COLUMNS)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write_failure(csv_path: Path, point_label: str, error: str, job_id: str) -> None:
    """Record why a point failed, next to where its rows would be."""
    record = {"point": point_label, "error": error, "job_id": job_id,
              "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    atomic_write(failure_path(csv_path), json.dumps(record, indent=1) + "\n")


def result_files(results: Path) -> list[Path]:
    """Every point CSV under a results folder."""
    if not results.is_dir():
        return []
    return sorted(p for p in results.rglob("*.csv") if not p.name.startswith("."))


def failure_files(results: Path) -> list[Path]:
    """Every failure record under a results folder."""
    if not results.is_dir():
        return []
    return sorted(results.rglob("*.failed.json"))
