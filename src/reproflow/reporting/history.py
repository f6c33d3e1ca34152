"""`reproflow history`: a metric's value run after run, and the runs where it changed.

A series is one point's metric (suite, experiment, point, coordinates, metric) across the runs of the
catalog, in the order the runs started: each run's geometric mean of its repeats with a 95 % interval.
Change points are found on the logarithms of those values by PELT (Killick et al. 2012, exact optimal
segmentation under a penalty, linear time; the segmentation ruptures' KernelCPD gives, without its
import, `pelt`): it finds several changes at once, and its
penalty has the meaning a nightly check needs, the cost of one more change against the noise. The
noise is the series' own run-to-run spread (the median absolute difference of neighbouring runs,
which a change moves once), so one penalty serves a 1 % and a 10 % noisy metric; PENALTY and OUTLIER
were set on generated years (benchmarks/history_bench.py), whose false-alarm and detection rates
docs/results.md gives. Apache Otava's E-Divisive would do as well, but is a service with a store of
its own rather than a library call.

Each change is given with the runs on both sides, the ratio after / before of their geometric means
with its interval (the runs as the samples), and what the runs' rows say differs across it: commit,
image digest, torch and NCCL versions, device, nodes.
"""

from __future__ import annotations

import html
import itertools
import math
import sqlite3
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from reproflow.reporting import catalog
from reproflow.reporting.compare import direction
from reproflow.reporting.figures import new_figure, save_figure
from reproflow.reporting.intervals import LEVEL, log_ratio_intervals
from reproflow.reporting.page import CSS, html_files, html_table, to_markdown
from reproflow.spec.errors import ReproflowError
from reproflow.spec.family import families
from reproflow.store.files import atomic_write

# Penalty per change, in units of the series' noise variance times log(runs) (BIC's is 2): set on generated
# years without a change, where it keeps false alarms rare, heavy tails included (benchmarks/history_bench.py;
# the rates in docs/results.md).
PENALTY = 6.0
MIN_RUNS = 3  # a segment shorter than this is one bad night, not a change
OUTLIER = 3.0  # noise widths from its neighbours' median beyond which a run counts as that far
# Provenance compared across a change (the points table's columns).
ACROSS = ("git_commit", "reproflow_version", "image_sha256", "torch_version", "nccl_version", "device_name",
          "nodelist", "host_cpus", "network", "world_size")


@dataclass(frozen=True)
class Selection:
    """Which series: globs on suite, experiment, point and coordinates; a metric (empty: each family's
    headline); a part of the cluster's name, a node count, a date range (YYYY-MM-DD, both ends in)."""

    suite: str = "*"
    experiment: str = "*"
    point: str = "*"
    coords: str = "*"
    metric: str = ""
    cluster: str = ""
    nodes: int = 0
    since: str = ""
    until: str = ""


def series(con: sqlite3.Connection, folders: Sequence[Path], chosen: Selection) -> pd.DataFrame:
    """One row per series and run: key, run, start, cluster, n, log mean and variance, value (the geometric
    mean), the interval's ends, unit, the point's validity and its provenance; in start order."""
    # The globs and the metric are SQLite's to apply (a point named in full is looked up by the index, not
    # found among a year's samples here); the folders are this process's (a catalog's every folder, mostly).
    headline = sorted((name, f.headline) for name, f in families().items())
    metric = "s.metric = ?" if chosen.metric else (
        f"s.metric = CASE p.family {' '.join('WHEN ? THEN ?' for _ in headline)} END")
    where, args = points_where(chosen, "p")
    at, at_args = coords_where(chosen.coords, "s")
    frame = pd.read_sql_query(
        f"SELECT p.suite, p.experiment, p.point, s.coords, s.metric, s.unit, p.run_id AS run, p.folder, s.n, "
        f"s.log_mean, s.log_var, p.family, p.timestamp, p.invalid, {', '.join('p.' + c for c in ACROSS)} "
        f"FROM points p JOIN samples s ON s.pid = p.id WHERE {where} AND {at} AND {metric}", con,
        params=[*args, *at_args, *([chosen.metric] if chosen.metric else [v for pair in headline for v in pair])])
    frame = frame[frame.pop("folder").isin([str(f.resolve()) for f in folders])]
    frame = chosen_runs(con, folders, frame, chosen)
    if chosen.nodes:
        frame = frame[frame["nodelist"].fillna("").map(lambda s: len([h for h in str(s).split(",") if h]))
                      == chosen.nodes]
    # A run that measured a point twice (a rerun into the same folder) counts once: its larger sample.
    frame = frame.sort_values("n").drop_duplicates([*catalog.KEY, "run"], keep="last").sort_values("start")
    # A run whose value is no number (a zero, nothing finite) is shown as not valid, never left out unsaid.
    frame["invalid"] = frame["invalid"].fillna("").astype(str)
    frame.loc[frame["log_mean"].isna() & (frame["invalid"] == ""), "invalid"] = "no value: zero or not finite"
    # Each run's geometric mean and its t interval: compare's interval with nothing on the other side.
    zero, one = np.zeros(len(frame)), np.ones(len(frame))
    frame["value"], frame["low"], frame["high"] = log_ratio_intervals(
        frame["log_mean"].to_numpy(float), frame["log_var"].to_numpy(float), frame["n"].to_numpy(float), zero, zero,
        one, level=LEVEL)
    return frame.reset_index(drop=True)


def chosen_runs(con: sqlite3.Connection, folders: Sequence[Path], frame: pd.DataFrame,
                chosen: Selection) -> pd.DataFrame:
    """`frame`'s rows (a `run` column) with each run's start and cluster from its manifest (the start, where
    none is recorded, from the rows' `timestamp`), in the selection's cluster and dates only."""
    recorded = catalog.manifests(con, folders)
    stamps = frame["timestamp"] if "timestamp" in frame.columns else pd.Series("", index=frame.index)
    frame = frame.assign(start=[str(recorded.get(r, {}).get("start") or t) for r, t in zip(frame["run"], stamps,
                                                                                           strict=True)],
                         cluster=[str(recorded.get(r, {}).get("cluster", "")) for r in frame["run"]])
    keep = pd.Series(True, index=frame.index)
    if chosen.cluster:
        keep &= frame["cluster"].str.contains(chosen.cluster, regex=False)
    if chosen.since:
        keep &= frame["start"].str[:10] >= chosen.since
    if chosen.until:
        keep &= frame["start"].str[:10] <= chosen.until
    return frame[keep]


def points_where(chosen: Selection, table: str) -> tuple[str, list[str]]:
    """The selection's suite, experiment and point globs as an SQL condition on `table`, and its arguments."""
    return (f"{table}.suite GLOB ? AND {table}.experiment GLOB ? AND {table}.point GLOB ?",
            [_glob(chosen.suite), _glob(chosen.experiment), _glob(chosen.point)])


def coords_where(coords: str, table: str) -> tuple[str, list[str]]:
    """The coordinates asked for as an SQL condition on `table`: NAME=VALUE pairs (comma-separated) each
    matched exactly, whatever else the coordinates hold (`size_bytes=1048576`: not 10485760); otherwise a
    glob on the coordinates' JSON text."""
    pairs = [part.split("=", 1) for part in coords.split(",")] if "=" in coords else []
    if pairs and all(len(p) == 2 and p[0].strip() for p in pairs):
        return (" AND ".join(f"CAST(json_extract({table}.coords, ?) AS TEXT) = ?" for _ in pairs),
                [v for name, value in pairs for v in (f'$."{name.strip()}"', value.strip())])
    return f"COALESCE({table}.coords, '') GLOB ?", [_glob(coords)]


def _glob(pattern: str) -> str:
    """A shell glob as SQLite's GLOB takes it (fnmatch's [!...] is GLOB's [^...])."""
    return pattern.replace("[!", "[^")


def noise(logs: np.ndarray) -> float:
    """The run-to-run spread of a series' logarithms: 1.4826 x the median absolute difference of
    neighbouring runs over sqrt 2 (a change moves one difference, so it barely counts)."""
    if len(logs) < 3:
        return float("nan")
    return 1.4826 * float(np.median(np.abs(np.diff(logs)))) / math.sqrt(2)


def change_points(logs: np.ndarray, penalty: float = PENALTY, outlier: float = OUTLIER) -> list[int]:
    """Indices where a new segment starts, by PELT on the logarithms scaled by their noise (`outlier`:
    the clip, in noise widths; inf for none)."""
    sigma = noise(logs)
    if len(logs) < 2 * MIN_RUNS or not sigma > 0:
        return []
    # One run far from its neighbours (a noisy night on a shared cluster) is clipped to OUTLIER noise widths
    # of the running median of 5 runs before the search, which a step moves with it: the l2 cost would
    # otherwise buy a change to explain a lone outlier (heavy-tailed noise: benchmarks/history_bench.py).
    z = logs / sigma
    local = pd.Series(z).rolling(5, center=True, min_periods=1).median().to_numpy()
    z = local + np.clip(z - local, -outlier, outlier)
    return pelt(z, penalty * math.log(len(logs)), MIN_RUNS)


def pelt(z: np.ndarray, penalty: float, min_size: int) -> list[int]:
    """The starts of the segments after the first of the segmentation of `z` (segments of `min_size` or
    more) that minimises the sum of squares about each segment's mean plus `penalty` a segment: PELT
    (Killick, Fearnhead and Eckley 2012) with the l2 cost, its candidates pruned from the left as
    ruptures' KernelCPD(kernel="linear") prunes them, which gives the same segmentation (tests/
    test_history.py). Written here because importing ruptures (scipy.stats and scipy.spatial, which its
    other costs need) took 0.8 s, most of what `reproflow history` may take."""
    n = len(z)
    sums, squares = np.concatenate(([0.0], np.cumsum(z))), np.concatenate(([0.0], np.cumsum(z * z)))
    best = np.zeros(n + 1)  # best[t]: the least penalised cost of z[:t]
    last = np.zeros(n + 1, dtype=int)  # last[t]: where its last segment starts
    for t in range(1, 2 * min_size):
        best[t] = squares[t] - sums[t] ** 2 / t + penalty
    lowest = 0  # the first start not pruned
    for t in range(2 * min_size, n + 1):
        starts = np.concatenate(([lowest], np.arange(max(lowest + 1, min_size), t - min_size + 1)))
        cost = best[starts] + squares[t] - squares[starts] - (sums[t] - sums[starts]) ** 2 / (t - starts)
        pick = int(np.argmin(cost))  # the first of equals, as ruptures keeps
        best[t], last[t] = cost[pick] + penalty, starts[pick]
        # A start whose cost so far is above the best of z[:t] cannot start the last segment of a longer
        # series' best (the l2 cost only grows); pruned from the left up to the first that can.
        kept = np.flatnonzero(cost < best[t])
        lowest = int(starts[kept[0]]) if len(kept) else t - min_size + 1
    cuts, t = [], n
    while last[t]:
        t = int(last[t])
        cuts.append(t)
    return cuts[::-1]


def changes(rows: pd.DataFrame) -> pd.DataFrame:
    """The change points of one series (rows in start order): where, the runs either side, the ratio
    after / before of the segments' geometric means with its interval, better or worse, what differs."""
    logs = rows["log_mean"].to_numpy(float)
    cuts = change_points(logs)
    bounds = [0, *cuts, len(rows)]
    sign = direction(rows["unit"].iloc[0]) if len(rows) else 0
    out = []
    for i, cut in enumerate(cuts):
        before, after = logs[bounds[i]:cut], logs[cut:bounds[i + 2]]
        ratio, low, high = (x[0] for x in log_ratio_intervals(
            *(np.array([v]) for v in (after.mean(), after.var(ddof=1), len(after),
                                      before.mean(), before.var(ddof=1), len(before)))))
        last, first = rows.iloc[cut - 1], rows.iloc[cut]
        differs = what_differs(rows, bounds[i], cut, bounds[i + 2])
        worse = (sign > 0 and high < 1) or (sign < 0 and low > 1)
        better = (sign > 0 and low > 1) or (sign < 0 and high < 1)
        out.append({"suite": first["suite"], "experiment": first["experiment"], "point": first["point"],
                    "coords": first["coords"], "metric": first["metric"], "at": first["start"],
                    "last_before": last["run"], "first_after": first["run"], "runs_before": len(before),
                    "runs_after": len(after), "ratio": ratio, "low": low, "high": high,
                    "change": "worse" if worse else "better" if better else "neither (a count or a size)"
                    if sign == 0 else "within noise",
                    "what_differs": differs})
    return pd.DataFrame(out)


def what_differs(rows: pd.DataFrame, start: int, cut: int, end: int) -> str:
    """The recorded fields whose usual value differs between rows[start:cut] and rows[cut:end], each with
    the first run that has the new value (a cut found a run early or late still names the field, dated
    right). A field that changes between most neighbouring runs of the series (the node list of a shared
    cluster's nightly job) is no difference: said once, never named as a cause."""
    out, varying = [], []
    for c in ACROSS:
        values = rows[c].fillna("").astype(str)
        if len(values) > 2 and (values.to_numpy()[1:] != values.to_numpy()[:-1]).mean() > 0.5:
            varying.append(c)
            continue
        before, after = _most_common(values.iloc[start:cut]), _most_common(values.iloc[cut:end])
        if before == after:
            continue
        new = rows[(values == after) & (np.arange(len(rows)) >= start)].iloc[0]
        off = int(rows.index.get_loc(new.name)) - cut
        when = "at the change point" if off == 0 else (f"{abs(off)} run(s) {'after' if off > 0 else 'before'} "
                                                       "the change point")
        out.append(f"{c}: {before} -> {after} (first in {new['run']}, {str(new['start'])[:10]}: {when})")
    text = "; ".join(out) or "nothing the rows record"
    return text + (f" ({', '.join(varying)} vary from run to run: not a difference)" if varying else "")


def _most_common(values: pd.Series) -> str:
    counts = values.fillna("").astype(str).value_counts()
    return str(counts.index[0]) if len(counts) else ""


def write_history(rows: pd.DataFrame, out_dir: Path) -> tuple[list[Path], str, pd.DataFrame]:
    """history.csv, change_points.csv, history.md and a self-contained history.html with a figure per
    series; returns the files, the markdown and the change points."""
    if rows.empty:
        raise ReproflowError("no run in the catalog measured the series asked for. `reproflow runs` lists the runs; "
                             "widen --suite, --experiment, --point or --metric (the point's name as in its "
                             "result file, e.g. 'collective=all_reduce'), or give --results folders.")
    out_dir.mkdir(parents=True, exist_ok=True)
    found, figures = [], []
    groups = rows.groupby(catalog.KEY, sort=False)
    tick = catalog.Ticker("series searched and drawn")
    for number, (_, one) in enumerate(groups, 1):
        tick(number, groups.ngroups)
        # Runs whose points are not valid are shown, and kept out of the change points: never a level.
        valid = one[one["invalid"] == ""].reset_index(drop=True)
        cuts = changes(valid)
        found.append(cuts)
        figures += _figure(valid, one[one["invalid"] != ""], cuts, out_dir, len(figures))
    points = pd.concat(found, ignore_index=True) if any(len(f) for f in found) else pd.DataFrame()
    shown = rows[[*catalog.KEY, "run", "start", "cluster", "n", "value", "low", "high", "unit", "invalid"]]
    files = [out_dir / "history.csv", out_dir / "change_points.csv"]
    shown.to_csv(files[0], index=False, float_format="%.6g")
    points.to_csv(files[1], index=False, float_format="%.6g")
    series_count = rows.groupby(catalog.KEY).ngroups
    summary = (f"{series_count} series over {rows['run'].nunique()} runs ({rows['start'].min()[:10]} to "
               f"{rows['start'].max()[:10]}); {len(points)} change point(s) by PELT on each series' logarithms "
               f"(penalty {PENALTY:g} x noise variance x log runs, segments of {MIN_RUNS} runs or more); ratios "
               f"after / before with {LEVEL:.0%} intervals over the runs.")
    bad = rows[rows["invalid"] != ""]
    if len(bad):
        summary += (f" {len(bad)} run(s) of a series not valid, shown in history.csv and the figures with the "
                    "reason and left out of the change points: "
                    + "; ".join(f"{r.run} ({r.start[:10]}): {r.invalid}" for r in bad.head(5).itertuples())
                    + (f"; {len(bad) - 5} more in history.csv" if len(bad) > 5 else "") + ".")
    short = int((rows[rows["invalid"] == ""].groupby(catalog.KEY)["run"].nunique() < 2 * MIN_RUNS).sum())
    if short:  # PELT cannot place a change in a series shorter than two segments: say so, not "no change"
        summary += (f" {short} of {series_count} series have fewer than {2 * MIN_RUNS} runs, too few to find a "
                    "change in.")
    none = "No change point." if not short else "No change point (see above: some series are too short to have one)."
    md = f"# reproflow history\n\n{summary}\n\n" + (to_markdown(points) if len(points) else none) + "\n"
    body = (f"<h1>reproflow history</h1><p>{html.escape(summary)}</p>"
            + (html_table(points) if len(points) else f"<p>{html.escape(none)}</p>") + html_files(figures))
    files += [out_dir / "history.md", out_dir / "history.html"]
    atomic_write(files[2], md + "".join(f"\n![{f.stem}]({f.name})\n" for f in figures))
    atomic_write(files[3], f"<!doctype html><html><head><meta charset='utf-8'><title>reproflow history</title>"
                           f"<style>{CSS}</style></head><body>{body}</body></html>\n")
    return [*files, *figures], md, points


def _figure(one: pd.DataFrame, bad: pd.DataFrame, cuts: pd.DataFrame, out_dir: Path, number: int) -> list[Path]:
    """A series' valid runs with their levels and change points, and its runs not valid marked apart."""
    first = (one if len(one) else bad).iloc[0]
    when = pd.to_datetime(one["start"].str[:19], errors="coerce")
    fig, ax = new_figure((8, 3.4))
    spread = [(one["value"] - one["low"]).fillna(0), (one["high"] - one["value"]).fillna(0)]
    ax.errorbar(when, one["value"], yerr=spread, fmt="o", ms=2.5, lw=0.8, capsize=0,
                label="each run: geometric mean, 95 % interval")
    for at in pd.to_datetime(bad["start"].str[:19], errors="coerce"):
        ax.axvline(at, color="grey", ls=":", lw=1)
    if len(bad):
        ax.plot([], [], color="grey", ls=":", label=f"not valid ({len(bad)} run(s); history.csv says why)")
    bounds = [0, *(one.index[one["run"] == r][0] for r in cuts.get("first_after", [])), len(one)]
    for a, b in itertools.pairwise(bounds):
        if b <= a:  # no valid run in the series
            continue
        level = statistics.geometric_mean(one["value"].iloc[a:b])
        ax.hlines(level, when.iloc[a], when.iloc[b - 1], colors="tab:orange", lw=1.5)
    for _, cut in cuts.iterrows():
        ax.axvline(pd.to_datetime(cut["at"][:19]), color="tab:red", ls="--", lw=1)
        ax.annotate(f"{cut['ratio']:.3f} [{cut['low']:.3f}, {cut['high']:.3f}]",
                    (pd.to_datetime(cut["at"][:19]), ax.get_ylim()[1]), fontsize=7, color="tab:red",
                    ha="left", va="top", rotation=90)
    ax.set_ylabel(f"{first['metric']} ({first['unit']})")
    ax.set_title(f"{first['suite']} / {first['experiment']} / {first['point']} {first['coords'] or ''}", fontsize=8)
    ax.legend(fontsize=7, loc="lower left")
    fig.autofmt_xdate()
    return save_figure(fig, out_dir, f"history_{number:03d}", formats=("png",))
