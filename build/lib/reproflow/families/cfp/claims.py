"""CFP's claims, judged on the timed steps: its searched plan is at least as fast as every baseline
measured, and as each family of them (the Alpa-style per-contraction plan, PyTorch's, DeepSpeed's).

Selection is never judgement: where the search screened, the fastest plan of each kind (choices.KINDS)
was chosen on the screen's steps, and only the steps timed after it judge; the first claim is judged
against every baseline timed, so no pick of "the fastest" is made on the steps that judge it. A
baseline whose block strategies are CFP's plan's own is the same plan: that case is not compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from reproflow.families.cfp.choices import BASELINES, baseline_of
from reproflow.families.cfp.report import KEYS, cfp_plans, same_as_cfp, search_rows, versus
from reproflow.reporting.claims import (
    A_DEVICE_PER_RANK,
    Claim,
    ClaimSpec,
    Comparison,
    Design,
    Selection,
    judge,
    not_measured,
)

RATIO = "the baseline's step time / CFP's, geometric means of the steps timed in turns"
NOT_PUBLISHED = "its figures are not in the available sources"


def _spec(name: str, baselines: str, selection: Selection, paper: str) -> ClaimSpec:
    return ClaimSpec(family="cfp", statement=f"CFP's plan is at least as fast as {name}", ratio=RATIO, paper=paper,
                     system="CFP's searched plan", baselines=baselines, design=Design.INDEPENDENT,
                     selection=selection, at_least=1.0, requires=(A_DEVICE_PER_RANK,), target="cfp-search",
                     cases="each model, mesh and batch searched")


# (the claim, the baselines it covers)
VERSUS = (
    (_spec("every baseline measured", "every baseline timed (each the fastest of its kind on the screen)",
           Selection.EVERY, "a searched plan is meant to be at least the best fixed one; the paper's figures against "
           "PyTorch and DeepSpeed-Megatron are not in the available sources"), BASELINES),
    (_spec("the Alpa-style plan", "Alpa's per-contraction integer program on the same blocks (the paper's "
           "baseline)", Selection.NONE, "up to 1.51x (GPT), 1.31x (LLaMA), 3.43x (MoE) over Alpa (arXiv 2504.00598)"),
     ("alpa",)),
    (_spec("PyTorch (DDP and FSDP2)", "DDP and FSDP2", Selection.SCREEN,
           f"compared with PyTorch in the paper; {NOT_PUBLISHED}"), ("ddp", "fsdp2")),
    (_spec("DeepSpeed (ZeRO stages 1-3 and DeepSpeed-Megatron)", "ZeRO stages 1-3 and DeepSpeed-Megatron "
           "(Megatron-LM's tensor parallelism with ZeRO-1)", Selection.SCREEN,
           f"compared with DeepSpeed-Megatron in the paper; {NOT_PUBLISHED}"),
     ("zero1", "zero2", "zero3", "deepspeed-megatron")),
)
CLAIMS = tuple(spec for spec, _ in VERSUS)


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """Each claim over every case and every baseline it covers."""
    rows = search_rows(frame) if len(frame) else frame
    search = rows[rows["mode"] == "search"] if len(rows) else rows
    return [_versus(search, spec, plans) for spec, plans in VERSUS]


def _versus(search: pd.DataFrame, spec: ClaimSpec, plans: tuple[str, ...]) -> Claim:
    """CFP's plan against each baseline of `plans` timed, in every case; a baseline that is CFP's plan
    itself is a case not compared (for a claim about one family of baselines)."""
    steps = search[search["metric"] == "step_time"] if len(search) else search
    if steps.empty:
        return not_measured(spec, "no search rows: make cfp-search")
    ran = [p for p in dict.fromkeys(steps["plan"]) if baseline_of(p) in plans]
    if "cfp" not in set(steps["plan"]) or not ran:
        return not_measured(spec, f"the search ran without the {', '.join(plans)} baseline(s)")
    keys = [k for k in KEYS if k in steps.columns]
    batches = steps["batch_size"].nunique() > 1

    def place(at: Mapping[str, Any]) -> str:
        """A case's model (mesh and batch where the rows have several; a batch read back from CSV is a float)."""
        return (f"{at['model']}" + (f" {at['mesh']}" if at.get("mesh", "1-D") != "1-D" else "")
                + (f" batch {int(float(at['batch_size']))}" if batches else ""))

    comparisons = [Comparison(place(at), other, cfp, baseline=plan) for at, plan, cfp, other in versus(search, plans)]
    if plans != BASELINES:  # the Alpa-style plan may be CFP's own: that case compared nothing
        comparisons += [Comparison(place(dict(zip(keys, key, strict=True))), (), baseline=plan,
                                   same=f"{plan}'s plan is CFP's")
                        for key, itself in same_as_cfp(search, keys).items() for plan in sorted(itself)
                        if baseline_of(plan) in plans]
    screened = search[(search["metric"] == "screen_time") & search["plan"].isin(ran)]
    timed = {(*(getattr(r, k) for k in keys), r.plan) for r in search[search["metric"] == "step_s"].itertuples()}
    left = sorted({f"{r.model} {r.plan}" for r in screened.itertuples()
                   if (*(getattr(r, k) for k in keys), r.plan) not in timed})
    where = f"{int(steps['world_size'].iloc[0])} ranks {steps['backend'].iloc[0]}/{steps['device'].iloc[0]}"
    if "network" in steps.columns and str(steps["network"].iloc[0]).startswith("emulated"):
        where += f", {steps['network'].iloc[0]}"
    detail = where + (f"; left out by the screen: {', '.join(left)}" if left else "") + cfp_plans(search)
    return judge(spec, comparisons, steps, missing=f"no model ran both the cfp and {', '.join(ran)} plans",
                 detail=detail)
