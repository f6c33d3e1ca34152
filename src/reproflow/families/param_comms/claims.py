"""The claims of nccl-tests' PERFORMANCE.md that reproflow's collectives follow, judged on the rows.

busBW = algBW x the collective's factor is what reproflow computes, so its own rows cannot test it: the
claim is judged on the rows the original tools (param's comms.py, nccl-tests) wrote, from the numbers
they printed, where they ran. Small messages are latency-bound: busBW grows with size. A plateau at
large sizes is left out: it is the link's bandwidth on GPUs, which the document does not promise, and on
CPUs the caches make busBW rise and fall with size from run to run.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from reproflow.families.param_comms.report import SETTING
from reproflow.families.param_comms.sweep import bus_factor
from reproflow.reporting.claims import Claim, ClaimSpec, Comparison, Design, judge, not_measured
from reproflow.reporting.report import aggregates, newest, wide
from reproflow.spec.params import readable_size

FAMILY = "param_comms"
RUN_IT = "make comms (reproflow run param-demo -e comms)"
# The decimals each original tool prints algBW and busBW with: half a unit of the last is its rounding.
PRINTED_DECIMALS = {"param": 3, "nccl-tests": 2}

BUS_FACTOR = ClaimSpec(
    family=FAMILY, statement="the original tools' busBW / algBW is the nccl-tests factor reproflow uses "
    "(2(n-1)/n, (n-1)/n or 1)",
    ratio="largest, over the tool's rows, |busBW / algBW - factor| over what the printed numbers' rounding allows",
    paper="busBW = algBW x factor (nccl-tests doc/PERFORMANCE.md)", system="reproflow's bus factors",
    baselines="the busBW and algBW param's comms.py and nccl-tests printed", design=Design.BOUND, at_most=1.0,
    target="comms", cases="each original tool that ran (param, nccl-tests)")
GROWS = ClaimSpec(
    family=FAMILY, statement="busBW grows with message size",
    ratio="per collective, busBW at the largest size / at the smallest (geometric means of the repeats)",
    paper="small messages are latency-bound, busBW approaches the link's at large ones (nccl-tests "
    "doc/PERFORMANCE.md)", system="reproflow's collectives", baselines="the same at the smallest size",
    design=Design.INDEPENDENT, at_least=2.0, target="comms",
    cases="each collective and setting swept over 3 or more sizes")
CLAIMS = (BUS_FACTOR, GROWS)


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """Both claims on the family's rows."""
    rows = aggregates(newest(frame)) if len(frame) else frame
    if rows.empty:
        return [not_measured(spec, f"no param comms rows: {RUN_IT}") for spec in CLAIMS]
    table = wide(rows, ["collective", *SETTING, "size_bytes"], ["algbw", "busbw"]).dropna()
    table = table[table["algbw"] > 0]
    return [_bus_factor(table), _grows(rows)]


def _bus_factor(table: pd.DataFrame) -> Claim:
    """Each tool's largest deviation from the factor, in units of its printed rounding."""
    comparisons = []
    for tool, sub in table[table["implementation"].isin(list(PRINTED_DECIMALS))].groupby("implementation"):
        half = 0.5 * 10.0 ** -PRINTED_DECIMALS[str(tool)]
        factor = pd.Series([bus_factor(c, int(n)) for c, n in zip(sub["collective"], sub["world_size"], strict=True)],
                           index=sub.index)
        # busBW / algBW from numbers rounded to +-half: off by at most half (1 + busBW / algBW) / algBW.
        allowed = half * (1 + sub["busbw"] / sub["algbw"]) / sub["algbw"]
        deviation = (sub["busbw"] / sub["algbw"] - factor).abs() / allowed
        worst = deviation.idxmax()
        comparisons.append(Comparison(
            str(tool), float(deviation.max()),
            note=f"{len(sub)} rows; worst {sub.loc[worst, 'collective']} {readable_size(sub.loc[worst, 'size_bytes'])}"
                 f" {sub.loc[worst, 'dtype']}: busBW / algBW {sub.loc[worst, 'busbw'] / sub.loc[worst, 'algbw']:.4f}"
                 f", factor {factor.loc[worst]:.4f}"))
    return judge(BUS_FACTOR, comparisons, missing="no rows of param's comms.py or nccl-tests (reproflow's own rows "
                 "compute busBW from this factor, so they cannot test it): reproflow run param-compare-local, or "
                 "param-compare on a GPU cluster")


def _grows(rows: pd.DataFrame) -> Claim:
    """busBW's repeats at the largest size against those at the smallest, per collective and setting of
    reproflow's sweeps (a timing: one sample a side decides nothing)."""
    busbw = rows[(rows["metric"] == "busbw") & (rows["implementation"] == "reproflow") & (rows["value"] > 0)]
    comparisons = []
    for key, sub in busbw.groupby(["collective", *SETTING]):
        sizes = sorted(sub["size_bytes"].unique())
        if len(sizes) >= 3:
            at = dict(zip(["collective", *SETTING], key, strict=True))
            where = (f"{at['collective']}, {int(at['world_size'])} ranks {at['backend']}/{at['device']} {at['dtype']}"
                     + (", blocking" if at["blocking"] else ""))
            first, last = (sub.loc[sub["size_bytes"] == s, "value"].astype(float).tolist()
                           for s in (sizes[0], sizes[-1]))
            comparisons.append(Comparison(where, last, first,
                                          note=f"{readable_size(sizes[0])}-{readable_size(sizes[-1])}"))
    return judge(GROWS, comparisons, busbw, missing=f"no size sweep of 3 or more sizes: {RUN_IT}")
