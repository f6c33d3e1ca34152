"""Tables and figure of the spatial-parallelism family, as the reference's results chart.

spatial_throughput: per model setting and configuration (layer parallelism alone; square, vertical,
horizontal tiles, each ± halo-D2): ranks, images/s (the reference's Mean and Median, which include
the first step, and the steady rate without it), the speed-up over layer parallelism alone, halo
exchanges per step, and activation memory: the largest tile rank of the spatial stage against the
same stage unsplit (rank 0 of layer parallelism alone). spatial_check: every checked point's logits
and gradients against the unsplit model. spatial_images_per_s.png: images/s per configuration.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.reporting.claims import Claim, deciding, not_measured, ratio_interval, time_shared
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


FAMILY = "spatial"
TIMED = "no timed spatial rows: make spatial-throughput"
EXACT = "equal (the halo exchange makes tiles exact, MPI4DL)"
FEWER = "fewer exchanges (design 2 of the halo exchange)"
FASTER = "1.41x: 2.6 / 1.85 images/s, ResNet 1024², batch 1, 5 GPUs (MPI4DL README chart)"


def claims(frame: pd.DataFrame, reports: Path) -> list[Claim]:
    """Tiles compute what the unsplit model computes; halo-D2 exchanges less often; tiles speed it up."""
    agg = aggregates(newest(frame)).copy() if len(frame) else pd.DataFrame({"metric": []})
    if len(agg):
        agg = agg.assign(config=agg.apply(config, axis=1))
    timed = agg[agg["metric"] == "images_per_s_steady"]
    table = timed.pivot_table(index=["model", "config"], values="value") if len(timed) else pd.DataFrame()
    return [_equal(agg[agg["metric"].isin(["logits_max_rel_err", "grads_max_rel_err"])]), _halo_d2(agg),
            _speedup(table, agg)]


def _equal(checked: pd.DataFrame) -> Claim:
    statement = "spatial parallelism's logits and gradients equal the serial (unsplit) model's"
    ratio = "largest error relative to the largest value, logits and gradients, every checked slicing (fp64)"
    if checked.empty:
        return not_measured(FAMILY, statement, ratio, "no check rows: make spatial-check", paper=EXACT,
                            target="spatial-check")
    points = checked.drop_duplicates(["experiment", "point"])
    return Claim(FAMILY, statement, ratio, float(checked["value"].max()), at_most=1e-9, target="spatial-check",
                 paper=EXACT,
                 detail=f"{len(points)} point(s): {', '.join(sorted(set(points['model'])))}; "
                        f"{', '.join(sorted(set(points['slice_method'].astype(str))))} tiles, with and without halo-D2")


def _halo_d2(agg: pd.DataFrame) -> Claim:
    """Exchanges with halo-D2 against without, in pairs of points alike but for it (the checks' every
    slicing, and the chart's where it ran)."""
    statement = "halo-D2 makes fewer halo exchanges than a halo before every convolution"
    ratio = "largest, over models, settings and slicings, exchanges per step with halo-D2 / without"
    counted = agg[agg["metric"] == "halo_exchanges_per_step"]
    alike = [k for k in ("model", "image_size", "fused_layers") if k in counted.columns]
    counted = counted.assign(**{k: pd.to_numeric(counted[k], errors="coerce") for k in alike[1:]})
    table = counted.pivot_table(index=[*alike, "config"], values="value") if len(counted) else pd.DataFrame()
    pairs = {}
    for key, row in table.iterrows():
        *setting, name = key
        plain = name.removesuffix(" + halo-D2")
        if plain != name and (*setting, plain) in table.index:
            where = f"{setting[0]} {plain.removeprefix('spatial ')}" + "".join(
                f", {k} {v:g}" for k, v in zip(alike[1:], setting[1:], strict=True))
            pairs[where] = row["value"] / table.loc[(*setting, plain), "value"]
    if not pairs:
        return not_measured(FAMILY, statement, ratio, "no pair of points with and without halo-D2: make spatial-check",
                            paper=FEWER, target="spatial-check")
    worst = max(pairs, key=pairs.__getitem__)
    return Claim(FAMILY, statement, ratio, float(pairs[worst]), at_most=0.99, target="spatial-check",
                 paper=FEWER, detail=f"{len(pairs)} pair(s); highest: {worst}")


def _speedup(table: pd.DataFrame, agg: pd.DataFrame) -> Claim:
    statement = "spatial tiles are faster than layer parallelism alone"
    ratio = ("smallest, over models, layer parallelism's step time / the tiled configuration's the suite names for "
             "the claim (speedup_claim), both timed in turns; geometric means of the steps after the first")
    if table.empty:
        # Not timed: where the checks' ranks shared fewer cores, the timing would not judge it either.
        shared = time_shared(agg[agg["metric"] == "logits_max_rel_err"]) if len(agg) else ""
        return Claim(FAMILY, statement, ratio, None, at_least=1.0, target="spatial-throughput", paper=FASTER,
                     detail=f"not timed here: {shared}" if shared else TIMED, not_applicable=shared)
    # Steps after the first, of the timed points only: the checks (verify) run other sizes, one step each.
    # Numbers compared as numbers: a CSV column with gaps reads as float (0.0, not "0").
    first = (pd.to_numeric(agg["epoch"], errors="coerce") == 0) & (pd.to_numeric(agg["step"], errors="coerce") == 0)
    checks = agg["verify"].astype(str) == "True" if "verify" in agg.columns else False
    steps = agg[(agg["metric"] == "step_s") & ~first & ~checks]
    named = (steps["speedup_claim"].astype(str) == "True") if "speedup_claim" in steps.columns else (
        pd.Series(False, index=steps.index))
    cases = []
    for model in sorted(set(steps["model"])):
        mine = steps[steps["model"] == model]
        tiled = mine[named.loc[mine.index]]
        layer = mine[mine["config"] == "layer parallelism"]
        if tiled.empty or layer.empty:
            continue
        names = sorted(set(tiled["config"]))
        measured, interval = ratio_interval(layer["value"].to_numpy(float), tiled["value"].to_numpy(float))
        # Tiles win by running a stage on more devices at once: not on fewer cores than ranks.
        shared = time_shared(pd.concat([layer, tiled]))
        cases.append(Claim(FAMILY, statement, ratio, measured, at_least=1.0, target="spatial-throughput",
                           paper=FASTER, interval=interval, detail=f"{model}: {' / '.join(names)}, {measured:.2f}x",
                           not_applicable=shared))
    if not cases:
        return not_measured(FAMILY, statement, ratio, "no timed point names itself the claim's tiled configuration "
                            "(speedup_claim = true in the suite)", paper=FASTER, target="spatial-throughput")
    worst = deciding(cases)
    device = ", ".join(sorted(set(steps["device"].astype(str))))
    return replace(worst, detail="; ".join(c.detail for c in cases) + f" on {device}; deciding: {worst.detail}")
