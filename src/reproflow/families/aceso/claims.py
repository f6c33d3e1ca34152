"""Aceso's claims, judged on the confirmation's rows (baseline.py): Aceso's config trains faster than the
Megatron-LM baseline, both as the paper compares them (each side's predicted pick: Aceso's predicted
best config against the uniform plan the cost model predicts fastest) and against the strongest baseline
(each side's measured pick: the fastest on the screen that fits, both sides screened alike); and the
search's prediction of Aceso's config is within 10 % of its measured iteration.

Each training of a round is one point: its iterations' slowest-rank times (`step_ms`), its round, the
pick it stands for (`pick`: measured, predicted, or both where one config is both), its config's digest
(the same plan under two names is one config) and what the search predicted for it (`predicted_ms`).
Rounds pair by their number: a round missing on one side is left out, and said.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from reproflow.reporting.claims import (
    A_DEVICE_PER_RANK,
    Claim,
    ClaimSpec,
    Comparison,
    Design,
    Requirement,
    Selection,
    judge,
    not_measured,
)
from reproflow.reporting.report import newest

RUN_IT = "make {target} (reproflow aceso reproduce small --out <reports>/aceso)"
PAPER_SPEEDUP = "GPT-1.3B 1.24x, T5-770M 1.52x, Wide-ResNet-1B 1.20x (8.68/6.98, 15.14/9.94, 41.52/34.59 samples/s)"
PAPER_ERROR = "GPT-1.3B 0.4%, T5-770M 0.5%, Wide-ResNet-1B 5.3% (the artifact's small setting)"
RATIO = ("the Megatron-LM plan's iteration time / Aceso's config's (samples/s of Aceso over the plan's), over the "
         "rounds in turns")



def _one_rank(rows: pd.DataFrame) -> str:
    """Why a setting's search space is no larger than the grid's ('' where it is)."""
    if "world_size" not in rows.columns:
        return ""
    ranks = pd.to_numeric(rows["world_size"], errors="coerce")
    if ranks.empty or ranks.max() >= 2:
        return ""
    return ("one rank: Aceso's space then adds only per-op recomputation to Megatron-LM's grid (its per-op tensor "
            "and data parallelism and its stage cuts take 2 or more ranks)")


# Aceso's claims are about what its larger search space finds; where the spaces nearly coincide they test nothing.
LARGER_SPACE = Requirement("a search space larger than Megatron-LM's grid (2 or more ranks)", _one_rank)

PAPER = ClaimSpec(
    family="aceso", statement="Aceso's config trains faster than the Megatron-LM plan the paper compares with "
    "(the uniform plan its cost model predicts fastest)", ratio=RATIO, paper=PAPER_SPEEDUP,
    system="Aceso's config the search predicts fastest (the artifact's)",
    baselines="the uniform Megatron-LM plan the cost model predicts fastest (the artifact's baseline)",
    design=Design.PAIRED, selection=Selection.NONE, at_least=1.0, requires=(A_DEVICE_PER_RANK, LARGER_SPACE),
    target="fig7",
    cases="each model and setting (GPT, T5, Wide-ResNet, GPT under memory pressure)")
STRONGEST = ClaimSpec(
    family="aceso", statement="Aceso's config trains faster than the fastest Megatron-LM plan measured (same "
    "runtime, same devices)", ratio=RATIO, paper=PAPER_SPEEDUP,
    system="the fastest of Aceso's configs (one per pipeline depth) on the screen that fits",
    baselines="the fastest plan of Megatron-LM's grid (uniform and uneven stages, every micro-batch, "
    "recomputation) on the screen that fits", design=Design.PAIRED, selection=Selection.SCREEN, at_least=1.0,
    requires=(A_DEVICE_PER_RANK, LARGER_SPACE), target="fig7", cases=PAPER.cases)
PREDICTION = ClaimSpec(
    family="aceso", statement="the search's predicted iteration time of Aceso's config is within 10 % of the "
    "measured one", ratio="predicted by the search, before any training / the rounds' median iterations",
    paper=PAPER_ERROR, system="the search's cost model", baselines="the measured iterations of Aceso's configs",
    design=Design.PREDICTION, at_least=0.9, at_most=1.1, requires=(A_DEVICE_PER_RANK,), target="fig9",
    cases="each of Aceso's configs trained in rounds (its predicted and measured picks), each model and setting")
CLAIMS = (PAPER, STRONGEST, PREDICTION)

Rounds = dict[int, list[float]]


def _trainings(frame: pd.DataFrame) -> pd.DataFrame:
    """The confirmation's iterations on reproflow's layers, with each one's case label."""
    if not {"metric", "plan", "model_name", "model_size", "round"} <= set(frame.columns):
        return frame.iloc[0:0]
    rows = newest(frame)
    rows = rows[(pd.to_numeric(rows["round"], errors="coerce") > 0)]
    if "tp_impl" in rows.columns:
        rows = rows[rows["tp_impl"].fillna("reproflow") == "reproflow"]
    case = rows["case"].fillna("").astype(str) if "case" in rows.columns else pd.Series("", index=rows.index)
    pick = rows["pick"].fillna("measured").astype(str) if "pick" in rows.columns else "measured"
    digest = rows["config_digest"].fillna("").astype(str) if "config_digest" in rows.columns else rows["config_name"]
    return rows.assign(key=rows["model_name"].astype(str) + " " + rows["model_size"].astype(str)
                       + case.map(lambda c: f"-{c}" if c else ""), round=pd.to_numeric(rows["round"]).astype(int),
                       pick=pick, digest=digest.astype(str))


def _role(rows: pd.DataFrame, plan: str, pick: str) -> pd.DataFrame:
    """The trainings that stand for `plan`'s `pick` (a training picked as both stands for each)."""
    return rows[(rows["plan"] == plan) & rows["pick"].isin([pick, "both"])]


def _rounds(rows: pd.DataFrame) -> Rounds:
    """Per round, its iterations' times."""
    steps = rows[rows["metric"] == "step_ms"]
    return {int(r): g["value"].astype(float).tolist() for r, g in steps.groupby("round")}


def _peak(rows: pd.DataFrame) -> str:
    """The heaviest rank's measured peak (MB) over the trainings, or ''."""
    peak = rows.loc[rows["metric"] == "rank_max_reserved", "value"]
    return f"{float(peak.max()):.0f} MB" if len(peak) else ""


def _comparison(key: str, rows: pd.DataFrame, pick: str) -> Comparison:
    """The case's Megatron-LM plan against Aceso's config, both `pick`."""
    aceso, megatron = _role(rows, "aceso", pick), _role(rows, "megatron", pick)
    same = (set(aceso["digest"]) == set(megatron["digest"]) and len(set(aceso["digest"])) == 1)
    peaks = ", ".join(f"{who} {p}" for who, p in (("Aceso", _peak(aceso)), ("Megatron-LM", _peak(megatron))) if p)
    return Comparison(key, _rounds(megatron), _rounds(aceso),
                      same="Aceso's config is the Megatron-LM plan itself" if same else "",
                      note=f"peak memory {peaks}" if peaks else "")


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """The three claims on the confirmation's rows."""
    rows = _trainings(frame)
    if rows.empty:
        return [not_measured(spec, f"no trained configs in rounds: {RUN_IT.format(target=spec.target)}")
                for spec in CLAIMS]
    cases: Mapping[str, pd.DataFrame] = dict(tuple(rows.groupby("key", sort=False)))
    out = [judge(spec, [_comparison(str(key), sub, pick) for key, sub in cases.items()], rows)
           for spec, pick in ((PAPER, "predicted"), (STRONGEST, "measured"))]
    return [*out, _prediction(cases, rows)]


def _prediction(cases: Mapping[str, pd.DataFrame], rows: pd.DataFrame) -> Claim:
    """Each of Aceso's configs trained: its prediction over its rounds' medians. The Megatron-LM plans'
    predictions beside it, as information: the paper claims its accuracy for Aceso's configs."""
    comparisons, beside = [], []
    for key, sub in cases.items():
        for (plan, _), config in sub.groupby(["plan", "digest"], sort=False):
            predicted = config.loc[config["metric"] == "predicted_ms", "value"]
            medians = [float(np.median(v)) for v in _rounds(config).values()]
            if not len(predicted) or not medians:
                continue
            label = f"{key} {config['config_name'].iloc[0]}"
            if plan == "aceso":
                comparisons.append(Comparison(label, float(predicted.iloc[0]), medians,
                                              note=f"picked {'/'.join(sorted(set(config['pick'])))}"))
            else:
                beside.append(f"{label} {float(predicted.iloc[0]) / float(np.exp(np.mean(np.log(medians)))):.3f}")
    detail = f"the Megatron-LM plans' (not judged): {', '.join(beside)}" if beside else ""
    missing = f"no trained config with the search's prediction in its rows: {RUN_IT.format(target='fig9')}"
    return judge(PREDICTION, comparisons, rows, detail=detail, missing=missing)
