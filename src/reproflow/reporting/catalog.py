"""The run catalog: an index of results folders in one SQLite file, brought up to date from their files
whenever they are newer, and the runs it lists (`reproflow runs`) and compares (`reproflow compare`).

The result files stay the only truth: the index holds, per point file, who measured it (run, job,
provenance) and, per metric, the count, the mean and variance of the logarithms and the median of
its repeated samples, which is all the comparisons' statistics need. A file newer or larger than
when it was indexed is read again, a file gone is forgotten; deleting the index loses nothing.
SQLite rather than DuckDB over the CSVs (docs/runs.md): a cold index costs reading and parsing a CSV
per point, which pandas' C reader does fastest given many files' lines at once and only the columns
that differ from row to row (a point's provenance is read from its first line), and a warm one costs
looking up runs, points and series, which SQLite's indexes answer in milliseconds at a million points.
Hence no second engine and no columnar copy beside the files: a results folder none of whose folders
changed is skipped on its folders' times, runs are listed from a summary per run and folder, and new
files are parsed many at a time (store.frames), by a process per core. A point's metrics name it by its
row id, so its names and provenance are written once. Only the process that reads it writes it, in the catalog's folder
(store.runs.catalog_home): never a rank, never inside a results folder, where several writers on
Lustre or NFS break SQLite's locks.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import json
import math
import multiprocessing
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd

from reproflow.spec.errors import ReproflowError, text_problem
from reproflow.spec.family import AGGREGATE, families
from reproflow.store.files import read_json_object
from reproflow.store.frames import CHUNK, PointFrame, read_point_frames
from reproflow.store.results import GATE_FAIL, QUARANTINE, RESERVED
from reproflow.store.runs import RUN_ID_START, RUNS, catalog_home, job_run_id, known_folders

INDEX_VERSION = 7
# Provenance that makes two runs different machines or software, kept per point for `compare`.
MANIFEST = ("git_commit", "reproflow_version", "image", "image_sha256", "container_runtime", "enroot_version",
            "device", "device_name", "backend", "world_size", "nodelist", "host_cpus", "network", "torch_version",
            "nccl_version")
KEY = ["suite", "experiment", "point", "coords", "metric"]
TIME_UNITS = ("s", "ms", "us", "ns")  # the per-rank metrics `reproflow nodes` reads: times, lower is better
T = TypeVar("T")
MATCH_KEY = ["family", "match", "metric"]  # compare --match: points matched by the named fields only
# Samples and per-rank times refer to their point by its row id: a point's names, run and folder are kept
# once, in points, not on each of its metrics' rows (a third of the index's size and of its writes).
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS files(path TEXT PRIMARY KEY, folder TEXT, mtime_ns INTEGER, size INTEGER) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dirs(path TEXT PRIMARY KEY, folder TEXT, mtime_ns INTEGER, subdirs TEXT);
CREATE TABLE IF NOT EXISTS manifests(path TEXT PRIMARY KEY, folder TEXT, run_id TEXT, record TEXT);
CREATE TABLE IF NOT EXISTS points(id INTEGER PRIMARY KEY, path TEXT, folder TEXT, run_id TEXT, job_id TEXT,
    suite TEXT, experiment TEXT, family TEXT, point TEXT, failed INTEGER, timestamp TEXT, params TEXT,
    {", ".join(f"{c} TEXT" for c in MANIFEST)}, invalid TEXT);
CREATE TABLE IF NOT EXISTS samples(pid INTEGER, coords TEXT, metric TEXT, unit TEXT, n INTEGER, log_mean REAL,
    log_var REAL, median REAL);
CREATE TABLE IF NOT EXISTS ranks(pid INTEGER, coords TEXT, metric TEXT, rank INTEGER, node TEXT, log_median REAL);
CREATE TABLE IF NOT EXISTS runs_in(folder TEXT, run_id TEXT, suites TEXT, points INTEGER, failed INTEGER,
    first TEXT, last TEXT, hardware TEXT, nodes TEXT, commits TEXT);
CREATE INDEX IF NOT EXISTS dirs_folder ON dirs(folder);
CREATE INDEX IF NOT EXISTS manifests_folder ON manifests(folder);
CREATE INDEX IF NOT EXISTS points_run ON points(run_id);
CREATE INDEX IF NOT EXISTS points_folder ON points(folder);
CREATE INDEX IF NOT EXISTS points_path ON points(path);
CREATE INDEX IF NOT EXISTS points_point ON points(point);
CREATE INDEX IF NOT EXISTS samples_pid ON samples(pid);
CREATE INDEX IF NOT EXISTS ranks_pid ON ranks(pid);
CREATE INDEX IF NOT EXISTS runs_in_folder ON runs_in(folder);
PRAGMA user_version = {INDEX_VERSION};
"""


@dataclass(frozen=True)
class Selection:
    """Which indexed rows make one side of a comparison: a folder's newest points, or one run's."""

    label: str
    folder: str
    run_id: str = ""

    def where(self, table: str = "") -> tuple[str, tuple[str, ...]]:
        """SQL condition and its arguments."""
        prefix = f"{table}." if table else ""
        if self.run_id:
            return f"{prefix}run_id = ?", (self.run_id,)
        return f"{prefix}folder = ?", (self.folder,)


def index_path() -> Path:
    """The catalog's index: one file per index version in the catalog's folder, so that two versions of
    reproflow sharing a home keep their own instead of deleting each other's."""
    return catalog_home() / f"index-v{INDEX_VERSION}.sqlite"


def using_index(work: Callable[[sqlite3.Connection], T]) -> T:
    """`work` done on the catalog's index. An index SQLite finds damaged is removed and built again from
    the results folders, once (it holds nothing they do not); a locked one is an error, never removed."""
    path = index_path()
    for attempt in (1, 2):
        try:
            with contextlib.closing(connect(path)) as con:
                return work(con)
        except sqlite3.OperationalError as exc:  # locked, or not writable: never removed
            raise ReproflowError(f"the catalog's index {path} cannot be used ({exc}): another reproflow may hold "
                                 "it, or its folder's file system has no working locks (NFS without lockd). Set "
                                 "REPROFLOW_CATALOG to a folder on a local disk (the index is rebuilt there from "
                                 "the results folders).") from None
        except sqlite3.DatabaseError as exc:  # not a database, or a malformed page
            if attempt == 2:
                raise ReproflowError(f"the catalog's index {path} is still damaged after it was built again "
                                     f"({exc}); check the disk of {path.parent}, or set REPROFLOW_CATALOG to a "
                                     "folder on another.") from None
            print(f"reproflow: the catalog's index {path} is damaged ({exc}); removed, and built again from the "
                  "results folders", file=sys.stderr)
            for suffix in ("", "-journal", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    raise AssertionError("unreachable")


def connect(path: Path) -> sqlite3.Connection:
    """The index at `path`, made (or made again, when written by another version) where needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=120)
    try:
        if con.execute("PRAGMA user_version").fetchone()[0] not in (0, INDEX_VERSION):
            con.close()
            path.unlink()
            con = sqlite3.connect(path, timeout=120)
        con.executescript(_SCHEMA)
    except sqlite3.Error:
        con.close()
        raise
    return con


# A folder modified this close to being listed may change again within its time's granularity (a
# second on some file systems): it is listed again next time rather than trusted.
_RACY_NS = 2_000_000_000
_SKIPPED = ("submitit", "env", "logs")


def _indexed_name(name: str, manifests: bool) -> bool:
    return not name.startswith(".") and (name.endswith(".csv") or name.endswith(".failed.json")
                                         or (manifests and name.endswith(".json")))


def _list(folder: Path, directory: str) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """A folder's indexed files (path -> (mtime, size)) and the subfolders to look into."""
    files, subdirs = {}, []
    manifests = directory == str(folder / RUNS)
    with os.scandir(directory) as entries:
        for entry in entries:
            if text_problem(entry.name):  # not a name reproflow writes (bytes that are not UTF-8, a line break)
                continue
            if entry.is_dir(follow_symlinks=False):
                if not entry.name.startswith(".") and entry.name not in _SKIPPED and not (
                        directory == str(folder) and entry.name == QUARANTINE):
                    subdirs.append(entry.path)
            elif _indexed_name(entry.name, manifests) and entry.is_file(follow_symlinks=False):
                stat = entry.stat(follow_symlinks=False)
                files[entry.path] = (stat.st_mtime_ns, stat.st_size)
    return files, subdirs


# Until this many new files, they are read in this process (starting a pool costs about what reading a
# thousand does); from the results folder that reaches it on, a process per core reads them.
_POOL_FILES = 2000
_TABLES = ("manifests", "points", "samples", "ranks")
# A point's columns the index reads from its first row only (its provenance, the same on each row of a job's
# point): the parse of every other row leaves them out (store.frames).
_PER_POINT = RESERVED - {"metric", "value", "unit", "repeat", "rank", "health_gate"}
_POINT_FIELDS = 12 + len(MANIFEST) + 1  # id, path ... params, the provenance, invalid
_encode = json.encoder.encode_basestring_ascii  # json.dumps' own, for texts (ensure_ascii)
# What the readers send the writer, per table: manifests' and points' rows; samples' and ranks' rows as blocks
# of columns (lists), the first the places of their points in `points` (numbers; built and written by zip,
# not a tuple a row in Python).
Records = dict[str, list]


@dataclass
class _Changes:
    """What one results folder's files are, against the index: the files to forget and to read, every
    indexed file's (mtime, size) and every folder's (mtime, subfolders) to record."""

    stale: list[str]
    fresh: list[str]
    on_disk: dict[str, tuple[int, int]]
    seen: dict[str, tuple[int, list[str]]]


class Ticker:
    """Progress on stderr for work that may take long: a line every `every` seconds, none before, so a
    command that answers fast prints nothing and one that does not says what it is doing."""

    def __init__(self, what: str, every: float = 2.0) -> None:
        self.what, self.every = what, every
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int = 0) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(f"reproflow: {self.what}: {done}{f' of {total}' if total else ''} ({now - self.start:.0f} s)",
                  file=sys.stderr, flush=True)


def refresh(con: sqlite3.Connection, folders: Iterable[Path], rescan: bool = False) -> int:
    """Bring the index up to date with the folders' files; returns how many files were read again.

    A folder whose modification time is the one indexed has gained, lost and renamed no file, so its
    files are taken as indexed without a stat each (reproflow replaces files by renaming them, which
    changes the folder's time), and a results folder none of whose folders changed is not looked at
    further; `rescan` stats every file, for files edited in place. New files are read in batches of
    results folders, a few thousand files each (a cold index of a million files never holds them all),
    by a process per core when there are many (reading a batch while the one before is written), and
    each batch is written in one transaction."""
    cores, read = len(os.sched_getaffinity(0)), 0
    tick = Ticker("new or changed result files read into the run catalog's index")
    with contextlib.ExitStack() as stack:
        pool = None
        batch: list[tuple[Path, _Changes]] = []
        fresh: list[tuple[Path, str]] = []
        reading = None  # a batch the pool reads while the one before it is written
        # Each folder once: a batch's changes are listed before any of it is written.
        for folder in [*dict.fromkeys(f.resolve() for f in folders), None]:
            changes = _changes(con, folder, rescan) if folder else None
            if changes:
                batch.append((folder, changes))
                fresh += [(folder, name) for name in changes.fresh]
            if folder and len(fresh) < CHUNK * cores:
                continue
            if pool is None and cores > 1 and read + len(fresh) >= _POOL_FILES:
                # fork: the workers need this process's family registry, not a fresh import of every family
                pool = stack.enter_context(multiprocessing.get_context("fork").Pool(cores))
            # With a pool, a part per process at least, or a night's few hundred files keep one busy.
            size = max(1, min(CHUNK, -(-len(fresh) // cores))) if pool else CHUNK
            parts = [fresh[i:i + size] for i in range(0, len(fresh), size)]
            if pool:
                before, reading = reading, (batch, pool.map_async(_read_files, parts))
                if before:
                    _write(con, before[0], before[1].get())
            else:
                _write(con, batch, map(_read_files, parts))
            read += len(fresh)
            tick(read)
            batch, fresh = [], []
        if reading:
            _write(con, reading[0], reading[1].get())
    return read


def _write(con: sqlite3.Connection, batch: Sequence[tuple[Path, _Changes]], parts: Iterable[Records]) -> None:
    """A batch of results folders' changes written to the index, with the records read of their files."""
    with con:
        for _, changes in batch:
            stale = [(p,) for p in changes.stale]
            for table in ("samples", "ranks"):
                con.executemany(f"DELETE FROM {table} WHERE pid IN (SELECT id FROM points WHERE path = ?)", stale)
            for table in ("files", "manifests", "points"):
                con.executemany(f"DELETE FROM {table} WHERE path = ?", stale)
        for part in parts:
            # A part's points numbered from the next free row id; its samples and ranks name them so.
            first = con.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM points").fetchone()[0]
            con.executemany(f"INSERT INTO points VALUES ({', '.join('?' * _POINT_FIELDS)})",
                            ((first + i, *row) for i, row in enumerate(part["points"])))
            con.executemany("INSERT INTO manifests VALUES (?, ?, ?, ?)", part["manifests"])
            for table in ("samples", "ranks"):
                for places, *columns in part[table]:
                        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * (1 + len(columns)))})",
                                    zip((np.asarray(places) + first).tolist(), *columns, strict=True))
        for folder, changes in batch:
            con.executemany("INSERT INTO files VALUES (?, ?, ?, ?)",
                            ((p, str(folder), *changes.on_disk[p]) for p in changes.fresh))
            con.execute("DELETE FROM dirs WHERE folder = ?", (str(folder),))
            con.executemany("INSERT INTO dirs VALUES (?, ?, ?, ?)",
                            ((d, str(folder), m, json.dumps(sub)) for d, (m, sub) in changes.seen.items()))
            # What `reproflow runs` lists of each run in this folder, kept so that listing a year of runs
            # reads a row a run and folder, not every point.
            con.execute("DELETE FROM runs_in WHERE folder = ?", (str(folder),))
            con.execute("INSERT INTO runs_in SELECT folder, run_id, GROUP_CONCAT(DISTINCT suite), "
                        "SUM(failed = 0), SUM(failed), MIN(timestamp), MAX(timestamp), "
                        "GROUP_CONCAT(DISTINCT device_name), GROUP_CONCAT(DISTINCT nodelist), "
                        "GROUP_CONCAT(DISTINCT git_commit) FROM points WHERE folder = ? GROUP BY run_id",
                        (str(folder),))


def _below(folder: str) -> tuple[str, str]:
    """The range of paths inside `folder` (a range the primary keys' indexes find, where LIKE scans)."""
    below = folder + os.sep
    return below, folder + chr(ord(os.sep) + 1)


def _changes(con: sqlite3.Connection, folder: Path, rescan: bool) -> _Changes | None:
    """A results folder's files to forget and to read (None: every folder in it as indexed, none gone)."""
    known = {} if rescan else {p: (m, json.loads(sub)) for p, m, sub in con.execute(
        "SELECT path, mtime_ns, subdirs FROM dirs WHERE folder = ?", (str(folder),))}
    on_disk: dict[str, tuple[int, int]] = {}
    unchanged: set[str] = set()
    seen: dict[str, tuple[int, list[str]]] = {}
    now = time.time_ns()
    stack = [str(folder)] if folder.is_dir() else []
    while stack:
        directory = stack.pop()
        try:
            mtime = os.stat(directory).st_mtime_ns
            if directory in known and known[directory][0] == mtime:
                unchanged.add(directory)
                subdirs = known[directory][1]
            else:
                files, subdirs = _list(folder, directory)
                on_disk.update(files)
        except FileNotFoundError:  # removed while walked
            continue
        seen[directory] = (mtime if now - mtime > _RACY_NS else 0, subdirs)
        stack += subdirs
    if known and len(unchanged) == len(seen) == len(known):
        return None
    indexed = {p: (m, s) for p, m, s in con.execute(
        "SELECT path, mtime_ns, size FROM files WHERE path >= ? AND path < ?", _below(str(folder)))}
    on_disk.update({p: v for p, v in indexed.items() if os.path.dirname(p) in unchanged})
    return _Changes([p for p in indexed if on_disk.get(p) != indexed[p]],
                    [p for p in on_disk if indexed.get(p) != on_disk[p]], on_disk, seen)


def forget(con: sqlite3.Connection, under: Path) -> None:
    """Drop the entries of the folders under `under` (archives unpacked for one comparison)."""
    with con:
        inside = _below(str(under.resolve()))
        for table in ("samples", "ranks"):
            con.execute(f"DELETE FROM {table} WHERE pid IN (SELECT id FROM points WHERE folder >= ? AND folder < ?)",
                        inside)
        for table in ("files", "dirs", "manifests", "points"):  # every path of a folder inside is inside
            con.execute(f"DELETE FROM {table} WHERE path >= ? AND path < ?", inside)
        con.execute("DELETE FROM runs_in WHERE folder >= ? AND folder < ?", inside)


def _read_files(files: Sequence[tuple[Path, str]]) -> Records:
    """Files' rows for the index (each file with its results folder): runs' manifests, failed points'
    records, and point files' points with their samples' statistics and per-rank times (nothing for a
    point file not whole yet; the store reads them many at a time, store.frames). Samples and ranks
    name their point by its place in `points`."""
    records: Records = {table: [] for table in _TABLES}
    for folder, name in files:
        if name.endswith(".json"):
            _json_records(records, folder, Path(name))
    for frame in read_point_frames([(folder, name) for folder, name in files if not name.endswith(".json")],
                                   per_point=_PER_POINT):
        _point_records(records, frame)
    return records


def _json_records(records: Records, folder: Path, path: Path) -> None:
    """A run's manifest, or a failed point's record (nothing while it is half written)."""
    record = read_json_object(path)
    if record is None:
        return
    if path.parent == folder / RUNS:
        records["manifests"].append((str(path), str(folder), str(record.get("run_id", path.stem)),
                                     json.dumps(record)))
    elif path.name.endswith(".failed.json"):
        experiment, suite = path.parent.name, path.parent.parent.name
        records["points"].append(
            (str(path), str(folder), record.get("run_id") or job_run_id(str(record.get("job_id", ""))),
             str(record.get("job_id", "")), suite, experiment, None, str(record.get("point", "")), 1,
             str(record.get("timestamp", "")), None, *(None for _ in MANIFEST), None))


def _point_records(records: Records, frame: PointFrame) -> None:
    """Point files' points (one a file, or several put together) with their provenance, and per point,
    coordinates and metric the samples' statistics; family by family, since a family says which of a
    point's columns are its parameters and which coordinates inside it."""
    rows, first = frame.rows, frame.first
    middle = [c for c in rows.columns if c not in RESERVED and not c.startswith("@")]
    registry = families()
    family = first["family"].to_numpy()
    for name in pd.unique(family):
        mine = family == name
        points = first if mine.all() else first[mine]
        chosen = rows if mine.all() else rows[np.isin(rows["@pid"].to_numpy(), points["@pid"].to_numpy())]
        known = registry.get(name)
        if known:
            _family_records(records, chosen, points, middle, {p.name for p in known.params},
                            known.sample_coords, known.headline, known.samples)
            continue
        # A family this reproflow does not know (renamed, or gone): its parameters are the columns that
        # stay the same across a point's rows.
        for pid, one in chosen.groupby("@pid", sort=False):
            params = {c for c in middle if one[c].nunique() == 1}
            _family_records(records, one, points[points["@pid"] == pid], middle, params, (), "", ())


def _family_records(records: Records, rows: pd.DataFrame, points: pd.DataFrame,
                    middle: Sequence[str], params: set[str], sample_coords: Sequence[str], headline: str,
                    samples: tuple[str, str] | tuple[()]) -> None:
    """One family's points of a parse: a row a point, a row per coordinates and metric with the samples'
    statistics (the rows aggregated across ranks where the metric has them, else rank 0's), and the
    per-rank times of multi-node points."""
    coords, keys = _coords_codes(rows, [c for c in middle if c not in params and c not in sample_coords])
    metric, metrics = _factorize(rows["metric"])
    why = invalid(rows, headline, samples)
    named = [c for c in middle if c in params]
    # A row a point, built by zip from its columns; `place` numbers each @pid by its row in records["points"].
    pids = points["@pid"].to_numpy()
    place = np.zeros(int(pids.max(initial=-1)) + 1, dtype=np.int64)
    place[pids] = np.arange(len(records["points"]), len(records["points"]) + len(pids))
    folder, path, job_id, suite, experiment, family, point, timestamp, run_id = _columns(
        points, ("@folder", "@file", "job_id", "suite", "experiment", "family", "point", "timestamp", "run_id"))
    records["points"] += zip(
        path, folder, [r or job_run_id(j) for r, j in zip(run_id, job_id, strict=True)], job_id, suite, experiment,
        family, point, [0] * len(pids), timestamp, _json_objects(points, named), *_columns(points, MANIFEST),
        why.reindex(pids).tolist(), strict=True)
    # Per point, coordinates and metric (a group): the unit, and the count, the mean and variance of the
    # logarithms (None unless every value is positive) and the median of the samples, the finite values
    # aggregated across ranks where there are any, else rank 0's.
    pid = rows["@pid"].to_numpy()
    group, firsts = _groups(pid, coords, metric)
    value, rank = rows["@value"].to_numpy(), rows["rank"].to_numpy()
    finite = np.isfinite(value)
    merged = rank == AGGREGATE
    has_merged = np.bincount(group, weights=merged & finite, minlength=len(firsts)) > 0
    chosen = finite & (merged | ((rank == "0") & ~has_merged[group]))
    n, median, lowest = _medians(group[chosen], value[chosen], len(firsts))
    taken, value = group[chosen], value[chosen]
    logs = np.log(np.where(value > 0, value, 1.0))
    mean = np.bincount(taken, weights=logs, minlength=len(firsts)) / np.maximum(n, 1)
    squares = np.bincount(taken, weights=(logs - mean[taken]) ** 2, minlength=len(firsts))
    variance = np.where(n > 1, squares / np.maximum(n - 1, 1), 0.0)
    positive = (n > 0) & (lowest > 0)
    records["samples"].append((
        place[pid[firsts]], _pick(keys, coords[firsts]), _pick(metrics, metric[firsts]),
        rows["unit"].to_numpy()[firsts].tolist(), n.tolist(), np.where(positive, mean, None).tolist(),
        np.where(positive, variance, None).tolist(), np.where(np.isnan(median), None, median).tolist()))
    timed = _rank_times(rows, points, coords, metric)
    if timed:
        p, c, m, *rest = timed
        records["ranks"].append((place[p], _pick(keys, c), _pick(metrics, m), *rest))


def _factorize(column: pd.Series) -> tuple[np.ndarray, list]:
    """A column's values as codes, and the distinct values as a list (pandas' own array of them is slow to
    index one at a time)."""
    code, distinct = pd.factorize(column.to_numpy())
    return code, list(distinct)


def _groups(*codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by their codes (non-negative integers, one array each): each row's group number and
    each group's first row."""
    key = np.zeros(len(codes[0]), dtype=np.int64)
    for code in codes:
        key = key * (int(code.max(initial=0)) + 1) + code
    _, firsts, group = np.unique(key, return_index=True, return_inverse=True)
    return group.ravel(), firsts


def _medians(group: np.ndarray, value: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group (0 .. groups - 1) of `value`: the count, the median (NaN for none) and the least value."""
    n = np.bincount(group, minlength=groups)
    ordered = value[np.lexsort((value, group))]
    start = np.concatenate(([0], np.cumsum(n)[:-1]))
    some = n > 0
    median, lowest = np.full(groups, np.nan), np.full(groups, np.nan)
    low, high = start[some] + (n[some] - 1) // 2, start[some] + n[some] // 2
    median[some] = (ordered[low] + ordered[high]) / 2
    lowest[some] = ordered[start[some]]
    return n, median, lowest


def _coords_codes(rows: pd.DataFrame, coords: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Each row's coordinates as a code, and each code's key as the index keeps it (JSON, numbers written
    one way; '' where the family has none), made once per distinct coordinates."""
    if not coords:
        return np.zeros(len(rows), dtype=np.int64), [""]
    if len(coords) > 1:
        code, distinct = pd.factorize(pd.MultiIndex.from_frame(rows[list(coords)]))
        values = distinct.tolist()
    else:
        code, distinct = _factorize(rows[coords[0]])
        values = [(v,) for v in distinct]
    return code, [_json_object(coords, [_number(v) for v in one]) for one in values]


def _columns(frame: pd.DataFrame, names: Sequence[str]) -> list[list]:
    """The columns named, as lists ('' for one the frame lacks)."""
    return [frame[name].tolist() if name in frame else [""] * len(frame) for name in names]


def _json_objects(frame: pd.DataFrame, names: Sequence[str]) -> list[str]:
    """`_json_object` of each row's `names` columns, each column's distinct values encoded once."""
    encoded = []
    for name in names:
        code, distinct = _factorize(frame[name])
        encoded.append(_pick([f"{_encode(name)}: {_encode(_number(v))}" for v in distinct], code))
    return ["{" + ", ".join(parts) + "}" for parts in zip(*encoded, strict=True)] if names else ["{}"] * len(frame)


def _json_object(names: Sequence[str], values: Sequence[str]) -> str:
    """`json.dumps(dict(zip(names, values)))` of texts, by its C string encoder alone."""
    return "{" + ", ".join(f"{_encode(n)}: {_encode(v)}" for n, v in zip(names, values, strict=True)) + "}"


def _pick(distinct: list, codes: np.ndarray) -> list:
    """The values of `codes` (places in `distinct`) as a list."""
    return np.array(distinct, dtype=object)[codes].tolist() if len(codes) else []


def _rank_times(rows: pd.DataFrame, points: pd.DataFrame, coords: np.ndarray,
                metric: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list, list, list] | None:
    """Multi-node points' times as each rank measured them, as columns (point, coordinates and metric codes,
    rank, the node it ran on, the logarithm of its median over repeats; None when there are none): what
    `reproflow nodes` sets node against node with. Ranks sit on the nodes in blocks, in the node list's order
    (Slurm's block distribution, one torchrun a node)."""
    rank_code, ranks = _factorize(rows["rank"])
    digits = np.array([r.isdigit() for r in ranks], dtype=bool)
    unit_code, units = _factorize(rows["unit"])
    timed_unit = np.isin(units, TIME_UNITS)
    if not digits.any() or not timed_unit.any():
        return None
    nodes, worlds = {}, {}
    for pid, nodelist, size in zip(points["@pid"], points.get("nodelist", ""), points.get("world_size", ""),
                                   strict=True):
        hosts = [h for h in str(nodelist).split(",") if h]
        world = int(float(size)) if str(size).replace(".", "", 1).isdigit() else 0
        if len(hosts) >= 2 and world and not world % len(hosts):
            nodes[pid], worlds[pid] = hosts, world
    if not nodes:
        return None
    pid, value = rows["@pid"].to_numpy(), rows["@value"].to_numpy()
    rank = np.array([int(r) if d else -1 for r, d in zip(ranks, digits.tolist(), strict=True)])[rank_code]
    world = pd.Series(worlds, dtype=np.int64).reindex(pid, fill_value=0).to_numpy()
    keep = timed_unit[unit_code] & (rank >= 0) & np.isfinite(value) & (value > 0) & (rank < world)
    if not keep.any():
        return None
    pid, coords, metric, rank = pid[keep], coords[keep], metric[keep], rank[keep]
    group, firsts = _groups(pid, coords, metric, rank)
    _, median, _ = _medians(group, np.log(value[keep]), len(firsts))
    pid, rank = pid[firsts], rank[firsts]
    node = [nodes[p][r // (worlds[p] // len(nodes[p]))] for p, r in zip(pid.tolist(), rank.tolist(), strict=True)]
    return pid, coords[firsts], metric[firsts], rank.tolist(), node, median.tolist()


def invalid(rows: pd.DataFrame, headline: str, samples: tuple[str, str] | tuple[()] = (),
            by: str = "@pid") -> pd.Series:
    """Why each point's rows (text columns, `@value` the value as a number; points told apart by `by`)
    cannot be judged faster, slower or the same ('' where they can): its job failed its health gate,
    its headline metric is zero or not finite in every row (a run that moved no bytes), or it has fewer
    samples than it asked for (`samples`: the parameter asking and the metric counted)."""
    point, names = pd.factorize(rows[by].to_numpy())
    why = np.full(len(names), "", dtype=object)
    first = np.unique(point, return_index=True)[1]  # each point's first row
    metric = rows["metric"].to_numpy()
    if samples and samples[0] in rows:
        asked = [int(a) if str(a).isdigit() else -1 for a in rows[samples[0]].to_numpy()[first].tolist()]
        middle = [c for c in rows.columns if c not in RESERVED and not c.startswith("@") and c != by]
        counted = (metric == samples[1]) & np.isin(rows["rank"].to_numpy(), [AGGREGATE, "0"])
        distinct = rows[counted].assign(**{by: point[counted]}).drop_duplicates([by, "repeat", "rank", *middle])
        got = np.bincount(distinct[by].to_numpy(dtype=np.int64), minlength=len(names))
        for i in np.flatnonzero(got < np.array(asked)):
            why[i] = f"{got[i]} of the {asked[i]} samples it asked for ({samples[0]}) measured ({samples[1]})"
    head = metric == headline
    if head.any():
        value = rows["@value"].to_numpy()
        moved = np.bincount(point[head & np.isfinite(value) & (value > 0)], minlength=len(names)) > 0
        seen, at = np.unique(point[head], return_index=True)  # each point's first headline row
        for i, v in zip(seen.tolist(), value[np.flatnonzero(head)[at]].tolist(), strict=True):
            if not moved[i]:
                why[i] = f"its {headline} is {v:g} in every row"
    if "health_gate" in rows:
        why[np.bincount(point[rows["health_gate"].to_numpy() == GATE_FAIL], minlength=len(names)) > 0] = (
            "its job failed its health gate")
    return pd.Series(why, index=names, dtype=object)


@functools.lru_cache(maxsize=65536)
def _number(text: str) -> str:
    """A value as one text however it was written: 128, 128.0 and 1.28e2 alike as 128."""
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value):
        return text
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def manifests(con: sqlite3.Connection, folders: Sequence[Path]) -> dict[str, dict]:
    """Run id -> manifest, in the given folders."""
    marks = ", ".join("?" * len(folders))
    return {run_id: json.loads(record) for run_id, record in con.execute(
        f"SELECT run_id, record FROM manifests WHERE folder IN ({marks})", [str(f.resolve()) for f in folders])}


_LISTS = ("suites", "hardware", "nodes", "commits")  # runs_in's comma-separated columns


def runs_table(con: sqlite3.Connection, folders: Sequence[Path], *, suite: str = "", cluster: str = "",
               since: str = "", until: str = "", limit: int = 0) -> pd.DataFrame:
    """The runs in the folders, newest first: when, where, what, points measured and failed, and each
    family's headline figure (its best point's median); filtered by suite (a glob), cluster (a part of
    its name) and start date (YYYY-MM-DD, both ends included); the newest `limit` (0: all)."""
    marks = ", ".join("?" * len(folders))
    where = [str(f.resolve()) for f in folders]
    # Each run's summary put together from its folders' rows (a run's jobs may write into several).
    points: dict[str, dict] = {}
    for folder, run_id, *row in con.execute(f"SELECT * FROM runs_in WHERE folder IN ({marks})", where):
        merged = points.setdefault(run_id, {"folder": folder, "points": 0, "failed": 0, "first": None,
                                            "last": None, **{k: set() for k in _LISTS}})
        counts = dict(zip(("suites", "points", "failed", "first", "last", *_LISTS[1:]), row, strict=True))
        merged["points"] += counts["points"] or 0
        merged["failed"] += counts["failed"] or 0
        merged["first"] = min(filter(None, (merged["first"], counts["first"])), default=None)
        merged["last"] = max(filter(None, (merged["last"], counts["last"])), default=None)
        for key in _LISTS:
            merged[key].update(item for item in str(counts[key] or "").split(",") if item)
    recorded = manifests(con, folders)
    out = []
    for run_id in sorted(set(points) | set(recorded)):
        m = recorded.get(run_id, {})
        p = points.get(run_id)
        out.append({
            "run": run_id, "start": m.get("start") or ((p["first"] or "") if p else ""),
            "end": m.get("end") or ((p["last"] or "") if p else ""),
            "state": m.get("state", "no manifest (rows only)"), "cluster": m.get("cluster", ""),
            "suites": ",".join(sorted(p["suites"] if p else m.get("suites", []))),
            "points": p["points"] if p else 0, "failed": p["failed"] if p else 0,
            "hardware": ",".join(sorted(p["hardware"])) if p and p["hardware"] else m.get("cpu_model", ""),
            "nodes": ",".join(sorted(p["nodes"])) if p else "",
            "commit": _short(str(m.get("git_commit") or (",".join(sorted(p["commits"])) if p else ""))),
            "folder": m.get("results") or (p["folder"] if p else "")})
    table = pd.DataFrame(out, columns=["run", "start", "end", "state", "cluster", "suites", "points", "failed",
                                       "hardware", "nodes", "commit", "folder"])
    if suite:
        table = table[table["suites"].map(lambda s: any(fnmatch.fnmatch(x, suite) for x in s.split(",")))]
    if cluster:
        table = table[table["cluster"].str.contains(cluster, regex=False)]
    if since:
        table = table[table["start"].str[:10] >= since]
    if until:
        table = table[table["start"].str[:10] <= until]
    table = table.sort_values("start", ascending=False)
    if limit:
        table = table.head(limit)
    table.insert(8, "headline", [_headline(con, run) for run in table["run"]])
    table.insert(8, "not_valid", [_not_valid(con, run) for run in table["run"]])
    return table.reset_index(drop=True)


def _not_valid(con: sqlite3.Connection, run_id: str) -> str:
    """A run's points that cannot be judged (`invalid`), counted by reason: '' where every point can."""
    return "; ".join(f"{n} point(s): {why}" for why, n in con.execute(
        "SELECT invalid, COUNT(*) FROM points WHERE run_id = ? AND COALESCE(invalid, '') != '' GROUP BY invalid "
        "ORDER BY COUNT(*) DESC", (run_id,)))


def _short(commits: str) -> str:
    """Commits as their first 12 digits, `-dirty` kept."""
    return ",".join(c[:12] + ("-dirty" if c.endswith("-dirty") else "") for c in commits.split(",") if c)


def _headline(con: sqlite3.Connection, run_id: str) -> str:
    """Each family's headline metric in a run: the largest median over its valid points, with its unit."""
    parts = []
    for family, metric, unit, best in con.execute(
            "SELECT p.family, s.metric, s.unit, MAX(s.median) FROM points p JOIN samples s ON s.pid = p.id "
            "WHERE p.run_id = ? AND COALESCE(p.invalid, '') = '' GROUP BY p.family, s.metric", (run_id,)):
        known = families().get(family)
        if known and known.headline == metric and best is not None:
            parts.append(f"{family} {metric} {best:.4g} {unit}")
    return "; ".join(sorted(parts))


def resolve(con: sqlite3.Connection, name: str) -> Selection | None:
    """The run called `name` (its id, or the start of one id only); None when no run or several are."""
    # GLOB on the name with its wildcards escaped: a prefix the run_id index finds (LIKE, case-blind, scans).
    pattern = "".join(f"[{c}]" if c in "*?[" else c for c in name) + "*"
    query = ("SELECT run_id, folder FROM points WHERE run_id GLOB ? "
             "UNION SELECT run_id, folder FROM manifests WHERE run_id GLOB ?")
    found = dict(con.execute(query, (pattern, pattern)).fetchall())
    if name in found:
        return Selection(name, found[name], name)
    if len(found) == 1:
        run_id, folder = found.popitem()
        return Selection(run_id, folder, run_id)
    return None


def samples(con: sqlite3.Connection, side: Selection, match: Sequence[str] = ()) -> pd.DataFrame:
    """One row per point, coordinates and metric of one side: unit, count, log mean and variance, median,
    and the point's family, device, nodes, ranks and parameters (JSON). With `match`, keyed instead by family,
    those parameters and coordinates ("name=value,...") and metric, whatever the suite and experiment:
    one machine's points set against another's measured under other names."""
    where, args = side.where("p")
    frame = pd.read_sql_query(
        "SELECT p.suite, p.experiment, p.point, s.coords, s.metric, s.unit, s.n, s.log_mean, s.log_var, s.median, "
        "p.family, p.device_name, p.nodelist, p.world_size, p.params, p.invalid FROM points p JOIN samples s "
        f"ON s.pid = p.id WHERE {where}", con, params=args)
    if not match:
        return frame.set_index(KEY).sort_index()
    fields = [json.loads(p or "{}") | (json.loads(c) if c else {}) for p, c in zip(frame["params"], frame["coords"],
                                                                                 strict=True)]
    frame["match"] = [match_label(match, f) for f in fields]
    # Points without every field named are not the ones asked for (another family's, another kernel's).
    has_all = [all(f.get(name, "") != "" for name in match) for f in fields]
    return frame[has_all].set_index(MATCH_KEY).sort_index()


def match_label(match: Sequence[str], fields: dict[str, str]) -> str:
    """How a point is named when matched by `match` alone: "name=value,..."."""
    return ",".join(f"{name}={fields.get(name, '')}" for name in match)


def points(con: sqlite3.Connection, side: Selection, columns: Sequence[str] = ("suite", "experiment", "point"),
           failed: bool = False) -> pd.DataFrame:
    """The points of one side (measured ones, or the failed ones), with the columns asked for."""
    where, args = side.where()
    return pd.read_sql_query(f"SELECT {', '.join(columns)} FROM points WHERE {where} AND failed = ?", con,
                             params=(*args, int(failed)))


def curves(con: sqlite3.Connection, side: Selection, suite: str, experiment: str, metric: str) -> pd.DataFrame:
    """One experiment's medians of a metric, a row per point and coordinates, with every parameter and
    coordinate as a column (numbers as numbers): what its curve is drawn from."""
    where, args = side.where("p")
    rows = con.execute(f"SELECT p.params, s.coords, s.median FROM points p JOIN samples s ON s.pid = p.id "
                       f"WHERE {where} AND p.suite = ? AND p.experiment = ? AND s.metric = ?",
                       (*args, suite, experiment, metric)).fetchall()
    frame = pd.DataFrame([json.loads(params or "{}") | (json.loads(coords) if coords else {}) | {"value": median}
                          for params, coords, median in rows])
    for column in frame.columns:
        converted = pd.to_numeric(frame[column], errors="coerce")
        if converted.notna().all():
            frame[column] = converted
    return frame


def folders_of(run: str) -> list[Path]:
    """The catalog's folders holding the manifest of a run whose id is or starts with `run`: the only ones a
    comparison by id needs brought up to date (runs of hand-submitted jobs have none: then every folder).
    A path (a folder that does not exist) is no run's id."""
    if not RUN_ID_START.fullmatch(run):
        return []
    return [f for f in known_folders() if any((f / RUNS).glob(f"{glob.escape(run)}*.json"))]


def catalog_folders(extra: Sequence[str] = ()) -> list[Path]:
    """The folders the catalog looks in: those given, else every results folder a run was recorded in."""
    return [Path(f).resolve() for f in extra] or known_folders()

