"""Result rows: one long-format CSV schema for every family, written atomically, one file a point.

Layout: `<results>/<suite>/<experiment>/<point-key>.csv`. A point whose file exists and is whole is
done and is skipped on reruns; a failed point leaves `<point-key>.failed.json` with the error
instead. A file that is not whole (cut short by a full disk, a copy, an editor) is moved to
`<results>/quarantine/` with the reason, so it is never aggregated and its point runs again.
Each job also leaves `<results>/<suite>/env/<job>-<host>.json`: its environment, secrets redacted
(provenance.py, beside the provenance columns of every row).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reproflow.spec.errors import ReproflowError, shown
from reproflow.spec.family import AGGREGATE, Measurement
from reproflow.spec.params import canonical
from reproflow.spec.suite import NAME_RE, RESULTS_FOLDERS
from reproflow.store.files import atomic_write, make_folder, read_regular, regular_files
from reproflow.store.provenance import Provenance

# 2 added attempt, retry_of, health_gate, health_detail and point_rows; 3 added network; 4 added
# host_cpus; 5 added container_runtime and enroot_version; 6 added run_id. Files of every earlier schema
# are still read.
SCHEMA_VERSION = 6
READABLE_SCHEMAS = (1, 2, 3, 4, 5, 6)
QUARANTINE = RESULTS_FOLDERS[0]
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
    "run_id",
    "point_rows",
    "timestamp",
)
RESERVED = frozenset(HEAD_COLUMNS + MEASURE_COLUMNS + PROVENANCE_COLUMNS)
# Columns the readers use as names (of folders, files, figures) or as counts, and what a value there must
# be: a row holding anything else (`world_size = two`, a suite named `../..`) makes its file not whole,
# as a torn row does, with its line named.
# A name is also none of the words pandas reads as a missing value (`nan`, `None`, `NULL`, ...).
_NOT_MISSING = r"(?!(?:nan|none|null|na|n/a)$)"
_NAME = re.compile(_NOT_MISSING + NAME_RE.pattern, re.IGNORECASE)
TRUSTED = {"suite": (_NAME, "a suite name"), "experiment": (_NAME, "an experiment name"),
           "family": (_NAME, "a family name"),
           "point": (re.compile(_NOT_MISSING + r"[^\x00-\x1f]{1,4096}", re.IGNORECASE), "a point's label"),
           "world_size": (re.compile(r"[1-9][0-9]{0,6}"), "a rank count"),
           "repeat": (re.compile(r"[0-9]{1,7}"), "a repeat's number"),
           "rank": (re.compile(AGGREGATE + r"|[0-9]{1,7}"), "a rank or 'all'")}


def point_path(results: Path, suite: str, experiment: str, key: str) -> Path:
    """Where a point's rows live."""
    return results / suite / experiment / f"{key}.csv"


def writer_lock(results: Path, suite: str) -> Path:
    """The lock a run holds while it writes a suite's results (a dot file: no reader lists it)."""
    return results / suite / ".writer.lock"


def failure_path(csv_path: Path) -> Path:
    """Where a point's failure record lives."""
    return csv_path.with_suffix(".failed.json")


def make_rows(
    head: Mapping[str, Any],
    params: Mapping[str, Any],
    measurements: Iterable[tuple[int, Measurement]],
    provenance: Provenance,
) -> list[dict[str, Any]]:
    """Rows in the shared schema from (repeat, measurement) pairs."""
    stamp = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
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


def write_failure(csv_path: Path, point_label: str, error: str, job_id: str, run_id: str = "") -> None:
    """Record why a point failed, next to where its rows would be."""
    record = {"point": point_label, "error": error, "job_id": job_id, "run_id": run_id,
              "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    # <results>/<suite>/<experiment>/<point>: written through no link below the results folder
    atomic_write(failure_path(csv_path), json.dumps(record, indent=1) + "\n", under=csv_path.parents[2])


def _outside_quarantine(results: Path, paths: Iterable[Path]) -> list[Path]:
    return sorted(p for p in paths if not p.name.startswith(".") and p.relative_to(results).parts[0] != QUARANTINE)


def result_files(results: Path) -> list[Path]:
    """Every point CSV under a results folder (not the quarantined ones): regular files, no link followed."""
    if not results.is_dir():
        return []
    return _outside_quarantine(results, regular_files(results, lambda name: name.endswith(".csv")))


def failure_files(results: Path) -> list[Path]:
    """Every failure record under a results folder: regular files, no link followed."""
    if not results.is_dir():
        return []
    return _outside_quarantine(results, regular_files(results, lambda name: name.endswith(".failed.json")))


def _entries(folder: Path) -> list[os.DirEntry]:
    """A folder's entries but dot files (a writer's lock) and links, sorted; none where it cannot be listed."""
    try:
        with os.scandir(folder) as found:
            return sorted((e for e in found if not e.name.startswith(".") and not e.is_symlink()),
                          key=lambda e: e.name)
    except OSError:
        return []


def not_a_results_folder(results: Path) -> str:
    """Why `results` is not a folder reproflow wrote results into ('' when it is, or is empty or missing):
    one holds run manifests (runs/), suites it generated (*.toml), whole point files or failure records.
    Only the layout's depth is looked at (<suite>/<experiment>/<file>), so a home or /etc given by mistake
    is judged without walking it. Dot files and links are passed over: a folder holding nothing else, or
    suite folders holding nothing else (a writer's lock: a run starting), is empty."""
    if not results.is_dir() or (results / RESULTS_FOLDERS[1]).is_dir() or any(results.glob("*.toml")):
        return ""
    suites = _entries(results)
    if all(s.is_dir() and not _entries(Path(s.path)) for s in suites):
        return ""
    for suite in (s for s in suites if s.is_dir()):
        for experiment in (e for e in _entries(Path(suite.path)) if e.is_dir()):
            for file in (f for f in _entries(Path(experiment.path)) if f.is_file()):
                if file.name.endswith(".failed.json") or (file.name.endswith(".csv")
                                                          and not point_file_problem(Path(file.path))):
                    return ""
    return (f"{results} is not a results folder: it holds no run manifests (runs/), no generated suites, no "
            "point files (<suite>/<experiment>/*.csv with reproflow's header) and no failure records")


def writable_results(results: Path) -> None:
    """Refuse to write into `results` where it is a folder of something else (a home, /etc): a results
    folder is new, empty, or one reproflow wrote."""
    problem = not_a_results_folder(results)
    if problem:
        raise ReproflowError(f"--results: {problem}. Give a new folder, or one a run wrote its results into.")


def point_file_problem(path: Path) -> str:
    """Why a point CSV is not a whole result file ('' when it is): read before it is trusted or aggregated."""
    return read_point_file(path)[1]


def read_point_file(path: Path) -> tuple[list[dict[str, str]], str]:
    """A point CSV's rows (column -> text) and '', or no rows and why the file is not whole."""
    try:
        return point_rows(read_regular(path))
    except OSError as exc:
        return [], f"unreadable: {exc.strerror}"


def point_rows(data: bytes) -> tuple[list[dict[str, str]], str]:
    """A point file's bytes as rows (column -> text) and '', or no rows and why they are not a whole file:
    a reader that judges the bytes it has read keeps what it judged."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], f"not UTF-8 text (byte {exc.start} is {exc.object[exc.start:exc.start + 1]!r})"
    if not text.endswith("\n"):
        return [], "the last line is cut short (no final newline)"
    try:
        lines = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        return [], f"not CSV: {exc}"
    if not lines or tuple(lines[0][: len(HEAD_COLUMNS)]) != HEAD_COLUMNS:
        return [], "no reproflow header (schema_version, suite, experiment, family, point)"
    header, rows = lines[0], lines[1:]
    if not rows:
        return [], "a header and no rows"
    for i, row in enumerate(rows, start=2):
        if len(row) != len(header):
            return [], f"line {i} has {len(row)} fields, the header {len(header)}"
    fields = [dict(zip(header, row, strict=True)) for row in rows]
    versions = {f["schema_version"] for f in fields}
    if not versions <= {str(v) for v in READABLE_SCHEMAS}:
        return [], f"result schema {sorted(versions)}; this reproflow reads {list(READABLE_SCHEMAS)}"
    if "point_rows" in header:
        # A file of one point, or points' rows put together (each point's own count, the last cut short
        # when the file is).
        counts: dict[tuple[str, ...], list[str]] = {}
        for f in fields:
            counts.setdefault((f["suite"], f["experiment"], f["point"], f["job_id"]), []).append(f["point_rows"])
        for written in counts.values():
            if set(written) != {str(len(written))}:
                return [], f"{len(written)} rows where the writer wrote {written[0]}"
    for i, f in enumerate(fields, start=2):
        try:
            float(f["value"])
        except (KeyError, ValueError):
            return [], f"line {i}: value {shown(str(f.get('value')))} is not a number"
        for column, (pattern, what) in TRUSTED.items():
            if column in f and not pattern.fullmatch(f[column]):
                return [], f"line {i}: {column} {shown(f[column])} is not {what}"
    return fields, ""


def quarantine(results: Path, path: Path, problem: str) -> Path:
    """Move a torn point file to `<results>/quarantine/` (same relative path) with a note of why."""
    target = results / QUARANTINE / path.relative_to(results)
    make_folder(target.parent, results)
    try:
        os.replace(path, target)
    except FileNotFoundError:  # another job found the same torn file and moved it first
        return target
    why = {"file": str(path), "problem": problem,
           "quarantined": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    atomic_write(target.with_suffix(".why.json"), json.dumps(why, indent=1) + "\n", under=results)
    return target


