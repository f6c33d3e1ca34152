"""Point files read many at a time into pandas frames, by the result store's rules (store.results):
what `read_point_file` refuses in a file, these leave out of the frames, file by file.

Point files with one header line are parsed together by pandas' C reader, with a field added to the
end of every line so that a line with a field too few or too many shows; where one parse cannot
vouch for every file's lines (a line break inside a field, a carriage return, text not UTF-8, a
value not a number) the files are read one by one by `read_point_file`, which says what is wrong.
"""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from reproflow.store.results import HEAD_COLUMNS, READABLE_SCHEMAS, read_point_file

# Point files are parsed this many at a time: one pandas parse of many files' lines is what makes
# them cheap to read, and the rows of a thousand small files take some 30 MiB (4,096: 100 MiB).
CHUNK = 1024
# A field put at the end of every line before the parse together: a line with a field too few or too
# many shows as one whose last field is not this.
_END = "\x01"


def read_point_frames(files: Sequence[tuple[Path, str]]) -> list[pd.DataFrame]:
    """The rows of point files (each with its results folder) as frames of text columns with `@folder`,
    `@file`, `@pid` (the point's number within its frame) and `@value` (the value as a number); nothing
    of a file the store's reader refuses."""
    by_header: dict[bytes, list[tuple[Path, str, bytes]]] = {}
    frames = []
    for folder, name in files:
        try:
            with open(name, "rb") as file:
                data = file.read()
        except OSError:  # gone since it was listed
            continue
        head, _, body = data.partition(b"\n")
        if body.endswith(b"\n") and b"\r" not in data:
            by_header.setdefault(head, []).append((folder, name, body))
        elif (alone := _parse_alone(folder, name)) is not None:
            frames.append(alone)
    for head, same in by_header.items():
        together = _parse_together(head, same)
        frames += [together] if together is not None else [
            alone for folder, name, _ in same if (alone := _parse_alone(folder, name)) is not None]
    return [frame for frame in frames if len(frame)]


def _parse_together(head: bytes, files: Sequence[tuple[Path, str, bytes]]) -> pd.DataFrame | None:
    """The rows of point files that share a header line, as text columns with `@folder`, `@file`, `@pid`
    (the point's number) and `@value` (the value as a number), less the files the result store's reader
    refuses (a line the wrong length, a schema it cannot read, fewer rows than written); None where one
    parse cannot vouch for each file."""
    try:
        header = next(csv.reader([head.decode("utf-8")]))
    except (UnicodeDecodeError, csv.Error, StopIteration):
        return None
    if tuple(header[:len(HEAD_COLUMNS)]) != HEAD_COLUMNS or len(set(header)) < len(header):
        return None
    lines = [body.count(b"\n") for _, _, body in files]
    blob = b"".join(body for _, _, body in files).replace(b"\n", f",{_END}\n".encode())
    try:
        with warnings.catch_warnings():  # a first line too long: caught below by its last field
            warnings.simplefilter("ignore", pd.errors.ParserWarning)
            frame = pd.read_csv(io.BytesIO(blob), header=None, names=[*header, "@end"], dtype=object,
                                na_filter=False, index_col=False, engine="c", encoding="utf-8")
        values = frame["value"].to_numpy().astype(float)  # float()'s reading of each, as the store's reader
    except (ValueError, UnicodeDecodeError):  # pandas' ParserError is a ValueError; so is a value not a number
        return None
    if len(frame) != sum(lines):  # a line break inside a quoted field
        return None
    frame["@folder"] = np.repeat(np.array([str(folder) for folder, _, _ in files], dtype=object), lines)
    frame["@file"] = np.repeat(np.array([name for _, name, _ in files], dtype=object), lines)
    frame["@value"] = values
    frame = _numbered(frame)
    whole = frame["@end"].eq(_END) & frame["schema_version"].isin([str(v) for v in READABLE_SCHEMAS])
    if "point_rows" in header:
        point = frame["@pid"].to_numpy()
        written = np.array([str(n) for n in np.bincount(point)], dtype=object)[point]
        whole &= frame["point_rows"].to_numpy() == written
    if not whole.all():
        frame = frame[~frame["@file"].isin(frame.loc[~whole, "@file"])]
    return frame.drop(columns="@end")


def _parse_alone(folder: Path, name: str) -> pd.DataFrame | None:
    """One point file's rows as `_parse_together` gives them, read by the result store's reader."""
    rows, problem = read_point_file(Path(name))
    if problem:
        return None
    frame = pd.DataFrame(rows, dtype=object)
    return _numbered(frame.assign(**{"@folder": str(folder), "@file": name,
                                     "@value": frame["value"].to_numpy().astype(float)}))


def _numbered(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its rows' points numbered (`@pid`): a point is its file, suite, experiment, point and job."""
    return frame.assign(**{"@pid": frame.groupby(["@file", "suite", "experiment", "point", "job_id"],
                                                 sort=False).ngroup().to_numpy()})
