"""Tables and figure of the CFP family.

cfp_analysis: per model, what the analysis found (operators, contractions, ParallelBlocks, segments,
unique segments) and the size of the space profiled against per-operator enumeration, with the
analysis and profiling times. cfp_search: per model and plan (CFP's, and the baselines run beside
it), the search time, the measured step time, TFLOP/s and memory, CFP's predicted step time, the
errors of the plan's loss and gradients against the unsharded model, and each plan's step time
relative to CFP's. cfp_step_time.png: step time per model and plan.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.families.cfp.choices import BASELINES, baseline_of
from reproflow.reporting.figures import save_figure
from reproflow.reporting.intervals import ratio_interval
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


def search_rows(frame: pd.DataFrame) -> pd.DataFrame:
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
    rows = search_rows(frame)
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
    written += _versus_table(table, searched, keys, out_dir)
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


def _versus_table(table: pd.DataFrame, searched: pd.DataFrame, keys: list[str], out_dir: Path) -> list[Path]:
    """cfp_versus: per case and every baseline timed, its step time over CFP's with the interval (what
    the claims judge)."""
    found = versus(searched, BASELINES)
    if not found:
        return []
    same = same_as_cfp(searched, keys)
    rows = []
    for at, plan, cfp, other in found:
        r, iv = ratio_interval(other, cfp)
        rows.append({**at, "cfp_is": ", ".join(sorted(same.get(tuple(at[k] for k in keys), ()))), "baseline": plan,
                     "vs_cfp": r, "low": (iv or (r, r))[0], "high": (iv or (r, r))[1]})
    cfp = table.loc[table["plan"] == "cfp", [*keys, *(c for c in ("tokens", "strategy") if c in table.columns)]]
    out = cfp.merge(pd.DataFrame(rows), on=keys).rename(columns={"strategy": "cfp_plan"})
    return write_table(out, out_dir, "cfp_versus", "CFP's plan against every baseline timed",
                       "tokens: per step (batch x sequence); cfp_plan: CFP's strategy per ParallelBlock in the seed's "
                       "notation; cfp_is: the baselines whose strategies CFP's plan is (not compared); baseline: each "
                       "baseline timed (where a screen ran, the fastest of its kind on the screen's steps); vs_cfp: "
                       "its step time over CFP's, geometric means of the steps timed in turns (above 1: CFP faster), "
                       "with its interval at the claims' level (low, high).")


def versus(search: pd.DataFrame, plans: tuple[str, ...]) -> list[tuple[dict, str, np.ndarray, np.ndarray]]:
    """(the case's keys, a baseline, CFP's timed steps, the baseline's) for each case (model, size, batch,
    mesh) and each plan of the baselines `plans` timed in it, but those that are CFP's plan itself (a
    plan against itself compares nothing)."""
    samples = _samples(search)
    keys = [k for k in KEYS if k in samples.columns]
    same = same_as_cfp(search, keys)
    out = []
    for key, sub in samples.groupby(keys, sort=False):
        cfp = sub.loc[sub["plan"] == "cfp", "value"].to_numpy(float)
        for plan in dict.fromkeys(sub["plan"]):
            if len(cfp) and baseline_of(plan) in plans and plan not in same.get(key, set()):
                out.append((dict(zip(keys, key, strict=True)), plan, cfp,
                            sub.loc[sub["plan"] == plan, "value"].to_numpy(float)))
    return out


def _samples(search: pd.DataFrame) -> pd.DataFrame:
    """Every timed step of every plan (the medians where the rows predate per-step samples)."""
    samples = search[search["metric"] == "step_s"]
    return samples if not samples.empty else search[search["metric"] == "step_time"]


def same_as_cfp(search: pd.DataFrame, keys: list[str]) -> dict[tuple, set[str]]:
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


def cfp_plans(search: pd.DataFrame) -> str:
    """'; CFP's plans: gpt [1, 1, 0] (2 blocks not data-parallel), ...' where the rows name them."""
    blocks = search[(search["metric"] == "model_parallel_blocks") & (search["plan"] == "cfp")]
    if blocks.empty or "strategy" not in blocks.columns:
        return ""
    return "; CFP's plans: " + ", ".join(
        f"{r.model} {r.strategy} ({int(r.value)} blocks not data-parallel)" for r in blocks.itertuples())
