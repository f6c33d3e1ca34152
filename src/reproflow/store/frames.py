"""Point files read many at a time into pandas frames, by the result store's rules (store.results):
what `read_point_file` refuses in a file, these leave out of the frames, file by file.

Point files with one header line are parsed together by pandas' C reader, with a field added to the
end of every line so that a line with a field too few or too many shows; where one parse cannot
vouch for every file's lines (a line break inside a field, a carriage return, text not UTF-8, a
value not a number) the files are read one by one by `read_point_file`, which says what is wrong.
Columns the caller reads once a point (provenance: the same on every row a job writes) are taken
from each point's first line only, which spares most of the parse: most of a row's fields are those.
"""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from reproflow.store.files import read_regular
from reproflow.store.results import HEAD_COLUMNS, READABLE_SCHEMAS, TRUSTED, read_point_file

# Point files are parsed this many at a time: one pandas parse of many files' lines is what makes
# them cheap to read, and the rows of a thousand small files take some 30 MiB (4,096: 100 MiB).
CHUNK = 1024
# ... and at most this many bytes of them in one parse, so that files of hundreds of rows each (a sweep of
# many sizes) take no more memory than a thousand small ones: a parse holds some 5 times its bytes.
PARSE_BYTES = 8 << 20
# A field put at the end of every line before the parse together: a line with a field too few or too
# many shows as one whose last field is not this.
_END = "\x01"
# What makes a point within a file: its rows are told apart by these (a file may hold several jobs' rows).
POINT_KEY = ("suite", "experiment", "point", "job_id")


@dataclass(frozen=True)
class PointFrame:
    """Point files' rows as text columns: `rows`, every row with its columns but those read once a point,
    and `first`, every point's first row with all its columns; both with `@folder`, `@file` and `@pid`
    (the point's number within the frame), `rows` with `@value` (the value as a number)."""

    rows: pd.DataFrame
    first: pd.DataFrame


def read_point_frames(files: Sequence[tuple[Path, str]], per_point: Collection[str] = ()) -> list[PointFrame]:
    """The rows of point files (each with its results folder), `per_point` columns in `first` only (the
    rows of a file read one by one keep them); nothing of a file the store's reader refuses."""
    per_point = frozenset(per_point) - {"value", "schema_version", "point_rows", *POINT_KEY}
    by_header: dict[bytes, list[tuple[Path, str, bytes]]] = {}
    frames: list[PointFrame] = []
    pending = 0

    def parse() -> None:
        for head, same in by_header.items():
            together = _parse_together(head, same, per_point)
            frames.extend([together] if together is not None else [
                alone for folder, name, _ in same if (alone := _parse_alone(folder, name)) is not None])
        by_header.clear()

    for folder, name in files:
        try:
            data = read_regular(Path(name))
        except OSError:  # gone since it was listed, or no longer a regular file
            continue
        head, _, body = data.partition(b"\n")
        if body.endswith(b"\n") and b"\r" not in data:
            by_header.setdefault(head, []).append((folder, name, body))
            pending += len(body)
            if pending >= PARSE_BYTES:
                parse()
                pending = 0
        elif (alone := _parse_alone(folder, name)) is not None:
            frames.append(alone)
    parse()
    return [frame for frame in frames if len(frame.rows)]


def _parse_together(head: bytes, files: Sequence[tuple[Path, str, bytes]],
                    per_point: frozenset[str]) -> PointFrame | None:
    """The rows of point files that share a header line, less the files the result store's reader
    refuses (a line the wrong length, a schema it cannot read, fewer rows than written); None where one
    parse cannot vouch for each file."""
    try:
        header = next(csv.reader([head.decode("utf-8")]))
    except (UnicodeDecodeError, csv.Error, StopIteration):
        return None
    if tuple(header[:len(HEAD_COLUMNS)]) != HEAD_COLUMNS or len(set(header)) < len(header):
        return None
    lines = np.array([body.count(b"\n") for _, _, body in files])
    blob = b"".join(body for _, _, body in files).replace(b"\n", f",{_END}\n".encode())
    names = [*header, "@end"]
    try:
        frame = _parse(blob, names, [c for c in names if c not in per_point])
        values = frame["value"].to_numpy().astype(float)  # float()'s reading of each, as the store's reader
    except (ValueError, UnicodeDecodeError):  # pandas' ParserError is a ValueError; so is a value not a number
        return None
    if len(frame) != lines.sum():  # a line break inside a quoted field
        return None
    file_of = np.repeat(np.arange(len(files)), lines)
    frame["@folder"] = np.array([str(folder) for folder, _, _ in files], dtype=object)[file_of]
    frame["@file"] = np.array([name for _, name, _ in files], dtype=object)[file_of]
    frame["@value"] = values
    # A point a file (the rows of one job): its number is its file's; else numbered as _numbered does.
    starts = np.concatenate(([0], np.cumsum(lines)[:-1]))
    if all(_same_in_each_file(frame[c].to_numpy(), starts, file_of) for c in POINT_KEY):
        frame["@pid"], firsts = file_of, starts
    else:
        frame = _numbered(frame)
        firsts = np.unique(frame["@pid"].to_numpy(), return_index=True)[1]
    whole = frame["@end"].eq(_END) & frame["schema_version"].isin([str(v) for v in READABLE_SCHEMAS])
    for column, (pattern, _) in TRUSTED.items():  # names and counts as the store's reader takes them
        if column in frame.columns:
            whole &= frame[column].str.fullmatch(pattern.pattern).fillna(False).astype(bool)
    if "point_rows" in header:
        point = frame["@pid"].to_numpy()
        written = np.array([str(n) for n in np.bincount(point)], dtype=object)[point]
        whole &= frame["point_rows"].to_numpy() == written
    # Each point's first line, every column: parsed alone, a line a point.
    if len(firsts) == len(files):
        heads = [body[:body.index(b"\n")] + f",{_END}".encode() for _, _, body in files]
    else:
        raw = blob.split(b"\n")
        heads = [raw[i] for i in firsts]
    try:
        first = _parse(b"\n".join(heads) + b"\n", names, names)
    except (ValueError, UnicodeDecodeError):
        return None
    first = first.assign(**{c: frame[c].to_numpy()[firsts] for c in ("@folder", "@file", "@pid")})
    if not whole.all():
        refused = frame.loc[~whole, "@file"]
        frame, first = frame[~frame["@file"].isin(refused)], first[~first["@file"].isin(refused)]
    return PointFrame(frame.drop(columns="@end"), first.drop(columns="@end").reset_index(drop=True))


def _same_in_each_file(column: np.ndarray, starts: np.ndarray, file_of: np.ndarray) -> bool:
    """Whether every row of `column` holds its file's first row's value."""
    return bool((column[starts][file_of] == column).all())


def _parse(blob: bytes, names: list[str], columns: list[str]) -> pd.DataFrame:
    """Lines of CSV as text columns `columns` of `names`, by pandas' C reader."""
    with warnings.catch_warnings():  # a first line too long: caught by the caller by its last field
        warnings.simplefilter("ignore", pd.errors.ParserWarning)
        return pd.read_csv(io.BytesIO(blob), header=None, names=names, usecols=columns, dtype=object,
                           na_filter=False, index_col=False, engine="c", encoding="utf-8")


def _parse_alone(folder: Path, name: str) -> PointFrame | None:
    """One point file's rows as `_parse_together` gives them, read by the result store's reader."""
    rows, problem = read_point_file(Path(name))
    if problem:
        return None
    frame = pd.DataFrame(rows, dtype=object)
    frame = _numbered(frame.assign(**{"@folder": str(folder), "@file": name,
                                      "@value": frame["value"].to_numpy().astype(float)}))
    return PointFrame(frame, frame.drop_duplicates("@pid").drop(columns="@value").reset_index(drop=True))


def _numbered(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its rows' points numbered (`@pid`): a point is its file, suite, experiment, point and job."""
    return frame.assign(**{"@pid": frame.groupby(["@file", *POINT_KEY], sort=False).ngroup().to_numpy()})
