"""Tables and figures of the param compute family: GEMM, EmbeddingBag and MLP throughput."""

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
    wide,
    write_table,
)

KERNELS = {
    "gemm": (["m", "n", "k"], ["time_p50_s", "tflops"], "GEMM: time per step (s) and TFLOP/s"),
    "emb": (["features", "dim", "nnz", "batch"], ["time_p50_s", "bandwidth"], "EmbeddingBag: time (s), GB/s"),
    "linear": (["layers", "input", "hidden", "output", "batch"], ["time_p50_s", "qps", "tflops"],
               "MLP: time per step (s), samples/s, TFLOP/s"),
}
SETTING = ["implementation", "dtype", "world_size", "device", "device_name"]
RATE = {"gemm": "tflops", "emb": "bandwidth", "linear": "tflops"}
NOTE = ("Both implementations time `steps` calls after `warmups` untimed ones; reproflow's rates and param's "
        "use the same formulas (GEMM 2MNK, EmbeddingBag batch·nnz·dim·4 bytes, MLP 6·batch·Σ l_i·l_(i+1)), "
        "computed here from each one's time per step (param prints them rounded).")


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """param_compute_<kernel> tables, a TFLOP/s-per-shape figure for GEMM, and the comparison of
    implementations when more than one measured."""
    rows = aggregates(newest(frame))
    written: list[Path] = []
    for kernel, sub in rows.groupby("kernel"):
        coords, metrics, title = KERNELS[str(kernel)]
        table = wide(sub, [*SETTING, *coords], metrics)
        written += write_table(table, out_dir, f"param_compute_{kernel}", title)
        if table["implementation"].nunique() > 1:
            keys = [c for c in SETTING if c != "implementation"] + coords
            written += compare_implementations(
                table, keys, RATE[str(kernel)], out_dir, f"param_compute_{kernel}_compare",
                f"{kernel}: {RATE[str(kernel)]} per implementation, same job, and reproflow's ratio", NOTE)[1]
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
                   label=f"{key[0]}: {key[1]}, {key[3]} ({key[4]})")
        ax.set_xticks([x + width * (len(settings) - 1) / 2 for x in range(len(labels))], labels, rotation=60,
                      fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_xlabel("M x N x K")
        ax.set_title("GEMM throughput per shape")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        written += save_figure(fig, out_dir, "param_compute_gemm_tflops")
    return written
