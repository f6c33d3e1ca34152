"""Tables and figure of the CFP family.

cfp_analysis: per model, what the analysis found (operators, contractions, ParallelBlocks, segments,
unique segments) and the size of the space profiled against per-operator enumeration, with the
analysis and profiling times. cfp_search: per model and plan (CFP's, and the baselines run beside
it), the search time, the measured step time, TFLOP/s and memory, CFP's predicted step time, the
errors of the plan's loss and gradients against the unsharded model, and each plan's step time
relative to CFP's. cfp_step_time.png: step time per model and plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.families.cfp.choices import BASELINES, baseline_of
from reproflow.reporting.claims import Claim, deciding, not_measured, ratio_interval
from reproflow.reporting.figures import save_figure
from reproflow.reporting.report import aggregates, newest, over_baseline, wide, write_table

KEYS = ["model", "size", "num_layer", "batch_size", "world_size", "mesh", "backend", "device"]
ANALYSIS = ["operators", "contractions", "parallel_blocks", "segments", "unique_segments", "profiled_space",
            "operator_space", "analysis_time", "flop_count"]
SEARCH = ["tokens", "search_time", "lower_time", "predicted_time", "screen_time", "step_time", "tflops", "memory",
          "loss_error", "grad_error", "model_parallel_blocks", "tensor_parallel", "collectives", "collective_bytes",
          "modelled_communication", "traced_communication", "alpa_alpha", "alpa_bandwidth"]
NOTE = ("step_time: median of the timed steps (seconds, slowest rank), each a whole training step (forward, "
        "backward, gradient synchronisation, SGD update) of the plan on the job's ranks; the graph plans run "
        "lowered to one traced graph of local ops and collectives (lower_time: the trace, seconds), ddp, fsdp2, "
        "zero1-3 and deepspeed-megatron-tpN (Megatron-LM's tensor parallelism over N ranks with ZeRO-1 over the "
        "rest; tensor_parallel: N) on the module. screen_time: where the search screened, the median of every "
        "plan's first steps in turns; only CFP's plan and the fastest of each kind of baseline were then timed on"
        " (step_time of a plan left out: its screen steps). vs_cfp = step_time / CFP's step_time (above 1: CFP's "
        "plan is faster); vs_ddp = step_time / DDP's (the goal for data-parallel: at most 1.10). search_time: "
        "CFP's analysis + profiling + dynamic program; 0 for the fixed baselines. loss_error / grad_error: the "
        "plan against the unsharded model on one process (absolute / largest relative). strategy: each "
        "ParallelBlock's strategy in the seed's notation (0: split the batch, data parallelism); "
        "model_parallel_blocks: the blocks at another strategy. modelled_communication: the Alpa-style program's "
        "cost of its optimum and of the two uniform plans (seconds); traced_communication: the same three priced "
        "by the collectives their lowered steps run (the cheapest is the Alpa-style plan); collectives and "
        "collective_bytes (MB, their outputs): what each lowered graph runs a step; alpa_alpha (seconds a ring "
        "step) and alpa_bandwidth (GB/s) fitted to all-gathers measured on the job's link.")


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest aggregated rows; the 1-D mesh (an empty `mesh`, read as empty or missing) named so it
    groups and reads."""
    rows = aggregates(newest(frame))
    return rows.assign(mesh=rows["mesh"].fillna("").astype(str).replace("", "1-D")) if "mesh" in rows.columns else rows


def _with_strategies(table: pd.DataFrame, searched: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`table` with each block-strategy plan's strategies in the seed's notation (rows before them: none)."""
    blocks = searched[searched["metric"] == "model_parallel_blocks"]
    if blocks.empty or "strategy" not in blocks.columns:
        return table
    named = blocks[[*keys, "plan", "strategy"]].drop_duplicates([*keys, "plan"], keep="last")
    return table.merge(named, on=[*keys, "plan"], how="left")


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    rows = _rows(frame)
    keys = [k for k in KEYS if k in rows.columns]
    written: list[Path] = []
    analysed = rows[rows["mode"] == "analysis"]
    if not analysed.empty:
        table = wide(analysed, keys, ANALYSIS)
        profiled = rows[(rows["mode"] == "profile") & (rows["metric"] == "profile_time")]
        if not profiled.empty:
            table = table.merge(profiled.groupby(keys)["value"].median().rename("profile_time").reset_index(),
                                on=keys, how="left")
        written += write_table(table, out_dir, "cfp_analysis", "CFP analysis: ParallelBlocks and segments",
                               "profiled_space: strategy combinations of the unique segments CFP profiles; "
                               "operator_space: the same segments with every contraction chosen separately.")
    searched = rows[rows["mode"] == "search"]
    if searched.empty:
        return written
    table = _with_strategies(wide(searched, [*keys, "plan"], SEARCH), searched, keys)
    flat = [k for k in keys if k != "mesh"]  # DDP and the other module baselines run on the 1-D mesh only
    table["vs_cfp"] = over_baseline(table, keys, table["plan"] == "cfp", "step_time")
    ddp = (table["plan"] == "ddp") & ~table.duplicated([*flat, "plan"])  # one per model (1x4 and 4x1 are both 1-D)
    table["vs_ddp"] = over_baseline(table, flat, ddp, "step_time")
    written += write_table(table, out_dir, "cfp_search", "CFP search and plans run", NOTE)
    written += _fastest_table(table, searched, keys, out_dir)
    cfp = table[table["plan"] == "cfp"]
    if "mesh" in keys and cfp["mesh"].nunique() > 1:
        meshes = cfp[[*flat, "mesh", "predicted_time", "step_time"]].assign(
            vs_best=cfp["step_time"] / cfp.groupby(flat)["step_time"].transform("min"))
        written += write_table(meshes, out_dir, "cfp_mesh", "CFP's plan on each device mesh",
                               "CFP's searched plan per mesh shape (1xN and Nx1 are the 1-D mesh): predicted and "
                               "measured step time (s); vs_best = step_time / the fastest mesh's for the model.")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    label = table["model"] + (" " + table["mesh"].where(table["mesh"] != "1-D", "") if "mesh" in keys else "")
    pivot = table.assign(case=label.str.strip()).pivot_table(index="case", columns="plan", values="step_time")
    pivot.plot.bar(ax=ax, rot=0)
    ax.legend(title="plan", bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"CFP's plan and baselines, {int(table['world_size'].iloc[0])} ranks, "
                 f"{table['backend'].iloc[0]}/{table['device'].iloc[0]}")
    written += save_figure(fig, out_dir, "cfp_step_time")
    return written


def _fastest_table(table: pd.DataFrame, searched: pd.DataFrame, keys: list[str], out_dir: Path) -> list[Path]:
    """cfp_fastest: per model and batch, CFP's plan and its step time, every baseline's, the fastest
    baseline and CFP's speed-up over it with its interval (what the first claim reads)."""
    same = _same_as_cfp(searched, keys)
    pairs = _pairs(_samples(searched), EVERY, True, same)
    if not pairs:
        return []
    steps = table.pivot_table(index=keys, columns="plan", values="step_time").reset_index()
    fastest = pd.DataFrame([{**at, "cfp_is": ", ".join(sorted(same.get(tuple(at[k] for k in keys), ()))),
                             "fastest": plan, "vs_fastest": r, "low": (iv or (r, r))[0], "high": (iv or (r, r))[1]}
                            for at, plan, r, iv in pairs])
    cfp = table.loc[table["plan"] == "cfp", [*keys, *(c for c in ("tokens", "strategy") if c in table.columns)]]
    out = cfp.merge(steps, on=keys).merge(fastest, on=keys)
    out = out.rename(columns={"strategy": "cfp_plan"})
    return write_table(out, out_dir, "cfp_fastest", "CFP's plan against the fastest baseline",
                       "tokens: per step (batch x sequence); cfp_plan: CFP's strategy per ParallelBlock in the seed's "
                       "notation; one column per plan: its step time (s, median); cfp_is: the baselines whose "
                       "strategies CFP's plan is; fastest: of the others, the baseline whose timed steps have the "
                       "lowest geometric mean; vs_fastest: its step time over CFP's (above 1: "
                       "CFP faster) with its interval at the claims' level (low, high).")


# What the paper reports against each baseline (arXiv 2504.00598's abstract; its figures against
# PyTorch and DeepSpeed-Megatron are not in the sources this project has). The first claim takes, model
# by model, the fastest of every baseline that ran (named in the claim); the others one family each.
EVERY = BASELINES
VERSUS = (
    ("the fastest baseline", EVERY, "the fastest baseline's",
     "a searched plan is meant to be at least the best fixed one; the paper's figures against PyTorch and "
     "DeepSpeed-Megatron are not in the available sources"),
    ("the Alpa-style plan", ("alpa",), "Alpa-style",
     "up to 1.51x (GPT), 1.31x (LLaMA), 3.43x (MoE) over Alpa (arXiv 2504.00598)"),
    ("PyTorch (DDP and FSDP2)", ("ddp", "fsdp2"), "PyTorch's",
     "compared with PyTorch in the paper; its figures are not in the available sources"),
    ("DeepSpeed (ZeRO stages 1-3 and DeepSpeed-Megatron)", ("zero1", "zero2", "zero3", "deepspeed-megatron"),
     "DeepSpeed's", "compared with DeepSpeed-Megatron in the paper; its figures are not in the available sources"),
)


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """CFP's searched plan is at least as fast as the fastest baseline measured, model by model; and as the
    Alpa-style per-contraction plan, as PyTorch's DDP and FSDP2, and as DeepSpeed's ZeRO stages, baseline
    by baseline: each case's step times (every timed step where the rows hold them, else the median) as
    an interval."""
    rows = _rows(frame) if len(frame) else frame
    search = rows[rows["mode"] == "search"] if len(rows) else rows
    return [_versus(search, *v) for v in VERSUS]


def _versus(search: pd.DataFrame, name: str, plans: tuple[str, ...], short: str, paper: str) -> Claim:
    """The claim that CFP's plan is at least as fast as each of `plans`, decided by the worst case."""
    every = plans == EVERY
    statement = f"CFP's plan is at least as fast as {name}"
    over = "over models" if every or len(plans) == 1 else "over models and plans"
    ratio = (f"smallest, {over}, {short} step time / CFP step time (geometric means of the steps timed in "
             "turns; " + ("the fastest: the lowest geometric mean of the baselines timed, CFP's plan itself left out)"
                          if every else
                          "where a screen ran, the fastest of the kind)"))
    steps = search[search["metric"] == "step_time"] if len(search) else search
    if steps.empty:
        return not_measured("cfp", statement, ratio, "no search rows: make cfp-search", paper=paper,
                            target="cfp-search")
    ran = [p for p in dict.fromkeys(steps["plan"]) if baseline_of(p) in plans]
    if "cfp" not in set(steps["plan"]) or not ran:
        return not_measured("cfp", statement, ratio, f"the search ran without the {', '.join(plans)} baseline(s)",
                            paper=paper, target="cfp-search")
    samples = _samples(search)
    keys = [k for k in KEYS if k in samples.columns]
    cases = []
    same = _same_as_cfp(search, keys)
    batches = samples["batch_size"].nunique() > 1

    def place(at: Mapping[str, Any]) -> str:
        """A case's model (mesh and batch where the rows have several; a batch read back from CSV is a float)."""
        return (f"{at['model']}" + (f" {at['mesh']}" if at.get("mesh", "1-D") != "1-D" else "")
                + (f" batch {int(float(at['batch_size']))}" if batches else ""))

    for key, itself in same.items():  # the Alpa-style plan may be CFP's: that case compared nothing
        for plan in sorted(p for p in itself if not every and baseline_of(p) in plans):
            at = dict(zip(keys, key, strict=True))
            cases.append(Claim("cfp", statement, ratio, 1.0, at_least=1.0, paper=paper, target="cfp-search",
                               same_on_both_sides=f"{plan}'s plan is CFP's",
                               detail=f"{place(at)} {plan}: CFP's plan itself (not compared)"))
    for at, plan, measured, interval in _pairs(samples, plans, every, same):
        where = place(at)
        itself = sorted(same.get(tuple(at[k] for k in keys), set()))
        label = where if len(plans) == 1 else f"{where} {plan}" + (" (the fastest" + (
            f"; {' and '.join(itself)}: CFP's plan itself" if itself else "") + ")" if every else "")
        span = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
        cases.append(Claim("cfp", statement, ratio, measured, at_least=1.0, paper=paper, target="cfp-search",
                           interval=interval, detail=f"{label} {measured:.2f}x{span}"))
    if not cases:
        return not_measured("cfp", statement, ratio, f"no model ran both the cfp and {', '.join(ran)} plans",
                            paper=paper, target="cfp-search")
    left = search[(search["metric"] == "screen_time") & search["plan"].isin(ran)]
    left = left[~left.set_index([*keys, "plan"]).index.isin(samples.set_index([*keys, "plan"]).index)]
    names = ", ".join(f"{r.model} {r.plan}" for r in left.itertuples()
                      if r.plan not in same.get(tuple(getattr(r, k) for k in keys), set()))
    out = f"; left out by the screen: {names}" if names else ""
    where = f"{int(steps['world_size'].iloc[0])} ranks {steps['backend'].iloc[0]}/{steps['device'].iloc[0]}"
    if "network" in steps.columns and str(steps["network"].iloc[0]).startswith("emulated"):
        where += f", {steps['network'].iloc[0]}"
    return deciding(cases, ", ".join(c.detail for c in cases) + f"; {where}{out}{_cfp_plans(search)}")


def _samples(search: pd.DataFrame) -> pd.DataFrame:
    """Every timed step of every plan (the medians where the rows predate per-step samples)."""
    samples = search[search["metric"] == "step_s"]
    return samples if not samples.empty else search[search["metric"] == "step_time"]


def _same_as_cfp(search: pd.DataFrame, keys: list[str]) -> dict[tuple, set[str]]:
    """Per case, the baselines whose block strategies are CFP's plan's own (the search returned them)."""
    blocks = search[search["metric"] == "model_parallel_blocks"] if len(search) else search
    if blocks.empty or "strategy" not in blocks.columns:
        return {}
    out: dict[tuple, set[str]] = {}
    for key, sub in blocks.groupby(keys, sort=False):
        mine = set(sub.loc[sub["plan"] == "cfp", "strategy"].astype(str))
        out[key] = {p for p, st in zip(sub["plan"], sub["strategy"].astype(str), strict=True)
                    if p != "cfp" and st in mine}
    return out


def _pairs(samples: pd.DataFrame, plans: tuple[str, ...], fastest: bool, same: dict[tuple, set[str]] | None = None
           ) -> list[tuple[dict, str, float, tuple[float, float] | None]]:
    """(the case's keys, a baseline, its step time over CFP's, the interval) for each case (model, size,
    batch, mesh) and each plan of the baselines `plans` timed in it; with `fastest`, only the baseline whose
    steps have the lowest geometric mean (the same samples pick it and judge it: a bias toward the baseline) among
    those that are not CFP's plan itself (`same`: a plan against itself compares nothing)."""
    keys = [k for k in KEYS if k in samples.columns]
    out = []
    for key, sub in samples.groupby(keys, sort=False):
        cfp = sub.loc[sub["plan"] == "cfp", "value"].to_numpy(float)
        timed = [p for p in dict.fromkeys(sub["plan"])
                 if baseline_of(p) in plans and p not in (same or {}).get(key, set())]
        if fastest and timed:
            timed = [min(timed, key=lambda p: np.log(sub.loc[sub["plan"] == p, "value"].to_numpy(float)).mean())]
        for plan in timed:
            if len(cfp):
                measured, interval = ratio_interval(sub.loc[sub["plan"] == plan, "value"].to_numpy(float), cfp)
                out.append((dict(zip(keys, key, strict=True)), plan, measured, interval))
    return out


def _cfp_plans(search: pd.DataFrame) -> str:
    """'; CFP's plans: gpt [1, 1, 0] (2 blocks not data-parallel), ...' where the rows name them."""
    blocks = search[(search["metric"] == "model_parallel_blocks") & (search["plan"] == "cfp")]
    if blocks.empty or "strategy" not in blocks.columns:
        return ""
    return "; CFP's plans: " + ", ".join(
        f"{r.model} {r.strategy} ({int(r.value)} blocks not data-parallel)" for r in blocks.itertuples())
