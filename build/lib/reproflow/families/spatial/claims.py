"""MPI4DL's claims, judged on the rows: tiles compute what the unsplit model computes, tiles are faster
than layer parallelism alone, and halo-D2 (one wide halo for a group of layers) is faster than a halo
before every convolution, as the README's chart shows for AmoebaNet."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from reproflow.families.spatial.report import config
from reproflow.reporting.claims import (
    A_DEVICE_PER_RANK,
    Claim,
    ClaimSpec,
    Comparison,
    Design,
    judge,
    not_measured,
)
from reproflow.reporting.report import aggregates, newest

FAMILY = "spatial"
CHART = "MPI4DL README chart, images/s read off by eye"

EQUAL = ClaimSpec(
    family=FAMILY, statement="spatial parallelism's logits and gradients equal the serial (unsplit) model's",
    ratio="largest error relative to the largest value, logits and gradients (fp64)",
    paper="equal (the halo exchange makes tiles exact, MPI4DL)", system="the tiled model",
    baselines="the unsplit model on one process", design=Design.BOUND, at_most=1e-9, target="spatial-check",
    cases="each model and slicing, with and without halo-D2")
FASTER = ClaimSpec(
    family=FAMILY, statement="spatial tiles are faster than layer parallelism alone",
    ratio="layer parallelism's step time / the tiled configuration's (speedup_claim in the suite), geometric "
    "means of the steps after the first", paper=f"1.41x: 2.6 / 1.85 images/s, ResNet 1024², batch 1, 5 GPUs ({CHART})",
    system="the tiled configuration the suite names", baselines="layer parallelism alone (the paper's baseline)",
    design=Design.INDEPENDENT, at_least=1.0, requires=(A_DEVICE_PER_RANK,), target="spatial-throughput",
    cases="each model")
HALO_D2 = ClaimSpec(
    family=FAMILY, statement="halo-D2 makes AmoebaNet's tiles faster than a halo before every convolution",
    ratio="step time without halo-D2 / with it, geometric means of the steps after the first",
    paper=f"1.83x square, 1.96x vertical, 1.78x horizontal (AmoebaNet 1024², batch 1; {CHART}); ResNet "
    "shows none (0.96x square)", system="tiles with halo-D2", baselines="the same tiles, a halo before every "
    "convolution", design=Design.INDEPENDENT, at_least=1.0, requires=(A_DEVICE_PER_RANK,),
    target="spatial-chart", cases="AmoebaNet, each slicing timed with and without halo-D2")
CLAIMS = (EQUAL, FASTER, HALO_D2)


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """The three claims on the family's rows."""
    agg = aggregates(newest(frame)).copy() if len(frame) else pd.DataFrame({"metric": []})
    if len(agg):
        agg = agg.assign(config=agg.apply(config, axis=1))
    return [_equal(agg[agg["metric"].isin(["logits_max_rel_err", "grads_max_rel_err"])]), _faster(agg),
            _halo_d2(agg)]


def _equal(checked: pd.DataFrame) -> Claim:
    """The largest error of each model and slicing."""
    if checked.empty:
        return not_measured(EQUAL, "no check rows: make spatial-check")
    return judge(EQUAL, [Comparison(f"{model} {name.removeprefix('spatial ')}", float(sub["value"].max()))
                         for (model, name), sub in checked.groupby(["model", "config"])])


def _steps(agg: pd.DataFrame) -> pd.DataFrame:
    """Every timed step after each point's first, of the timed points only (the checks run other sizes,
    one step each). Numbers compared as numbers: a CSV column with gaps reads as float (0.0, not "0")."""
    if "step" not in agg.columns:
        return agg.iloc[0:0]
    first = (pd.to_numeric(agg["epoch"], errors="coerce") == 0) & (pd.to_numeric(agg["step"], errors="coerce") == 0)
    checks = agg["verify"].astype(str) == "True" if "verify" in agg.columns else False
    return agg[(agg["metric"] == "step_s") & ~first & ~checks]


def _checks(agg: pd.DataFrame) -> pd.DataFrame:
    """The check rows: run on the ranks a timing would take."""
    return agg[agg["metric"] == "logits_max_rel_err"] if len(agg) else agg


def _faster(agg: pd.DataFrame) -> Claim:
    """Per model, layer parallelism's steps over the named tiled configuration's."""
    steps = _steps(agg)
    named = steps["speedup_claim"].astype(str) == "True" if "speedup_claim" in steps.columns else False
    comparisons, used = [], []
    for model in sorted(set(steps["model"])) if len(steps) else ():
        mine = steps[steps["model"] == model]
        tiled = mine[named[mine.index]] if not isinstance(named, bool) else mine.iloc[0:0]
        layer = mine[mine["config"] == "layer parallelism"]
        if len(tiled) and len(layer):
            used += [tiled, layer]
            comparisons.append(Comparison(f"{model}: {' / '.join(sorted(set(tiled['config'])))}",
                                          layer["value"].to_numpy(float), tiled["value"].to_numpy(float)))
    if not comparisons:
        # Not timed: where the checks' ranks shared fewer cores, timing would not judge it either.
        return judge(FASTER, (), _checks(agg), missing="no timed point names itself the claim's tiled configuration: "
                     "make spatial-throughput (it needs a core per rank)")
    return judge(FASTER, comparisons, pd.concat(used),
                 detail=f"on {', '.join(sorted(set(steps['device'].astype(str))))}")


def _halo_d2(agg: pd.DataFrame) -> Claim:
    """Per slicing of AmoebaNet, the steps without halo-D2 over those with it."""
    steps = _steps(agg)
    steps = steps[steps["model"] == "amoebanet"] if len(steps) else steps
    comparisons, used = [], []
    for name in ("square", "vertical", "horizontal"):
        plain = steps[steps["config"] == f"spatial {name}"] if len(steps) else steps
        d2 = steps[steps["config"] == f"spatial {name} + halo-D2"] if len(steps) else steps
        if len(plain) and len(d2):
            used += [plain, d2]
            comparisons.append(Comparison(f"amoebanet {name}", plain["value"].to_numpy(float),
                                          d2["value"].to_numpy(float)))
    if not comparisons:
        return judge(HALO_D2, (), _checks(agg), missing="no AmoebaNet slicing timed both with and without halo-D2: "
                     "make spatial-chart (and spatial-throughput for square tiles; both need a core per rank)")
    return judge(HALO_D2, comparisons, pd.concat(used))
