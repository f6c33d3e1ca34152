"""Runs against runs (`reproflow compare A B [C ...]`): each later run set against the first.

Points are matched by suite, experiment, point (its parameters), coordinates inside the point (a
message size) and metric, from the run catalog's index (catalog.py). Per metric: the ratio of
the later run's repeated samples to the first's (geometric means) with its 95 % interval, the claims'
statistics (`ratio_interval`), and a verdict oriented by the metric's unit: a rate (.../s) is better
higher, a time (s, ms, us, ns) lower; *faster* or *slower* when the whole interval is on one side of
1, else the same within noise. Metrics that are neither (counts, bytes, variances) are matched but not
judged. Points measured in one run only are listed, never dropped. What differs between the runs'
provenance (commit, image, hardware, versions, nodes) is said first.
"""

from __future__ import annotations

import html
import json
import math
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from reproflow.reporting import catalog
from reproflow.reporting.figures import new_figure, save_figure
from reproflow.reporting.intervals import LEVEL, log_ratio_intervals
from reproflow.reporting.limits import LIMITS, Published, limits
from reproflow.reporting.page import CSS, html_files, html_table, to_markdown
from reproflow.spec.errors import ReproflowError, printable
from reproflow.store.archive import unpack_results
from reproflow.store.files import atomic_write
from reproflow.store.results import RESERVED

FASTER, SLOWER, SAME = "faster", "slower", "same within noise"
# Not judged: a point measured once a side (launch.repeats = 1) has a ratio but no interval; a count,
# a size or a variance is neither better higher nor lower.
ONE_SAMPLE, NEITHER = "one sample: no interval", "neither a rate nor a time"
NO_RATIO = "no ratio: a zero or no value"  # an error count of 0, a metric left empty
NOT_MEASURED = "not measured here"  # a published value no point of the run has the parameters of
# A point whose rows cannot be judged (catalog.invalid: a failed health gate, a headline of zero): never
# faster, slower or the same, whatever its numbers say; `why` says what is wrong.
NOT_VALID = "not valid"
VERDICTS = (FASTER, SLOWER, SAME, ONE_SAMPLE, NEITHER, NO_RATIO, NOT_VALID)
# Overlaid curves drawn at most (the table has every metric): the first judged ones, in table order.
MAX_FIGURES = 24
MARKED = 40  # points along a curve up to which each is marked
TIME_UNITS = frozenset({"s", "ms", "us", "ns"})
KEY = catalog.KEY
COLUMNS = [*KEY, "unit", "n_a", "n_b", "median_a", "median_b", "ratio", "low", "high", "speed", "speed_low",
           "speed_high", "verdict", "why", "of_limit_a", "of_limit_b"]


@dataclass(frozen=True)
class Run:
    """One side of a comparison: a run of the catalog, or the newest points of a results folder."""

    label: str
    side: catalog.Selection
    index: sqlite3.Connection
    # Parameters and coordinates that alone match points across runs (compare --match); empty: suite,
    # experiment, point and coordinates.
    match: tuple[str, ...] = ()
    # Set against a published figure: several points may have one value's parameters (PARAM's GEMM and
    # reproflow's), each set against it and named in `measured_at`.
    by_point: bool = False

    @property
    def key(self) -> list[str]:
        """The columns points and metrics are matched by."""
        return catalog.MATCH_KEY if self.match else catalog.KEY

    @cached_property
    def samples(self) -> pd.DataFrame:
        """One row per point, coordinates and metric: unit, count, log mean and variance, median."""
        frame = catalog.samples(self.index, self.side, self.match)
        if self.by_point:
            return frame.assign(measured_at=frame["suite"] + "/" + frame["experiment"] + "/" + frame["point"])
        clash = frame.index[frame.index.duplicated()]
        if len(clash) and self.match:
            family, fields, metric = clash[0]
            raise ReproflowError(f"{self.label}: several points have {fields} ({family}, {metric}): --match "
                                 f"{','.join(self.match)} does not tell them apart. Add the parameter they "
                                 "differ in (implementation, dtype, a size) to --match.")
        if len(clash):  # rows whose point label does not say what their parameters do
            raise ReproflowError(f"{self.label}: several point files hold the point {printable(str(clash[0]))}: "
                                 "their rows were changed by hand or by another tool. Measure the points again.")
        return frame

    @cached_property
    def points(self) -> set[tuple[str, ...]]:
        """The points measured, with their coordinates: a message size is a point of its own here."""
        return set(self.samples.index.droplevel("metric"))

    def provenance(self) -> pd.DataFrame:
        """The provenance columns that make runs different machines or software, a row per point."""
        return catalog.points(self.index, self.side, catalog.MANIFEST)


@dataclass(frozen=True)
class Reference:
    """A published figure (limits.toml) as the first side of a comparison: each value one exact sample,
    matched by the parameters it was published at."""

    published: Published

    @property
    def label(self) -> str:
        """What it is and what measured it."""
        return f"{self.published.name} ({self.published.hardware})"

    @property
    def match(self) -> tuple[str, ...]:
        """The parameters its values are given at."""
        return tuple(sorted({name for params, _ in self.published.values for name in params}))

    key = catalog.MATCH_KEY

    @cached_property
    def samples(self) -> pd.DataFrame:
        """One row per published value, as Run.samples: one sample, no spread."""
        p = self.published
        return pd.DataFrame([{
            "family": p.family, "match": catalog.match_label(self.match, dict(params)),
            "metric": p.metric, "unit": p.unit, "n": 1, "log_mean": math.log(value), "log_var": 0.0,
            "median": value, "device_name": p.hardware, "nodelist": ",".join(f"host{i}" for i in range(p.hosts)),
            "world_size": p.ranks,
            "params": json.dumps(dict(params))} for params, value in p.values]).set_index(self.key).sort_index()

    @cached_property
    def points(self) -> set[tuple[str, ...]]:
        """The published points."""
        return set(self.samples.index.droplevel("metric"))

    def provenance(self) -> pd.DataFrame:
        """The hardware it was published for and where."""
        return pd.DataFrame([{"device_name": self.published.hardware, "source": self.published.source}])


def open_run(source: str, index: sqlite3.Connection, scratch: Path, match: Sequence[str] = (),
             by_point: bool = False) -> Run:
    """A results folder, a `reproflow archive` file (unpacked under `scratch`) or a run id of the catalog
    (or the start of one), as a Run; folders are brought into the index first."""
    path = Path(source)
    if path.is_file():  # an archive, or a file that says why it is not one
        path = unpack_results(path, scratch / f"{len(list(scratch.iterdir()))}")
    if path.is_dir():
        catalog.refresh(index, [path])
        run = Run(source, catalog.Selection(source, str(path.resolve())), index, tuple(match), by_point)
    else:
        catalog.refresh(index, catalog.folders_of(source) or catalog.catalog_folders())
        side = catalog.resolve(index, source)
        if side is None:
            raise ReproflowError(f"{source}: not a results folder, an archive or one run's id. Give the --results "
                                 "folder of a run, a .tar.gz written by `reproflow archive`, or a run id that "
                                 "`reproflow runs` lists (its start is enough when only one run begins so).")
        run = Run(source, side, index, tuple(match), by_point)
    if run.samples.empty:
        raise ReproflowError(f"{source}: no point in it has the fields {', '.join(match)}. Give a run that measured "
                             "such points, or other fields." if match else
                             f"{source}: no result rows in it. Give a folder or a run that measured points.")
    return run


def direction(unit: str) -> int:
    """+1 where higher is better (a rate), -1 where lower is (a time), 0 where neither is."""
    unit = str(unit)
    if unit.endswith("/s"):
        return 1
    return -1 if unit in TIME_UNITS else 0


def compare(first: Run | Reference, later: Run) -> pd.DataFrame:
    """Every metric of the points both runs measured: counts, medians, ratio later / first with its
    interval, `speed` (the ratio oriented so that above 1 is better) and the verdict."""
    both = first.samples.merge(later.samples, left_index=True, right_index=True, suffixes=("_a", "_b")).reset_index()
    sign = both["unit_a"].map(direction).to_numpy()
    ratio, low, high = log_ratio_intervals(*(both[c].to_numpy(dtype=float) for c in (
        "log_mean_b", "log_var_b", "n_b", "log_mean_a", "log_var_a", "n_a")))
    no_ratio = both["log_mean_a"].isna().to_numpy() | both["log_mean_b"].isna().to_numpy()
    table = both[first.key].assign(unit=both["unit_a"], n_a=both["n_a"], n_b=both["n_b"], median_a=both["median_a"],
                             median_b=both["median_b"], ratio=ratio, low=low, high=high)
    # A time's speed is its inverse: above 1 is better for every judged metric.
    with np.errstate(divide="ignore", invalid="ignore"):
        table["speed"] = np.where(sign < 0, 1 / ratio, ratio)
        table["speed_low"] = np.where(sign < 0, 1 / high, low)
        table["speed_high"] = np.where(sign < 0, 1 / low, high)
    why = [" ".join(f"{label}: {reason}." for label, reason in ((first.label, a), (later.label, b)) if reason)
           for a, b in zip(_reasons(both, "a"), _reasons(both, "b"), strict=True)]
    table["why"] = [w or None for w in why]  # None: the column is left out of tables where no row has one
    table["verdict"] = np.select(
        [np.array([bool(w) for w in why], dtype=bool), no_ratio, sign == 0, np.isnan(low),
         table["speed_low"] > 1.0, table["speed_high"] < 1.0],
        [NOT_VALID, NO_RATIO, NEITHER, ONE_SAMPLE, FASTER, SLOWER], SAME)
    for column in ("median_a", "median_b", "ratio", "low", "high", "speed", "speed_low", "speed_high"):
        table.loc[no_ratio, column] = np.nan
    family = both["family"] if "family" in both else both["family_a"]
    for side in ("a", "b"):
        table[f"of_limit_{side}"] = both[f"median_{side}"] / _limits(family, both, side)
    named = ["measured_at"] if "measured_at" in both else []  # by point: which point each row is
    table[named] = both[named]
    # sizes and counts in numeric order (1024 before 131072), whatever their text
    order = sorted(range(len(table)), key=lambda i: tuple(_natural(table[c].iat[i]) for c in first.key))
    return table.iloc[order].reset_index(drop=True)[[*first.key, *COLUMNS[len(KEY):], *named]]


def _natural(value: object) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders the numbers inside a text by value: "size 1024" before "size 131072"."""
    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", str(value)) if t)


def _reasons(both: pd.DataFrame, side: str) -> list[str]:
    """Each row's reason its point on `side` is not valid ('' where it is; a published figure always is)."""
    column = f"invalid_{side}" if f"invalid_{side}" in both else "invalid" if side == "b" else ""
    return [r if isinstance(r, str) else "" for r in both[column]] if column in both else [""] * len(both)


def _limits(family: pd.Series, both: pd.DataFrame, side: str) -> pd.Series:
    """The hardware limit bounding each row's metric on the side's device (NaN where none is known)."""
    table = limits()
    bounded = {(u.family, u.metric) for u in table.uses}
    wanted = [(f, m) in bounded for f, m in zip(family, both["metric"], strict=True)]
    out = np.full(len(both), np.nan)
    cache: dict[tuple[str, ...], float] = {}
    columns = [family.to_numpy(), *(both[c].to_numpy() for c in ("metric", f"device_name_{side}",
                                                              f"nodelist_{side}", f"world_size_{side}",
                                                              f"params_{side}"))]
    for i in np.flatnonzero(wanted):
        key = tuple(column[i] for column in columns)
        if key not in cache:
            hosts = len(str(key[3]).split(","))
            found = table.limit(key[0], key[1], json.loads(key[5] or "{}"), str(key[2]), hosts, int(key[4] or 1))
            cache[key] = found[0] if found else np.nan
        out[i] = cache[key]
    return pd.Series(out, index=both.index)


def only_in_one(first: Run | Reference, later: Run) -> pd.DataFrame:
    """The points (suite, experiment, point, coordinates) one of the two runs measured and the other did not."""
    rows = [(*p, first.label) for p in sorted(first.points - later.points)]
    rows += [(*p, later.label) for p in sorted(later.points - first.points)]
    return pd.DataFrame(rows, columns=[*first.key[:-1], "only in"])


def against_published(published: Published, index: sqlite3.Connection, results: Path) -> pd.DataFrame:
    """The newest rows under `results` set against a published figure: a row per published value and
    point here with its parameters (`measured_at`), with the measured median, the ratio measured /
    published and its interval, the verdict and the device; NOT_MEASURED where no point here has the
    value's parameters."""
    reference = Reference(published)
    catalog.refresh(index, [results])
    run = Run(str(results), catalog.Selection(str(results), str(results.resolve())), index, reference.match, True)
    table = compare(reference, run)
    devices = run.samples.groupby("measured_at")["device_name"].agg(lambda d: ", ".join(sorted(set(d))))
    table["measured_on"] = table["measured_at"].map(devices)
    published_rows = reference.samples.reset_index()
    matched = set(zip(table["family"], table["match"], table["metric"], strict=True))
    missing = published_rows[[key not in matched for key in zip(
        published_rows["family"], published_rows["match"], published_rows["metric"], strict=True)]]
    missing = missing[[*reference.key, "unit", "median"]].rename(columns={"median": "median_a"})
    table = pd.concat([table, missing.assign(verdict=NOT_MEASURED, measured_at="")], ignore_index=True)
    return table.rename(columns={"median_a": "published", "median_b": "measured", "n_b": "n"}).drop(
        columns=["n_a", "speed_low", "speed_high"])


def differences(runs: Sequence[Run | Reference]) -> pd.DataFrame:
    """The provenance columns whose values differ between the runs: one row each, a column per run."""
    rows = []
    frames = [r.provenance() for r in runs]
    for column in (*catalog.MANIFEST, "source"):
        seen = [", ".join(sorted({str(v) for v in f[column].dropna().unique() if str(v)})) if column in f else ""
                for f in frames]
        if len(set(seen)) > 1:
            rows.append({"provenance": column, **{r.label: s for r, s in zip(runs, seen, strict=True)}})
    return pd.DataFrame(rows)


def regressions(table: pd.DataFrame, fail_below: float) -> pd.DataFrame:
    """Metrics slower beyond `fail_below`: the whole interval of their speed below it."""
    return table[(table["verdict"] == SLOWER) & (table["speed_high"] < fail_below)]


def _coordinate(frame: pd.DataFrame) -> str | None:
    """The numeric parameter or coordinate that varies most across an experiment's points (a message
    size, a matrix size): the x axis its curves are drawn over; None where none varies."""
    best, most = None, 1
    for column in frame.columns:
        if column in RESERVED or not pd.api.types.is_numeric_dtype(frame[column]):
            continue
        distinct = frame[column].nunique()
        if distinct > most:
            best, most = column, distinct
    return best


def overlay(runs: Sequence[Run], table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """A figure per experiment and judged metric with a coordinate: each run's medians against it,
    overlaid (one line per run and per setting of the other parameters)."""
    figures: list[Path] = []
    if runs[0].match:
        return figures  # points matched across suites: no one experiment's curves to draw
    judged = table[table["verdict"].isin([FASTER, SLOWER, SAME])][["suite", "experiment", "metric", "unit"]]
    for suite, experiment, metric, unit in judged.drop_duplicates().itertuples(index=False):
        if len(figures) == MAX_FIGURES:
            break
        parts = [catalog.curves(r.index, r.side, suite, experiment, metric) for r in runs]
        x = _coordinate(pd.concat(parts))
        along = pd.concat(parts)[x].nunique() if x is not None else 0
        if along < 3:
            continue  # no curve to draw: fewer than three points along a coordinate
        fig, ax = new_figure((9, 4), legend_room=0.34)
        # A marker a point where they can be told apart (a message size sweep); on hundreds, lines alone.
        styles = ("-o", "--s", ":^", "-.v") if along <= MARKED else ("-", "--", ":", "-.")
        for run, rows, style in zip(runs, parts, styles, strict=False):
            others = [c for c in rows.columns if c not in (x, "value") and rows[c].nunique() > 1]
            for setting, group in (rows.groupby(others) if others else [((), rows)]):
                medians = group.groupby(x)["value"].median().sort_index()
                label = run.label + (f" {setting}" if others else "")
                ax.plot(medians.index, medians.to_numpy(), style, ms=3, label=label)
        span = pd.concat(parts)[x].dropna()
        if len(span) and span.min() > 0 and span.max() / span.min() >= 100:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(x)
        ax.set_ylabel(f"{metric} ({unit}), median")
        ax.set_title(f"{suite} / {experiment}: {metric}", fontsize=9)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figures += save_figure(fig, out_dir, f"compare_{suite}_{experiment}_{metric}", formats=("png",))
    return figures


def claims_side_by_side(files: Sequence[Path], labels: Sequence[str]) -> pd.DataFrame:
    """The runs' claims (each run's claims.csv, as `reproflow report` writes it) in one table: per claim,
    each run's verdict and ratio with its interval, and whether the verdicts differ."""
    columns = []
    for path, label in zip(files, labels, strict=True):
        try:
            table = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise ReproflowError(f"--claims {path}: not a claims table ({exc}). Give the claims.csv `reproflow "
                                 "report` (or make reproduce) wrote beside each run's report.") from None
        missing = {"family", "claim", "status", "measured", "low", "high"} - set(table.columns)
        if missing:
            raise ReproflowError(f"--claims {path}: no column {', '.join(sorted(missing))}; give the claims.csv "
                                 "`reproflow report` wrote.")
        shown = [f"{m:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if pd.notna(lo) else "") if pd.notna(m) else ""
                 for m, lo, hi in table[["measured", "low", "high"]].itertuples(index=False)]
        columns.append(table[["family", "claim"]].assign(**{label: table["status"], f"{label} ratio": shown})
                       .set_index(["family", "claim"]))
    joined = pd.concat(columns, axis=1).reset_index().fillna("")
    verdicts = joined[list(labels)]
    return joined.assign(differ=["yes" if len(set(row)) > 1 else "" for row in verdicts.itertuples(index=False)])


def write_comparison(runs: Sequence[Run | Reference], out_dir: Path, fail_below: float | None = None,
                     claims: Sequence[Path] = ()) -> tuple[list[Path], str, int]:
    """`compare.md` and a self-contained `compare.html` in `out_dir`; returns their paths, a summary for the
    terminal (what differs, each run's counts of verdicts and the metrics judged faster, slower or not
    valid; the full tables are in the files) and, with `fail_below`, how many metrics are slower beyond it
    or not valid. `claims`: each run's claims.csv, in the runs' order, for their verdicts side by side."""
    first, later = runs[0], runs[1:]
    tables = [(run, compare(first, run), only_in_one(first, run)) for run in later]
    slower = 0
    intro = (f"Each run against {first.label}: ratio = later / first of the geometric means of the repeats, with "
             f"its {LEVEL:.0%} interval; faster or slower when the whole interval is on one side of 1 (a rate "
             "higher, a time lower), else the same within noise.")
    md = [f"# reproflow compare\n\n{intro}\n"]
    body = [f"<h1>reproflow compare</h1><p>{html.escape(intro)}</p>"]
    differ = differences(runs)
    text = ("What differs between the runs (their rows' provenance):" if len(differ)
            else "The runs' provenance (commit, image, hardware, versions, nodes) is the same.")
    md.append(f"{text}\n\n{to_markdown(differ) if len(differ) else ''}")
    short = [f"reproflow compare: {len(later)} run(s) against {first.label}; {intro}", text]
    if len(differ):
        short.append(to_markdown(differ.head(SHOWN)) + (f"\n... {len(differ) - SHOWN} more in compare.md"
                                                         if len(differ) > SHOWN else ""))
    body.append(f"<p>{html.escape(text)}</p>{html_table(differ) if len(differ) else ''}")
    if claims:
        if len(claims) != len(runs):
            raise ReproflowError(f"--claims: {len(claims)} file(s) for {len(runs)} run(s); give one claims.csv "
                                 "per run, in the runs' order.")
        side = claims_side_by_side(claims, [run.label for run in runs])
        text = (f"The claims of each run (its claims.csv): {int((side['differ'] == 'yes').sum())} of {len(side)} "
                "with verdicts that differ.")
        md += [f"## Claims\n\n{text}\n", to_markdown(side)]
        short.append(text)
        body.append(f"<section><h2>Claims</h2><p>{html.escape(text)}</p>{html_table(side)}</section>")
    for run, table, alone in tables:
        counts = table["verdict"].value_counts()
        summary = (f"{run.label} against {first.label}: {len(table)} metrics matched: "
                   + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
                   + f"; {len(alone)} point(s) in one run only.")
        if fail_below is not None:
            worse = regressions(table, fail_below)
            slower += len(worse) + int(counts.get(NOT_VALID, 0))
            summary += (f" Slower than {fail_below:g} of the first run's (the whole interval): {len(worse)}; not "
                        f"valid: {counts.get(NOT_VALID, 0)}.")
        shown = table.drop(columns=["speed_low", "speed_high"]).dropna(axis=1, how="all")
        if {"of_limit_a", "of_limit_b"} & set(shown.columns):
            summary += (" of_limit: the median as a fraction of the limit of the hardware that measured it "
                        f"({LIMITS}, version {limits().version}: a GPU's dense peak for the dtype, its memory "
                        "bandwidth, its NVLink).")
        md += [f"## {run.label}\n\n{summary}\n", to_markdown(shown)]
        short += [summary, *_decided(table)]
        body.append(f"<section><h2>{html.escape(run.label)}</h2><p>{html.escape(summary)}</p>{html_table(shown)}")
        if len(alone):
            md += ["Points in one run only:\n", to_markdown(alone)]
            body.append(f"<h3>Points in one run only</h3>{html_table(alone)}")
        body.append("</section>")
    figures = overlay(runs, pd.concat([t for _, t, _ in tables]), out_dir)
    body.append(html_files(figures))
    md += [f"![{p.stem}]({p.name})\n" for p in figures]
    paths = [out_dir / "compare.md", out_dir / "compare.html"]
    atomic_write(paths[0], "\n".join(md))
    atomic_write(paths[1], f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>reproflow compare'
                           f"</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
    return paths, "\n".join(short), slower


SHOWN = 10  # rows of a kind the terminal summary shows; the files have them all


def _decided(table: pd.DataFrame) -> list[str]:
    """The metrics judged slower, not valid or faster, the furthest from 1 first, SHOWN of each kind."""
    lines = []
    for verdict in (SLOWER, NOT_VALID, FASTER):
        rows = table[table["verdict"] == verdict]
        rows = rows.iloc[np.argsort(-np.abs(np.log(rows["speed"].astype(float).fillna(1.0).to_numpy())),
                                    kind="stable")]
        for r in rows.head(SHOWN).itertuples():
            where = " ".join(str(getattr(r, c)) for c in ("match", "experiment", "point", "coords") if hasattr(r, c))
            value = "" if verdict == NOT_VALID else f": speed {r.speed:.3g} [{r.speed_low:.3g}, {r.speed_high:.3g}]"
            lines.append(f"  {verdict}: {where} {r.metric}{value}" + (f" ({r.why})" if verdict == NOT_VALID else ""))
        if len(rows) > SHOWN:
            lines.append(f"  ... {len(rows) - SHOWN} more {verdict} in compare.md")
    return lines
