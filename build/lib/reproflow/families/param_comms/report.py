"""Tables and figures of the param comms family: busBW against message size per collective."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

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
