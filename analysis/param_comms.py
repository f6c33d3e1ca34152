"""Tables and figures of the param comms family: busBW against message size per collective."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.report import aggregates, newest, save_figure, setting_label, wide, write_table

SETTING = ["world_size", "backend", "device", "dtype", "blocking"]
METRICS = ["latency_p50_us", "latency_min_us", "latency_max_us", "algbw", "busbw", "wrong_elements"]


def _size_label(nbytes: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """param_comms_table (every size) and param_comms_busbw_<collective> figures."""
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
            label = f"{setting_label(first)}, {first['dtype']}" + (", blocking" if first["blocking"] else "")
            ax.plot(series["size_bytes"], series["busbw"], marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ticks = sorted(sub["size_bytes"].unique())[::2]
        ax.set_xticks(ticks, [_size_label(t) for t in ticks], rotation=45)
        ax.set_xlabel("message size (total buffer, bytes)")
        ax.set_ylabel("busBW (GB/s)")
        ax.set_title(f"{collective}: bus bandwidth vs message size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        written += save_figure(fig, out_dir, f"param_comms_busbw_{collective}")
    return written
