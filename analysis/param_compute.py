"""Tables and figures of the param compute family: GEMM, EmbeddingBag and MLP throughput."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.report import aggregates, newest, save_figure, wide, write_table

KERNELS = {
    "gemm": (["m", "n", "k"], ["time_p50_s", "tflops"], "GEMM: time per step (s) and TFLOP/s"),
    "emb": (["features", "dim", "nnz", "batch"], ["time_p50_s", "bandwidth"], "EmbeddingBag: time (s), GB/s"),
    "linear": (["layers", "input", "hidden", "output", "batch"], ["time_p50_s", "qps", "tflops"],
               "MLP: time per step (s), samples/s, TFLOP/s"),
}
SETTING = ["dtype", "world_size", "device", "device_name"]


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """param_compute_<kernel> tables, and a TFLOP/s-per-shape figure for GEMM."""
    rows = aggregates(newest(frame))
    written: list[Path] = []
    for kernel, sub in rows.groupby("kernel"):
        coords, metrics, title = KERNELS[str(kernel)]
        table = wide(sub, [*SETTING, *coords], metrics)
        written += write_table(table, out_dir, f"param_compute_{kernel}", title)
        if kernel != "gemm":
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.0))
        shapes = table[coords].drop_duplicates().astype(int)
        labels = [f"{m}x{n}x{k}" for m, n, k in shapes.itertuples(index=False)]
        settings = list(table.groupby(SETTING))
        width = 0.8 / max(1, len(settings))
        for i, (key, series) in enumerate(settings):
            merged = shapes.merge(series, on=coords, how="left")
            ax.bar([x + i * width for x in range(len(labels))], merged["tflops"], width=width,
                   label=f"{key[0]}, {key[2]} ({key[3]})")
        ax.set_xticks([x + width * (len(settings) - 1) / 2 for x in range(len(labels))], labels, rotation=60,
                      fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_xlabel("M x N x K")
        ax.set_title("GEMM throughput per shape")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        written += save_figure(fig, out_dir, "param_compute_gemm_tflops")
    return written
