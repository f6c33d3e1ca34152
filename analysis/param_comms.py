"""Tables and figures of the param comms family: busBW against message size per collective."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.families.param_comms.sweep import bus_factor
from reproflow.reporting.claims import Claim, not_measured
from reproflow.reporting.figures import save_figure
from reproflow.reporting.report import (
    aggregates,
    compare_implementations,
    newest,
    setting_label,
    wide,
    write_table,
)
from reproflow.spec.params import readable_size

SETTING = ["implementation", "world_size", "backend", "device", "dtype", "blocking"]
METRICS = ["latency_p50_us", "latency_min_us", "latency_max_us", "time_us", "algbw", "busbw", "wrong_elements"]
DEFINITIONS = (
    "Definitions: every implementation divides the total buffer size by the time and multiplies by the "
    "nccl-tests factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, "
    "reduce 1). The time differs: param at the AWS recipe's commit (6236487) takes rank 0's own mean time, "
    "reproflow the p50 across ranks (as param does since August 2023), so with skewed ranks param's "
    "algBW follows rank 0. param's all_gather_base, reduce_scatter_base and all_to_allv call the same "
    "torch.distributed functions as reproflow's all_gather, reduce_scatter and all_to_all. nccl-tests "
    "(one process driving the node's GPUs) gives its mean time over iterations and GPUs (time_us), in "
    "place for all_reduce, broadcast and reduce as torch's calls, out of place for the others."
)


def _finish_busbw_axes(ax: plt.Axes, sizes: pd.Series, title: str) -> None:
    """Log2 size axis labelled 1K/1M/1G (at most ~10 ticks), busBW axis, title, grid, legend."""
    ax.set_xscale("log", base=2)
    ticks = sorted(sizes.unique())
    ticks = ticks[:: max(1, len(ticks) // 10 + (len(ticks) % 10 > 0))]
    ax.set_xticks(ticks, [readable_size(t) for t in ticks], rotation=45)
    ax.set_xlabel("message size (total buffer, bytes)")
    ax.set_ylabel("busBW (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """param_comms_table (every size), param_comms_busbw_<collective> figures, and the comparison of
    implementations when more than one measured."""
    rows = aggregates(newest(frame))
    table = wide(rows, ["collective", *SETTING, "size_bytes", "elements_per_rank"], METRICS)
    table = table.sort_values(["collective", *SETTING, "size_bytes"])
    written = write_table(table, out_dir, "param_comms_table",
                          "param comms: latency across ranks (us), algBW and busBW (GB/s) per size")
    peak = table.loc[table.groupby(["collective", *SETTING])["busbw"].idxmax()]
    written += write_table(peak[["collective", *SETTING, "size_bytes", "busbw", "algbw"]], out_dir,
                           "param_comms_peak", "param comms: highest busBW per collective and setting")
    for collective, sub in table.groupby("collective"):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for _, series in sub.groupby(SETTING):
            first = series.iloc[0]
            label = f"{first['implementation']}: {setting_label(first)}, {first['dtype']}" + (
                ", blocking" if first["blocking"] else "")
            ax.plot(series["size_bytes"], series["busbw"], marker="o", markersize=3, label=label)
        _finish_busbw_axes(ax, sub["size_bytes"], f"{collective}: bus bandwidth vs message size")
        written += save_figure(fig, out_dir, f"param_comms_busbw_{collective}")
    if table["implementation"].nunique() > 1:
        written += compare(table, out_dir)
    return written


def compare(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """busBW of every implementation per size, reproflow's ratio to each, and a figure per collective."""
    keys = ["collective", *[c for c in SETTING if c != "implementation"], "size_bytes"]
    wide_bw, written = compare_implementations(
        table, keys, "busbw", out_dir, "param_comms_compare",
        "busBW (GB/s) per implementation, same job, and reproflow's ratio", DEFINITIONS)
    others = [c for c in wide_bw.columns if c not in keys and "/" not in c and c != "reproflow"]
    for collective, sub in wide_bw.groupby("collective"):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for impl in ["reproflow", *others]:
            ax.plot(sub["size_bytes"], sub[impl], marker="o", markersize=3, label=impl)
        _finish_busbw_axes(ax, sub["size_bytes"], f"{collective}: reproflow vs {', '.join(others)} (same job)")
        written += save_figure(fig, out_dir, f"param_comms_compare_{collective}")
    return written


FAMILY = "param_comms"
RUN_IT = "make comms (reproflow run param-demo -e comms)"


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """What nccl-tests' PERFORMANCE.md says of its columns: busBW = algBW x the collective's factor in every
    row, and small messages are latency-bound (busBW grows with size). A plateau at large sizes is left out:
    it is the link's bandwidth on GPUs, which the document does not promise, and on CPUs the caches make
    busBW rise and fall with size from run to run."""
    shape = "nccl-tests doc/PERFORMANCE.md: small messages are latency-bound, busBW approaches the link's at large ones"
    statements = [("busBW / algBW equals the nccl-tests factor of each collective (2(n-1)/n, (n-1)/n or 1)",
                   "largest |(busBW/algBW) / factor - 1| over every row",
                   "0 by definition (nccl-tests doc/PERFORMANCE.md)"),
                  ("busBW grows with message size", "smallest, over collectives, busBW at the largest size / at "
                   "the smallest", shape)]
    rows = aggregates(newest(frame)) if len(frame) else frame
    if rows.empty:
        return [not_measured(FAMILY, s, r, f"no param comms rows: {RUN_IT}", paper=p, target="comms")
                for s, r, p in statements]
    table = wide(rows, ["collective", *SETTING, "size_bytes"], ["algbw", "busbw"]).dropna()
    table = table[table["algbw"] > 0]
    factor = [bus_factor(c, int(n)) for c, n in zip(table["collective"], table["world_size"], strict=True)]
    deviation = ((table["busbw"] / table["algbw"]) / factor - 1).abs()
    ranks = ", ".join(sorted({str(int(n)) for n in table["world_size"]}))
    statement, ratio, paper = statements[0]
    out = [Claim(FAMILY, statement, ratio, float(deviation.max()), at_most=1e-6, target="comms", paper=paper,
                 detail=f"{len(table)} rows, {table['collective'].nunique()} collectives, {ranks} ranks")]
    rises = {}
    for (collective, *_), sub in table[table["implementation"] == "reproflow"].groupby(["collective", *SETTING]):
        sub = sub.sort_values("size_bytes")
        if len(sub) >= 3:
            rises[collective] = min(rises.get(collective, float("inf")), sub["busbw"].iloc[-1] / sub["busbw"].iloc[0])
    statement, ratio, paper = statements[1]
    if not rises:
        return [*out, not_measured(FAMILY, statement, ratio, f"no size sweep of 3 or more sizes: {RUN_IT}",
                                   paper=paper, target="comms")]
    sizes = f"{readable_size(table['size_bytes'].min())}-{readable_size(table['size_bytes'].max())}"
    worst = min(rises, key=rises.__getitem__)
    below = [c for c, v in rises.items() if v < 2.0]
    out.append(Claim(FAMILY, statement, ratio, rises[worst], at_least=2.0, target="comms", paper=paper,
                     detail=f"{sizes}; lowest: {worst}" + (f"; below 2: {', '.join(below)}" if below
                                                           else f"; all {len(rises)} collectives")))
    return out
