"""Suspect nodes (`reproflow nodes`): the nodes whose ranks are slower than their peers', across runs.

A rank's time depends on its role (a pipeline stage, its share of a GEMM), on the run (a commit, a
driver, the load of the day) and on the node it ran on. For every time the ranks of a multi-node point
report (the catalog's `ranks`), the logarithms over runs x ranks are fitted by median polish as a run
effect plus a rank effect; what is left is what the node adds. A node's evidence is one number per run
it ran in: its ranks' mean residual over every series of the run less the mean of the other nodes' of
that run (its time against its peers'), and its slowdown the geometric mean of those with a t interval;
how often it was the slowest node of its run is beside it. A node is suspect
when its whole interval lies above 1 + margin, at a level that keeps the chance of naming any healthy
node of the cluster at most 5 % (Bonferroni over the nodes judged). Collectives synchronise their ranks,
so their per-rank times barely tell nodes apart: the evidence comes from per-rank compute and step times.
"""

from __future__ import annotations

import html
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from reproflow.reporting import catalog
from reproflow.reporting.history import Selection, chosen_runs, points_where
from reproflow.reporting.page import CSS, html_table, to_markdown
from reproflow.store.files import atomic_write

ALPHA = 0.05  # the chance of naming at least one healthy node, over all the nodes judged
EXCLUDE = "exclude.txt"  # the suspect nodes as Slurm's --exclude takes them


def residuals(con: sqlite3.Connection, folders: Sequence[Path], chosen: Selection) -> pd.DataFrame:
    """Per run of two nodes or more and per node, the mean of its ranks' residuals (logarithms) over every
    series of the run, less the mean of the other nodes' (`residual`)."""
    where, args = points_where(chosen, "p")
    if chosen.metric:
        where, args = f"{where} AND r.metric = ?", [*args, chosen.metric]
    frame = pd.read_sql_query(f"SELECT p.suite, p.experiment, p.point, r.coords, r.metric, p.run_id AS run, "
                              f"r.rank, r.node, r.log_median, p.folder FROM points p JOIN ranks r ON r.pid = p.id "
                              f"WHERE {where}", con, params=args)
    frame = frame[frame.pop("folder").isin([str(f.resolve()) for f in folders])]
    frame = chosen_runs(con, folders, frame, chosen)
    parts = [_polish(series) for _, series in frame.groupby(catalog.KEY, sort=False)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=["run", "start", "node", "residual"])
    per_node = pd.concat(parts).groupby(["run", "start", "node"], as_index=False)["residual"].mean()
    by_run = per_node.groupby("run")["residual"]
    count, total = by_run.transform("size"), by_run.transform("sum")
    per_node["residual"] = per_node["residual"] - (total - per_node["residual"]) / (count - 1).where(count > 1)
    return per_node[count > 1].reset_index(drop=True)


def _polish(series: pd.DataFrame) -> pd.DataFrame:
    """The residuals of one series' runs x ranks table after removing run and rank medians (twice)."""
    table = series.pivot_table(index="run", columns="rank", values="log_median", aggfunc="median")
    if table.shape[0] < 2 or table.shape[1] < 2:
        return series.iloc[0:0].assign(residual=[])
    left = table.to_numpy(float).copy()
    for _ in range(2):
        left -= np.nanmedian(left, axis=1, keepdims=True)
        left -= np.nanmedian(left, axis=0, keepdims=True)
    fitted = pd.DataFrame(left, index=table.index, columns=table.columns).stack().rename("residual").reset_index()
    return series.merge(fitted, on=["run", "rank"])


def suspects(per_run: pd.DataFrame, margin: float) -> pd.DataFrame:
    """Per node: runs, how often the slowest, the slowdown (geometric mean) with its interval, the verdict."""
    if per_run.empty:
        return pd.DataFrame(columns=["node", "runs", "slowest_in", "slowdown", "low", "high", "verdict"])
    slowest = per_run.loc[per_run.groupby("run")["residual"].idxmax()]
    counted = slowest[per_run.groupby("run")["node"].transform("nunique").loc[slowest.index] >= 2]
    judged = per_run.groupby("node")["residual"]
    level = 1 - ALPHA / max(per_run["node"].nunique(), 1)
    rows = []
    for node, values in judged:
        logs = values.to_numpy(float)
        mean = float(logs.mean())
        if len(logs) >= 2 and logs.std(ddof=1) > 0:
            half = float(special.stdtrit(len(logs) - 1, 0.5 + level / 2) * logs.std(ddof=1) / math.sqrt(len(logs)))
        else:
            half = math.inf
        low, high = math.exp(mean - half), math.exp(mean + half)
        verdict = "suspect" if low > 1 + margin else ("too few runs" if len(logs) < 3 else "")
        rows.append({"node": node, "runs": len(logs), "slowest_in": int((counted["node"] == node).sum()),
                     "slowdown": math.exp(mean), "low": low, "high": high, "verdict": verdict})
    return pd.DataFrame(rows).sort_values("slowdown", ascending=False).reset_index(drop=True)


def write_nodes(table: pd.DataFrame, out_dir: Path, margin: float) -> tuple[list[Path], str]:
    """nodes.md, nodes.csv, a self-contained nodes.html and exclude.txt (the suspects, comma-separated)."""
    bad = table.loc[table["verdict"] == "suspect", "node"].tolist()
    level = 1 - ALPHA / max(len(table), 1)
    intro = (f"{len(table)} node(s) judged; suspect: a node whose ranks' times, after the run's and the rank's own "
             f"effects are taken out, are slower than 1 + {margin:g} of their peers' over its whole {level:.1%} "
             f"interval (5 % over all nodes); slowest_in: the runs in which it was its run's slowest node.")
    said = f"Suspect: {', '.join(bad)}. Keep them out: reproflow submit --exclude {','.join(bad)} (or sbatch " \
           f"--exclude=$(cat {out_dir / EXCLUDE}))." if bad else "No suspect node."
    md = f"# reproflow nodes\n\n{intro}\n\n{said}\n\n{to_markdown(table)}\n"
    paths = [out_dir / "nodes.md", out_dir / "nodes.csv", out_dir / "nodes.html", out_dir / EXCLUDE]
    atomic_write(paths[0], md)
    atomic_write(paths[1], table.to_csv(index=False))
    atomic_write(paths[2], f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>reproflow nodes</title>'
                           f"<style>{CSS}</style></head><body><h1>reproflow nodes</h1><p>{html.escape(intro)}</p>"
                           f"<p>{html.escape(said)}</p>{html_table(table)}</body></html>\n")
    atomic_write(paths[3], ",".join(bad) + "\n")
    return paths, md
