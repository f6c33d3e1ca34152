"""Result rows: one long-format CSV schema for every family, written atomically, one file a point.

Layout: `<results>/<suite>/<experiment>/<point-key>.csv`. A point whose file exists and is whole is
done and is skipped on reruns; a failed point leaves `<point-key>.failed.json` with the error
instead. A file that is not whole (cut short by a full disk, a copy, an editor) is moved to
`<results>/quarantine/` with the reason, so it is never aggregated and its point runs again.
Each job also leaves `<results>/<suite>/env/<job>-<host>.json`: its environment, secrets redacted.
"""

from __future__ import annotations

import csv
import datetime as _dt
import fcntl
import hashlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import reproflow
from reproflow.spec.family import AGGREGATE, Measurement
from reproflow.spec.params import canonical

# 2 added attempt, retry_of, health_gate, health_detail and point_rows; 3 added network; 4 added
# host_cpus; 5 added container_runtime and enroot_version. Files of every earlier schema are still read.
SCHEMA_VERSION = 5
READABLE_SCHEMAS = (1, 2, 3, 4, 5)
QUARANTINE = "quarantine"
# Values of the health_gate column (reproflow.rank.health).
GATE_PASS, GATE_FAIL, GATE_OFF = "pass", "fail", "off"

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
    "container_runtime",
    "enroot_version",
    "attempt",
    "retry_of",
    "health_gate",
    "health_detail",
    "network",
    "host_cpus",
    "point_rows",
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
    # How the job's steps ran in the image (pyxis, oci, apptainer; empty: no container), and with Pyxis
    # the Enroot version of its nodes, as the job script found them.
    container_runtime: str = ""
    enroot_version: str = ""
    # 1 for a first submission; a retry of an infrastructure failure counts up and names the job it retries.
    attempt: int = 1
    retry_of: str = ""
    # The all-reduce check made on the allocation before any point: pass, fail, or off.
    health_gate: str = "off"
    health_detail: str = ""
    # The links between hosts: a local run's emulated network or loopback; empty on a cluster (its own).
    network: str = ""
    # CPU cores rank 0 may run on: a CPU run with more ranks per host than cores measures time-sharing.
    host_cpus: int = 0

    def columns(self) -> dict[str, Any]:
        """Provenance as row columns (point_rows and timestamp are added at write time)."""
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


def image_sha256(image: str) -> str:
    """The image's sha256: what the job script read on the host (REPROFLOW_IMAGE_SHA256; inside a
    container the squash file itself is out of sight), else the file's own."""
    return os.environ.get("REPROFLOW_IMAGE_SHA256") or file_sha256(image)


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
    measurements = list(measurements)
    # Every row carries the file's row count, so a file cut at a line boundary is still seen as torn.
    prov = provenance.columns() | {"point_rows": len(measurements), "timestamp": stamp}
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


def _outside_quarantine(results: Path, paths: Iterable[Path]) -> list[Path]:
    return sorted(p for p in paths if not p.name.startswith(".") and p.relative_to(results).parts[0] != QUARANTINE)


def result_files(results: Path) -> list[Path]:
    """Every point CSV under a results folder (not the quarantined ones)."""
    if not results.is_dir():
        return []
    return _outside_quarantine(results, results.rglob("*.csv"))


def failure_files(results: Path) -> list[Path]:
    """Every failure record under a results folder."""
    if not results.is_dir():
        return []
    return _outside_quarantine(results, results.rglob("*.failed.json"))


def point_file_problem(path: Path) -> str:
    """Why a point CSV is not a whole result file ('' when it is): read before it is trusted or aggregated."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable: {exc}"
    if not text.endswith("\n"):
        return "the last line is cut short (no final newline)"
    try:
        lines = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        return f"not CSV: {exc}"
    if not lines or tuple(lines[0][: len(HEAD_COLUMNS)]) != HEAD_COLUMNS:
        return "no reproflow header (schema_version, suite, experiment, family, point)"
    header, rows = lines[0], lines[1:]
    if not rows:
        return "a header and no rows"
    for i, row in enumerate(rows, start=2):
        if len(row) != len(header):
            return f"line {i} has {len(row)} fields, the header {len(header)}"
    fields = [dict(zip(header, row, strict=True)) for row in rows]
    versions = {f["schema_version"] for f in fields}
    if not versions <= {str(v) for v in READABLE_SCHEMAS}:
        return f"result schema {sorted(versions)}; this reproflow reads {list(READABLE_SCHEMAS)}"
    if "point_rows" in header and {f["point_rows"] for f in fields} != {str(len(rows))}:
        return f"{len(rows)} rows where the writer wrote {fields[0]['point_rows']}"
    for i, f in enumerate(fields, start=2):
        try:
            float(f["value"])
        except (KeyError, ValueError):
            return f"line {i}: value {f.get('value')!r} is not a number"
    return ""


def quarantine(results: Path, path: Path, problem: str) -> Path:
    """Move a torn point file to `<results>/quarantine/` (same relative path) with a note of why."""
    target = results / QUARANTINE / path.relative_to(results)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, target)
    atomic_write(target.with_suffix(".why.json"), json.dumps({
        "file": str(path), "problem": problem,
        "quarantined": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}, indent=1) + "\n")
    return target


def append_line(path: Path, line: str) -> None:
    """Append one line under an exclusive lock, so concurrent jobs writing one file lose no line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(line.rstrip("\n") + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# Names whose values are not written down: tokens, passwords, keys of cloud and tracking services.
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSW|PASSPHRASE|CREDENTIAL|PRIVATE|COOKIE|SESSION|SIGNATURE|"
                          r"(^|_)(API_?)?KEY($|_)|(^|_)AUTH($|_)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@/\s]+@")
REDACTED = "<redacted>"


# NAME=value inside a value: Slurm's SLURM_EXPORT_ENV repeats what `sbatch --export=...,API_TOKEN=x` set.
_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=([^,\s]*)")


def _redact_value(value: str) -> str:
    value = _URL_PASSWORD.sub(rf"\1{REDACTED}@", value)
    return _ASSIGNMENT.sub(lambda m: f"{m[1]}={REDACTED}" if _SECRET_NAME.search(m[1]) else m[0], value)


def redact_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with <redacted> for the values of secret-looking names, for such NAME=value pairs inside other
    values, and for passwords inside URLs."""
    return {name: REDACTED if _SECRET_NAME.search(name) else _redact_value(value)
            for name, value in sorted(env.items())}


def _proc_field(path: str, name: str) -> str:
    """The first `name: value` of a /proc file ('' where there is none, e.g. off Linux)."""
    try:
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> set[str]:
    """This CPU's feature flags (x86 `flags`, Arm `Features`; empty where /proc/cpuinfo has neither)."""
    return set((_proc_field("/proc/cpuinfo", "flags") or _proc_field("/proc/cpuinfo", "Features")).split())


def hardware() -> dict[str, object]:
    """What this host measures on: CPU model and cores, memory, the GPUs torch sees, OS and Python."""
    torch = sys.modules.get("torch")  # already loaded by the job; the report reads the record without it
    gpus = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch is not None and torch.cuda.is_available() else [])
    memory_kib = _proc_field("/proc/meminfo", "MemTotal").split(" ")[0]
    return {"cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
            "cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "memory_gib": round(int(memory_kib) / 2**20, 1) if memory_kib.isdigit() else None,
            "gpus": gpus, "os": platform.platform(), "python": platform.python_version()}


def write_environment(results: Path, suite: str, job_id: str, host: str, ranks: Sequence[int]) -> Path:
    """Record the hardware and the environment this job runs with (secrets redacted) next to its results."""
    path = results / suite / "env" / f"{job_id}-{host}.json"
    record = {"job_id": job_id, "host": host, "ranks": list(ranks), "hardware": hardware(),
              "environment": redact_environment(os.environ)}
    atomic_write(path, json.dumps(record, indent=1) + "\n")
    return path
