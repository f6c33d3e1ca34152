"""Tables and figure of the spatial-parallelism family, as the reference's results chart.

spatial_throughput: per model setting and configuration (layer parallelism alone; square, vertical,
horizontal tiles, each ± halo-D2): ranks, images/s (the reference's Mean and Median, which include
the first step, and the steady rate without it), the speed-up over layer parallelism alone, halo
exchanges per step, and activation memory: the largest tile rank of the spatial stage against the
same stage unsplit (rank 0 of layer parallelism alone). spatial_check: every checked point's logits
and gradients against the unsplit model. spatial_images_per_s.png: images/s per configuration.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.reporting.figures import save_figure
from reproflow.reporting.report import aggregates, newest, over_baseline, wide, write_table

SETTING = ["model", "image_size", "batch_size", "enable_evaluation", "precision", "num_filters", "num_layers",
           "split_size", "device"]
METRICS = ["images_per_s_mean", "images_per_s_median", "images_per_s_steady", "halo_exchanges_per_step"]
NOTE = ("images_per_s_mean / _median: batch / step time over every step, the first included, as the reference "
        "prints them; _steady leaves the first step out; speedup = steady rate / layer parallelism's. "
        "halo_exchanges_per_step: forward exchanges that sent messages (the backward mirrors them). Step time: "
        "the slowest rank's, forward + backward + gradient sums + update (training) or forward (inference). "
        "activation MiB: bytes kept for backward by the rank's partition (training), or the largest input + "
        "output of a layer (inference), measured on CPUs; peak allocator bytes on GPUs. tile / unsplit: the "
        "largest tile rank of the spatial stage over rank 0 of layer parallelism alone (the same layers unsplit).")


def config(row: pd.Series) -> str:
    """The reference chart's name of a configuration."""
    if int(row["spatial_size"]) == 0:
        return "layer parallelism"
    return f"spatial {row['slice_method']}" + (" + halo-D2" if str(row["halo_d2"]) == "True" else "")


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    rows = newest(frame)
    written: list[Path] = []
    setting = [k for k in SETTING if k in rows.columns]
    agg = aggregates(rows).copy()
    agg["config"] = agg.apply(config, axis=1)
    checked = agg[agg["metric"].isin(["logits_max_rel_err", "grads_max_rel_err"])]
    if not checked.empty:
        table = wide(checked, [*setting, "config", "fused_layers", "comm_backend"],
                     ["logits_max_rel_err", "grads_max_rel_err"])
        written += write_table(table, out_dir, "spatial_check", "Spatial parallelism against the unsplit model",
                               "Largest error relative to the largest value, one step in fp64, logits and "
                               "every parameter's gradient (checked on rank 0 against the whole model).")
    timed = agg[agg["metric"].isin(METRICS)]
    if timed.empty:
        return written
    keys = [*setting, "config", "world_size"]
    table = wide(timed, keys, METRICS)
    if "images_per_s_steady" not in table.columns:  # only one-step points (the checks): no steady rate to show
        return written
    memory = rows[(rows["rank"].astype(str) != "all") & (rows["metric"].isin(["activation_bytes",
                                                                               "peak_memory_bytes"]))].copy()
    if not memory.empty:
        memory["config"] = memory.apply(config, axis=1)
        memory = memory[memory["stage"].astype(float) == 0]
        first = memory.groupby(keys)["value"].max().rename("stage0_activation_MiB") / 2**20
        table = table.merge(first.reset_index(), on=keys, how="left")
    group = list(setting)
    is_lp = table["config"] == "layer parallelism"
    if is_lp.any():  # settings without layer parallelism alone (the correctness checks) have nothing to compare
        table = table[table[group].merge(table.loc[is_lp, group].drop_duplicates(), how="left",
                                         indicator=True)["_merge"].eq("both").to_numpy()].copy()
        is_lp = table["config"] == "layer parallelism"
    table["speedup"] = over_baseline(table, group, is_lp, "images_per_s_steady")
    if "stage0_activation_MiB" in table.columns:
        table["tile_over_unsplit"] = over_baseline(table, group, is_lp, "stage0_activation_MiB")
    order = ["layer parallelism", *[f"spatial {s}{d}" for s in ("square", "vertical", "horizontal")
                                    for d in ("", " + halo-D2")]]
    table["_order"] = table["config"].map({c: i for i, c in enumerate(order)})
    table = table.sort_values([*group, "_order"]).drop(columns="_order")
    written += write_table(table, out_dir, "spatial_throughput", "Spatial parallelism: images/s and memory", NOTE)
    settings = table.groupby(group, dropna=False)
    fig, axes = plt.subplots(1, settings.ngroups, figsize=(4.2 * settings.ngroups, 3.6), squeeze=False)
    for ax, (values, part) in zip(axes[0], settings, strict=True):
        labels = dict(zip(group, values, strict=True))
        colors = ["#777777" if c == "layer parallelism" else ("#d98c1f" if "D2" in c else "#2a6fb0")
                  for c in part["config"]]
        ax.bar(range(len(part)), part["images_per_s_steady"], color=colors)
        ax.set_xticks(range(len(part)), [c.replace("spatial ", "").replace("halo-", "") for c in part["config"]],
                      fontsize=7, rotation=35, ha="right")
        mode = "inference" if str(labels.get("enable_evaluation")) == "True" else "training"
        ax.set_title(f"{labels['model']} {labels['image_size']}², batch {labels['batch_size']}, {mode}", fontsize=9)
        ax.set_ylabel("images/s")
    fig.suptitle(f"Layer parallelism vs spatial tiles ({table['device'].iloc[0]})", fontsize=10)
    written += save_figure(fig, out_dir, "spatial_images_per_s")
    return written
