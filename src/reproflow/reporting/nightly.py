"""`reproflow history --judge RUN`: is a run normal for this cluster?

Each series the run measured (suite, experiment, point, coordinates, metric) is set against the runs before
it on the same cluster with the same node count, valid ones only, the last `last` of them: the prediction
interval for one more run from their logarithms' mean and standard deviation (Student's t with n - 1
degrees of freedom, times sqrt(1 + 1/n): exact for runs whose logarithms are normal and independent; a past
slow spell widens it, so it errs towards fewer alarms). The level is per run: the false-alarm rate `alarm`
shared among the run's judged series (Bonferroni), so a night with nothing changed raises an alarm with
probability at most `alarm` whatever the number of its series (benchmarks/history_bench.py measures it).

Validity first: a point that is not valid (a failed health gate, a headline of zero) is never normal.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from reproflow.reporting import catalog
from reproflow.reporting.compare import direction
from reproflow.reporting.page import to_markdown
from reproflow.spec.errors import ReproflowError
from reproflow.store.files import atomic_write

LAST = 20  # comparable runs an interval is made from, at most
FEWEST = 8  # fewer comparable runs than this: no interval
ALARM = 0.01  # a run's false-alarm rate, shared among its series
NORMAL, WORSE, BETTER, NOT_VALID, TOO_FEW = "normal", "worse", "better", "not valid", "too few runs"
FAILS = (WORSE, NOT_VALID)  # what fails the nightly gate


def judge(rows: pd.DataFrame, run: str, last: int = LAST, alarm: float = ALARM) -> pd.DataFrame:
    """Each series of `run` in `rows` (history.series: every run of the catalog's series) against its
    comparable runs before it; one row per series with the value, the interval, the verdict and the runs
    used (how many, the first and the last)."""
    if not 0 < alarm < 1:
        raise ReproflowError(f"--alarm {alarm}: give the false-alarm rate a run may have, between 0 and 1 (0.01).")
    if not (rows["run"] == run).any():
        raise ReproflowError(f"--judge {run}: no run of that id measured the series asked for; `reproflow runs` "
                             "lists the runs.")
    rows = rows.assign(**{c: rows[c].fillna("").astype(str) for c in catalog.KEY})
    rows = rows.assign(hosts=rows["nodelist"].fillna("").astype(str).map(lambda s: len([h for h in s.split(",")
                                                                                         if h])))
    night = rows[rows["run"] == run].drop_duplicates(catalog.KEY)
    judged = int((night["invalid"] == "").sum())
    level = 1 - alarm / max(judged, 1)
    out = []
    for _, t in night.iterrows():
        same = np.logical_and.reduce([rows[c] == t[c] for c in catalog.KEY])
        past = rows[same & (rows["start"] < t["start"]) & (rows["cluster"] == t["cluster"])
                    & (rows["hosts"] == t["hosts"]) & (rows["invalid"] == "")].tail(last)
        row = {**{c: t[c] for c in catalog.KEY}, "unit": t["unit"], "value": t["value"], "expected": np.nan,
               "low": np.nan, "high": np.nan, "runs_used": len(past),
               "first_used": past["run"].iloc[0] if len(past) else "",
               "last_used": past["run"].iloc[-1] if len(past) else "", "why": t["invalid"]}
        if t["invalid"]:
            row["verdict"] = NOT_VALID
        elif len(past) < FEWEST:
            row["verdict"], row["why"] = TOO_FEW, f"{len(past)} comparable valid run(s) before it; {FEWEST} needed"
        else:
            centre, half = prediction_interval(past["log_mean"].to_numpy(float), level)
            row.update(expected=math.exp(centre), low=math.exp(centre - half), high=math.exp(centre + half))
            x, sign = float(t["log_mean"]), direction(str(t["unit"]))
            inside = abs(x - centre) <= half
            row["verdict"] = NORMAL if inside or sign == 0 else (
                BETTER if (x > centre) == (sign > 0) else WORSE)
        out.append(row)
    return pd.DataFrame(out)


def prediction_interval(logs: np.ndarray, level: float) -> tuple[float, float]:
    """Centre and half-width of the interval that holds one more value of `logs`' kind with probability
    `level`, for independent normal values."""
    n = len(logs)
    scale = float(np.std(logs, ddof=1))
    return float(np.mean(logs)), float(special.stdtrit(n - 1, (1 + level) / 2)) * scale * math.sqrt(1 + 1 / n)


def write_judgement(table: pd.DataFrame, run: str, out_dir: Path, last: int, alarm: float) -> tuple[Path, str]:
    """judge.csv in `out_dir` and the text to print: a summary, then every series not judged normal."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "judge.csv"
    atomic_write(path, table.to_csv(index=False, float_format="%.6g"))
    counts = table["verdict"].value_counts()
    summary = (f"run {run} against the last {last} valid runs before it on its cluster and node count, per "
               f"series (a prediction interval; a false-alarm rate of {alarm:g} a run, shared among its "
               f"{int((table['verdict'] != NOT_VALID).sum())} series): "
               + ", ".join(f"{counts.get(v, 0)} {v}" for v in (NORMAL, WORSE, BETTER, NOT_VALID, TOO_FEW)) + ".")
    odd = table[table["verdict"] != NORMAL]
    shown = odd[[*catalog.KEY, "value", "expected", "low", "high", "runs_used", "first_used", "last_used",
                 "verdict", "why"]]
    return path, summary + ("\n\n" + to_markdown(shown) if len(odd) else "")
