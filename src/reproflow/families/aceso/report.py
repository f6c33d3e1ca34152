"""Aceso's result scripts (get_e2e_performance, get_search_cost, get_perf_model_acc) and figures 7-9.

They read the reference's log layout under a log root (`small`: the small setting's root, `large` and
`scale`: the large one's):
  {root}/{megatron,aceso}/runtime/{model}/{size}/csv/*.csv   per-stage per-rank runtime CSVs
  {root}/aceso/search/{model}/{size}/                          search output: *summary* CSV, csv/info_*.csv
and print the reference's tables, write its CSVs (`e2e_thpt_{setting}_{model}.csv`, ...) and draw
the figures with the paper's published numbers (the artifact's `results/ref/` CSVs) beside.

Throughput = global batch / iteration time. A config's iteration time is the slowest of its ranks'
CSVs (the reference keeps the largest throughput over all files); the best config counts. Alpa is
not run: it needs JAX and Alpa's own runtime, which reproflow does not reimplement; its column is
'-' (0 in CSVs), as the reference prints for sizes Alpa did not run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reproflow.families.aceso.database import AFTER_TRAINING
from reproflow.families.aceso.manifest import BASELINE, newest_file, resolve_config
from reproflow.families.aceso.plans import read_config
from reproflow.families.aceso.settings import PUBLISHED_SMALL_THROUGHPUT
from reproflow.reporting.figures import save_figure
from reproflow.reporting.report import aggregates, newest, wide, write_table
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.family import AGGREGATE

MODELS = ("gpt", "t5", "resnet")
SIZE_ORDER = ("tiny", "350M", "770M", "250M", "500M", "1B", "1_3B", "2B", "2_6B", "3B", "4B", "6B", "6_7B", "6_8B",
              "11B", "13B", "22B")
ALPA_NOTE = "Alpa: not run (needs JAX and Alpa's runtime)"
PLAN_NAMES = {"aceso": "Aceso's config", "megatron": "the Megatron-LM plan"}
# The runtime's own timers: where an iteration's time goes on its slowest rank.
BREAKDOWN = ("forward-compute", "backward-compute", "forward-recv", "backward-recv", "grads-all-reduce", "optimizer")


def _sizes(folder: Path) -> list[str]:
    found = [p.name for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    order = {s: i for i, s in enumerate(SIZE_ORDER)}
    return sorted(found, key=lambda s: (order.get(s, len(order)), int("".join(c for c in s if c.isdigit()) or 0)))


def _read(path: Path) -> dict[str, str]:
    with path.open() as fh:
        rows = list(csv.reader(fh))
    return dict(zip(rows[0], rows[1], strict=True))


def runs(root: Path, runtime: str, model: str, size: str) -> dict[str, list[dict[str, str]]]:
    """Per config name, its ranks' CSV rows (with the stage number added)."""
    out: dict[str, list[dict[str, str]]] = {}
    for f in sorted((root / runtime / "runtime" / model / size / "csv").glob("*_stage*_rank*.csv")):
        name, _, rest = f.stem.rpartition("_stage")
        row = _read(f)
        row["stage"] = rest.split("_rank")[0]
        out.setdefault(name, []).append(row)
    return out


def chosen(root: Path, plan: str, model: str, size: str) -> str | None:
    """The config name a size's newest search stands for: its Aceso config (`plan` aceso), or its
    Megatron-LM baseline (the fastest measured where the baseline was measured, else the predicted);
    None without a search."""
    try:
        return resolve_config(root / "aceso" / "search" / model / size, plan).stem
    except (ParamError, ReproflowError):
        return None


def same_config(root: Path, model: str, size: str) -> bool:
    """Whether the size's Aceso config and its Megatron-LM baseline are one config (`chosen`)."""
    names = [chosen(root, plan, model, size) for plan in PLAN_NAMES]
    folder = root / "aceso" / "search" / model / size
    return None not in names and len({json.dumps(read_config(folder / f"{n}.json"), sort_keys=True)
                                      for n in names}) == 1


def screened(root: Path, model: str, size: str) -> pd.DataFrame:
    """The Megatron-LM plans and Aceso's configs the size's screen trained (baseline.json of its newest
    search): prediction, measurement, whether it fits, and which each side picks."""
    folder = root / "aceso" / "search" / model / size
    path, manifest = folder / BASELINE, _manifest(folder)
    if not path.is_file() or manifest is None:
        return pd.DataFrame()
    done = json.loads(path.read_text())
    if done.get("search") != (newest_file(folder, "search-*.json") or Path()).name:
        return pd.DataFrame()
    table = pd.DataFrame(done["plans"])
    picks = ((done["measured_best"], "baseline: fastest measured that fits"),
             (done.get("aceso_measured_best"), "Aceso: fastest measured that fits"),
             (done["predicted_best"], "baseline: predicted fastest"), (done["aceso"], "Aceso: predicted fastest"))
    table["chosen"] = ["; ".join(role for name, role in picks if name == n) for n in table["name"]]
    return table.assign(size=size, memory_limit=done["memory_limit"])


def best_run(root: Path, runtime: str, model: str, size: str) -> tuple[str, float, list[dict[str, str]]] | None:
    """(config name, samples/s, its rows) of the config the size's newest search stands for in this
    runtime column (`chosen`), or of the fastest trained where there is no search; None if not trained."""
    trained = runs(root, runtime, model, size)
    name = chosen(root, "aceso" if runtime == "aceso" else "megatron", model, size)
    best = None
    for config, rows in trained.items():
        thpt = float(rows[0]["global_batch_size"]) / (max(float(r["time"]) for r in rows) / 1000)
        if (config == name or (name is None and (best is None or thpt > best[1]))):
            best = (config, thpt, rows)
    return best


def _published(published: Path | None, name: str) -> pd.DataFrame | None:
    if published is None or not (published / name).is_file():
        return None
    table = pd.read_csv(published / name, index_col=0, skipinitialspace=True)
    table.columns = [c.strip() for c in table.columns]
    return table


def e2e(root: Path, setting: str, out: Path, published: Path | None) -> str:
    """End-to-end throughput per model and size (figure 7)."""
    models = ("scale-layer",) if setting == "scale" else MODELS
    lines, panels = [], []
    for model in models:
        sizes = sorted(set(_sizes(root / "aceso" / "runtime" / model)) | set(_sizes(root / "megatron" / "runtime" /
                                                                                    model)))
        if not sizes:
            continue
        rows = []
        for size in sizes:
            values = {rt: best_run(root, rt, model, size) for rt in ("megatron", "aceso")}
            # A runtime that did not run is absent (NaN: an empty cell, no bar), never a 0.
            rows.append({"size": size, "megatron": values["megatron"][1] if values["megatron"] else float("nan"),
                         "aceso": values["aceso"][1] if values["aceso"] else float("nan")})
        table = pd.DataFrame(rows)
        lines.append(f"-------- [{model}] End-to-end Throughput (Samples/s) --------")
        lines.append(f"{'Size':<10}{'Megatron-LM':>13}{'Aceso':>10}")
        for r in rows:
            cell = {k: (f"{r[k]:.2f}" if r[k] == r[k] else "-") for k in ("megatron", "aceso")}
            lines.append(f"{r['size']:<10}{cell['megatron']:>13}{cell['aceso']:>10}")
        for size in sizes:
            for column, what in (("megatron-mcore", "the Megatron-LM plan on megatron-core's layers"),
                                 ("megatron-lm", "Megatron-LM itself (pretrain_gpt.py) on the plan")):
                other = best_run(root, column, model, size)
                if other is not None:
                    lines.append(f"  {size}: {what}: {other[1]:.2f} samples/s")
        same = {size: same_config(root, model, size) for size in sizes}
        plans = pd.concat([screened(root, model, size) for size in sizes] or [pd.DataFrame()])
        for size, group in (plans.groupby("size", sort=False) if len(plans) else ()):
            lines.append(f"  {size}: every Megatron-LM plan and Aceso config trained once (one job, shuffled; ms per "
                         "iteration and "
                         f"peak MB per rank measured / predicted; limit {group['memory_limit'].iloc[0]:.0f} MB):")
            lines += [f"    {r.measured_ms:8.1f} / {r.predicted_ms or float('nan'):8.1f} ms  {r.measured_mb:6.1f} / "
                      f"{r.predicted_mb or float('nan'):6.1f} MB{'' if r.fits else ' over the limit'}  "
                      f"{r.describe or r.name}{f'  <- {r.chosen}' if r.chosen else ''}" for r in group.itertuples()]
        configs = _configs_side_by_side(root, model, sizes)
        for size, described in configs.items():
            lines += [f"  {size}: {PLAN_NAMES[plan]}: {text}" for plan, text in described.items()]
        for r in rows:
            if r["megatron"] > 0 and r["aceso"] > 0:
                ratio = r["aceso"] / r["megatron"]
                lines.append(f"  {r['size']}: Aceso / Megatron-LM = {ratio:.2f} on the same runtime" + (
                    " (Aceso's search returned the Megatron-LM plan itself: the same config, measured twice)"
                    if same[r["size"]] else ""))
        out.mkdir(parents=True, exist_ok=True)
        _write_wide(table.set_index("size")[["megatron", "aceso"]].T, out / f"e2e_thpt_{setting}_{model}.csv")
        _write_wide(pd.DataFrame({s: {"same_config": float(v)} for s, v in same.items()}),
                    out / f"e2e_same_config_{setting}_{model}.csv")
        if configs:
            pd.DataFrame(configs).to_csv(out / f"e2e_configs_{setting}_{model}.csv", index_label="plan")
        if len(plans):
            plans.to_csv(out / f"e2e_baseline_{setting}_{model}.csv", index=False, float_format="%.2f")
        norm = table.set_index("size")[["megatron", "aceso"]].T
        norm = norm.div(norm.loc["megatron"].where(norm.loc["megatron"] > 0), axis=1)
        _write_wide(norm, out / f"e2e_norm_thpt_{setting}_{model}.csv")
        ref = _published(published, "e2e_thpt_scale_scale-layer.csv" if setting == "scale"
                         else f"e2e_norm_thpt_large_{model}.csv")
        panels.append((model, norm if setting != "scale" else table.set_index("size")[["megatron", "aceso"]].T, ref))
    lines.append(ALPA_NOTE)
    if panels:
        _figure_bars(panels, out, f"fig7_e2e_{setting}", "throughput normalised to Megatron-LM" if setting != "scale"
                     else "samples/s")
    return "\n".join(lines)


def describe_config(path: Path) -> str:
    """A config JSON in a line: stages with their ops and GPUs, micro-batch, TP and DP sizes of the ops,
    recomputed ops."""
    d = json.loads(path.read_text())
    tp = sorted({t for stage in d["model_parallel_size_of_each_op"] for t in stage})
    dp = sorted({x for stage in d["data_parallel_size_of_each_op"] for x in stage})
    recomputed = [sum(stage) for stage in d["recompute_ops"]]
    return (f"{d['num_stages']} stage(s): {' + '.join(map(str, d['num_ops_in_each_stage']))} ops on "
            f"{' + '.join(map(str, d['num_gpus']))} GPUs, micro-batch {d['micro_batch_size']}, op tp "
            f"{'/'.join(map(str, tp))}, op dp {'/'.join(map(str, dp))}, recomputed ops "
            f"{' + '.join(map(str, recomputed)) if any(recomputed) else 'none'}")


def _configs_side_by_side(root: Path, model: str, sizes: list[str]) -> dict[str, dict[str, str]]:
    """Per size, the trained configs of Aceso and the Megatron-LM plan described (where their JSONs are)."""
    out: dict[str, dict[str, str]] = {}
    for size in sizes:
        for plan in PLAN_NAMES:
            best = best_run(root, plan, model, size)
            path = root / "aceso" / "search" / model / size / f"{best[0]}.json" if best else None
            if path is not None and path.is_file():
                out.setdefault(size, {})[plan] = describe_config(path)
    return out


def _write_wide(table: pd.DataFrame, path: Path) -> None:
    """The reference's CSV shape: a header of sizes, one row per system, 2 decimals; a value not
    measured is an empty cell."""
    with path.open("w") as fh:
        fh.write("size," + ",".join(str(c) for c in table.columns) + "\n")
        for name, row in table.iterrows():
            fh.write(f"{name}," + ",".join("" if pd.isna(v) else f"{float(v):.2f}" for v in row) + "\n")


def _figure_bars(panels: list[tuple[str, pd.DataFrame, pd.DataFrame | None]], out: Path, name: str,
                 ylabel: str) -> list[Path]:
    """One panel per model: reproduced bars, and the published ones (hatched) beside."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    colors = {"megatron": "#7f7f7f", "alpa": "#1f77b4", "aceso": "#d62728"}
    for ax, (model, mine, ref) in zip(axes[0], panels, strict=True):
        groups: list[tuple[str, pd.DataFrame, bool]] = [("reproduced", mine, False)]
        if ref is not None:
            groups.append(("published", ref, True))
        x, ticks, labels = 0.0, [], []
        for label, table, hatched in groups:
            for size in table.columns:
                for k, system in enumerate(("megatron", "alpa", "aceso")):
                    if system not in table.index:
                        continue
                    v = float(table.loc[system, size])
                    if pd.isna(v):
                        continue
                    ax.bar(x + k * 0.27, v, 0.27, color=colors[system], hatch="//" if hatched else None,
                           alpha=0.6 if hatched else 1.0, label=f"{system} ({label})" if size == table.columns[0]
                           else None)
                ticks.append(x + 0.27)
                labels.append(f"{size}\n{label}")
                x += 1.0
            x += 0.5
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_title(model)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6)
    fig.suptitle("Aceso end-to-end throughput (hatched: the paper's published numbers, 32 x V100)", fontsize=9)
    return save_figure(fig, out, name)


def _manifest(folder: Path, name: str = "search-*.json") -> dict | None:
    """The newest search manifest (or the artifact's scores, name="artifact.json") of one size."""
    found = newest_file(folder, name)
    return json.loads(found.read_text()) if found else None


def predicted(root: Path, setting: str, out: Path, published: Path | None) -> str:
    """The search step's result for every size (figure 7's shape from predictions): the predicted
    iteration of Aceso's best config and of the Megatron-LM plan, their throughput ratio beside the
    published measured one, the search wall time, and the artifact's own search scored the same way
    where it was given (reproduce --artifact-configs)."""
    models = ("scale-layer",) if setting == "scale" else MODELS
    lines, panels = [], []
    for model in models:
        rows = []
        for size in _sizes(root / "aceso" / "search" / model):
            folder = root / "aceso" / "search" / model / size
            m = _manifest(folder)
            if m is None or not m.get("best_ms") or not m.get("megatron_ms"):
                continue
            art = _manifest(folder, "artifact.json") or {}
            explored = sum(d.get("explored") or 0 for d in m.get("depths", []))
            rows.append({"size": size, "megatron_ms": m["megatron_ms"], "aceso_ms": m["best_ms"],
                         "artifact_ms": art.get("best_ms"), "search_s": m.get("search_s"),
                         "artifact_search_s": art.get("search_s"), "explored": explored or None})
        if not rows:
            continue
        table = pd.DataFrame(rows).set_index("size")
        table["aceso_over_megatron"] = table["megatron_ms"] / table["aceso_ms"]
        table["artifact_over_megatron"] = table["megatron_ms"] / table["artifact_ms"].astype(float)
        ref = _published(published, "e2e_thpt_scale_scale-layer.csv" if setting == "scale"
                         else f"e2e_norm_thpt_large_{model}.csv")
        if setting == "small":  # the artifact README's expected output, not a results/ref CSV
            mega, aceso = PUBLISHED_SMALL_THROUGHPUT[model]
            ref = pd.DataFrame({size: {"megatron": mega, "aceso": aceso} for size in table.index})
        if ref is not None:
            ref_ratio = ref.loc["aceso"] / ref.loc["megatron"]
            table["published_aceso_over_megatron"] = [float(ref_ratio[s]) if s in ref_ratio else float("nan")
                                                      for s in table.index]
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / f"predicted_{setting}_{model}.csv", float_format="%.2f")
        lines.append(f"-------- [{model}] Predicted iteration (s) and throughput over Megatron-LM --------")
        lines.append(f"{'Size':<12}{'Megatron-LM':>12}{'Aceso':>9}{'ratio':>7}{'published':>10}"
                     f"{'artifact':>10}{'ratio':>7}{'search s':>10}{'explored':>10}")
        for size, r in table.iterrows():
            pub = r.get("published_aceso_over_megatron", float("nan"))
            art = r["artifact_ms"]
            lines.append(
                f"{size:<12}{r['megatron_ms'] / 1000:>12.2f}{r['aceso_ms'] / 1000:>9.2f}"
                f"{r['aceso_over_megatron']:>7.2f}{'-' if pd.isna(pub) else f'{pub:.2f}':>10}"
                f"{'-' if pd.isna(art) else f'{float(art) / 1000:.2f}':>10}"
                f"{'-' if pd.isna(art) else f'{r.artifact_over_megatron:.2f}':>7}"
                f"{'-' if pd.isna(r['search_s']) else f'{r.search_s:.1f}':>10}"
                f"{'-' if pd.isna(r['explored']) else f'{int(r.explored)}':>10}")
        panels.append((model, table))
    if not panels:
        return ""
    where = {"small": "the artifact README's expected output, 1 x 4 GPUs", "large": "figure 7, up to 4 x 8 V100",
             "scale": "1 x 8 V100"}[setting]
    lines.append("ratio: predicted throughput of Aceso's config over the Megatron-LM plan's (both from the profiled "
                 f"database); published: the paper's measured ratio ({where}); artifact: the artifact's own search, "
                 "run on the same database and scored with the reference model")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    for ax, (model, table) in zip(axes[0], panels, strict=True):
        x = range(len(table))
        series = [("aceso_over_megatron", "reproflow's search (predicted)", "#d62728", None)]
        if "published_aceso_over_megatron" in table:
            series.append(("published_aceso_over_megatron", "published (measured)", "#ff9896", "//"))
        if table["artifact_ms"].notna().any():
            series.append(("artifact_over_megatron", "artifact's search (predicted)", "#9467bd", None))
        width = 0.8 / len(series)
        for k, (col, label, color, hatch) in enumerate(series):
            ax.bar([i + k * width for i in x], table[col].astype(float), width, color=color, hatch=hatch,
                   label=label)
        ax.axhline(1.0, color="#7f7f7f", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in x], list(table.index), fontsize=7)
        ax.set_title(model)
        ax.set_ylabel("throughput over Megatron-LM")
        ax.legend(fontsize=6)
    fig.suptitle(f"Aceso {setting}: searched configs over the Megatron-LM plan", fontsize=9)
    save_figure(fig, out, f"fig7_predicted_{setting}")
    return "\n".join(lines)


def _summary_seconds(folder: Path) -> float | None:
    found = newest_file(folder, "*summary*")
    return float(found.read_text().splitlines()[1].split(",")[0]) if found else None


def search_cost(root: Path, setting: str, out: Path, published: Path | None) -> str:
    """Search cost per model and size (figure 8)."""
    models = ("scale-layer",) if setting == "scale" else MODELS
    lines, panels = [], []
    for model in models:
        sizes = _sizes(root / "aceso" / "search" / model)  # the single-GPU size has no summary: it is not searched
        values = {s: _summary_seconds(root / "aceso" / "search" / model / s) for s in sizes}
        values = {s: v for s, v in values.items() if v is not None}
        if not values:
            continue
        lines.append(f"-------- [{model}] Search Cost (s) --------")
        lines.append(f"{'Size':<10}{'Aceso':>10}")
        lines += [f"{s:<10}{v:>10.2f}" for s, v in values.items()]
        table = pd.DataFrame({s: {"aceso": v} for s, v in values.items()})
        out.mkdir(parents=True, exist_ok=True)
        _write_wide(table, out / f"search_cost_{setting}_{model}.csv")
        ref = _published(published, "search_cost_scale_scale-layer.csv" if setting == "scale"
                         else f"search_cost_large_{model}.csv")
        panels.append((model, table, ref))
    lines.append(ALPA_NOTE)
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.4), squeeze=False)
        for ax, (model, mine, ref) in zip(axes[0], panels, strict=True):
            labels = [f"{s}\nreproduced" for s in mine.columns]
            values = list(mine.loc["aceso"])
            colors = ["#d62728"] * len(values)
            if ref is not None:
                for s in ref.columns:
                    for system, color in (("alpa", "#1f77b4"), ("aceso", "#ff9896")):
                        if float(ref.loc[system, s]) > 0:
                            labels.append(f"{s}\n{system} (pub.)")
                            values.append(float(ref.loc[system, s]))
                            colors.append(color)
            ax.bar(range(len(values)), values, color=colors)
            ax.set_xticks(range(len(values)), labels, fontsize=6, rotation=60)
            ax.set_yscale("log")
            ax.set_ylabel("search cost (s)")
            ax.set_title(model)
        fig.suptitle("Aceso search cost (pale: the paper's published numbers)", fontsize=9)
        save_figure(fig, out, f"fig8_search_cost_{setting}")
    return "\n".join(lines)


def _info(root: Path, model: str, size: str, config: str) -> list[dict[str, str]]:
    path = root / "aceso" / "search" / model / size / "csv" / f"info_{config}.csv"
    if not path.is_file():
        return []
    with path.open() as fh:
        return list(csv.DictReader(fh))


def op_times(root: Path, model: str, size: str, name: str, ranks: list[dict[str, str]]) -> pd.DataFrame:
    """Where a trained config's prediction misses, per stage, in milliseconds a micro-batch: each op
    kind's forward (its ops summed) as measured one op at a time in the instrumented iteration (a sync
    after each op; the slowest rank of each op) beside its predictions from the search's profile and
    from the one after training (`ops_<config>.csv`); and parts `forward (timed)` and `backward (timed)`,
    the timed iteration's own timers of a micro-batch beside the sums predicted (backward with the
    recomputed forwards). Empty where the config's ops were not predicted after training."""
    folder = root / "aceso" / "search" / model / size
    path = folder / "csv" / f"ops_{name}.csv"
    if not path.is_file() or not (folder / f"{name}.json").is_file():
        return pd.DataFrame()
    ops = pd.read_csv(path)
    measured: dict[int, float] = {}
    for row in ranks:
        for key, value in row.items():
            index = key.rpartition("#")[2]
            if "#" in key and index.isdigit():
                measured[int(index)] = max(measured.get(int(index), 0.0), float(value))
    ops["measured_us"] = ops["index"].map(measured)
    times = [c for c in ops.columns if c.endswith("_us")]
    ops[times] = ops[times] / 1000  # in ms from here on (the columns keep their names), as the timers
    config = read_config(folder / f"{name}.json")
    micro_batches = int(config["global_batch_size"]) // int(config["micro_batch_size"])
    rows = []
    for stage, part in ops.groupby("stage", sort=True):
        timers = [r for r in ranks if int(r["stage"]) == stage]
        rc = part["recompute"] == 1
        predicted = {label: (part[f"{label}_forward_us"].sum(), part[f"{label}_backward_us"].sum()
                             + part.loc[rc, f"{label}_forward_us"].sum()) for label in ("predicted", "after_training")}
        ms = ("measured_ms", "predicted_ms", "after_training_ms")
        for which, timer in enumerate(("forward", "backward")):
            timed = max((float(r.get(f"{timer}-compute", "nan")) for r in timers), default=float("nan"))
            rows.append({"stage": stage, "part": f"{timer} (timed)", "count": len(part),
                         **dict(zip(ms, (timed / micro_batches, predicted["predicted"][which],
                                         predicted["after_training"][which]), strict=True))})
        kinds = part.groupby("op", sort=False).agg(count=("index", "size"), measured_ms=("measured_us", "sum"),
                                                   predicted_ms=("predicted_forward_us", "sum"),
                                                   after_training_ms=("after_training_forward_us", "sum"))
        rows += [{"stage": stage, "part": op, **r} for op, r in kinds.to_dict("index").items()]
    return pd.DataFrame(rows).assign(config=name)


def _op_lines(size: str, plan: str, table: pd.DataFrame) -> list[str]:
    """A trained config's forward and backward per micro-batch against their predictions, and the op
    kinds furthest from theirs (`op_times`)."""
    lines = []
    for stage, part in table.groupby("stage", sort=True):
        timed = part.set_index("part")
        f, b = timed.loc["forward (timed)"], timed.loc["backward (timed)"]
        kinds = part[~part["part"].str.endswith("(timed)")]
        lines.append(f"  {size}: {PLAN_NAMES[plan]}, stage {stage}, ms a micro-batch: forward {f.measured_ms:.2f} "
                     f"timed, {kinds['measured_ms'].sum():.2f} op by op with a sync after each, "
                     f"{f.predicted_ms:.2f} predicted ({f.after_training_ms:.2f} from the ops profiled again); "
                     f"backward with its recomputation {b.measured_ms:.2f} timed, {b.predicted_ms:.2f} predicted "
                     f"({b.after_training_ms:.2f})")
        off = kinds.assign(gap=(kinds["measured_ms"] - kinds["predicted_ms"]).abs()).nlargest(3, "gap")
        lines.append("    forward op kinds furthest from their prediction (ms: op by op, predicted): " + "; ".join(
            f"{r.part} x{r.count} {r.measured_ms:.2f}, {r.predicted_ms:.2f}" for r in off.itertuples()))
    return lines


def perf_model_acc(root: Path, setting: str, out: Path, published: Path | None) -> str:
    """Actual vs predicted iteration time and memory of Aceso's best config (figure 9)."""
    lines, panels = [], []
    for model in MODELS:
        rows, ops = [], []
        for size in _sizes(root / "aceso" / "runtime" / model):
            best = best_run(root, "aceso", model, size)
            if best is None:
                continue
            name, _, ranks = best
            info = _info(root, model, size, name)
            if not info:
                continue
            actual_ms = max(float(r["time"]) for r in ranks)
            heaviest = max(ranks, key=lambda r: float(r["max_reserved"]))
            stage = info[int(heaviest["stage"])]
            slowest = max(ranks, key=lambda r: float(r["time"]))
            parts = {k: float(slowest.get(k, 0)) for k in BREAKDOWN}
            again = _info(root, model, size, name + AFTER_TRAINING)
            # Where the search returned the Megatron-LM plan itself, its training was profiled after it too.
            plan = best_run(root, "megatron", model, size)
            again_plan = _info(root, model, size, plan[0] + AFTER_TRAINING) if plan else []
            plan_info = _info(root, model, size, plan[0]) if plan else []
            same = same_config(root, model, size)
            for plan_name, (config_name, trained) in {"aceso": (name, ranks), "megatron": (plan[0], plan[2]) if plan
                                                     and not same else ("", [])}.items():
                ops.append(op_times(root, model, size, config_name, trained).assign(size=size, plan=plan_name)
                           if trained else pd.DataFrame())
            rows.append({"size": size, "same": same, "time_actual": actual_ms,
                         "time_predict": max(float(r["time"]) for r in info),
                         "time_megatron_actual": max(float(r["time"]) for r in plan[2]) if plan and plan_info
                         else float("nan"),
                         "time_megatron_predict": max(float(r["time"]) for r in plan_info) if plan_info
                         else float("nan"),
                         "time_predict_after_training": max(float(r["time"]) for r in again) if again
                         else float("nan"),
                         "time_predict_after_megatron_training": max(float(r["time"]) for r in again_plan)
                         if again_plan else float("nan"), "breakdown": parts,
                         "mem_actual": float(heaviest["max_reserved"]), "mem_total": float(stage["memory(total)"]),
                         "mem_normal": float(stage["memory(normal)"]), "mem_extra": float(stage["memory(reserved)"])})
        if not rows:
            continue
        lines.append(f"-------- [{model}] Time Prediction (ms) --------")
        lines.append(f"{'Size':<10}{'Actual':>10}{'Predict':>10}{'Error':>8}")
        for r in rows:
            err = abs(r["time_predict"] - r["time_actual"]) / r["time_actual"] * 100
            lines.append(f"{r['size']:<10}{r['time_actual']:>10.2f}{r['time_predict']:>10.2f}{err:>7.1f}%")
            again = r["time_predict_after_training"]
            if pd.notna(again):
                lines.append(f"  {r['size']}: from its ops profiled again right after training: {again:.2f} ms, "
                             f"{abs(again - r['time_actual']) / r['time_actual'] * 100:.1f}% off")
            after = r["time_predict_after_megatron_training"]
            actual, predict = r["time_megatron_actual"], r["time_megatron_predict"]
            if not r["same"] and pd.notna(predict):
                lines.append(f"  {r['size']}: the Megatron-LM plan: {actual:.2f} ms measured, {predict:.2f} predicted "
                             f"({abs(predict - actual) / actual * 100:.1f}% off)" + (
                                 f", {after:.2f} from its ops profiled again right after its training "
                                 f"({abs(after - actual) / actual * 100:.1f}% off)" if pd.notna(after) else ""))
            elif pd.notna(after):
                lines.append(f"  {r['size']}: the same config trained again as the Megatron-LM plan, predicted from "
                             f"its ops profiled right after that: {after:.2f} ms")
            lines.append(f"  {r['size']}: measured on the slowest rank (ms): " + ", ".join(
                f"{k} {v:.1f}" for k, v in r["breakdown"].items()))
            for table in ops:
                if not table.empty and table["size"].iloc[0] == r["size"]:
                    lines += _op_lines(r["size"], table["plan"].iloc[0], table)
        lines.append(f"-------- [{model}] Memory Prediction (MB) --------")
        lines.append(f"{'Size':<10}{'Actual':>10}{'Predict (normal + extra)':>34}{'Error':>8}{'vs normal':>10}")
        for r in rows:
            err = abs(r["mem_total"] - r["mem_actual"]) / r["mem_actual"] * 100
            normal = abs(r["mem_normal"] - r["mem_actual"]) / r["mem_actual"] * 100
            lines.append(f"{r['size']:<10}{r['mem_actual']:>10.0f}{r['mem_total']:>12.2f} ({r['mem_normal']:.2f} + "
                         f"{r['mem_extra']:.2f}){err:>7.1f}%{normal:>9.1f}%")
        table = pd.DataFrame(rows).set_index("size")
        out.mkdir(parents=True, exist_ok=True)
        times = table[["time_actual", "time_predict", "time_predict_after_training",
                       "time_predict_after_megatron_training", "time_megatron_actual",
                       "time_megatron_predict"]].dropna(axis=1, how="all")
        _write_wide(times.T.rename(index=lambda s: s.removeprefix("time_")),
                    out / f"perf_model_time_{setting}_{model}.csv")
        found = [t for t in ops if not t.empty]
        if found:
            columns = ["size", "plan", "config", "stage", "part", "count", "measured_ms", "predicted_ms",
                       "after_training_ms"]
            write_table(pd.concat(found)[columns].round(3), out, f"perf_model_ops_{setting}_{model}",
                        f"{model}: where the prediction misses, ms a micro-batch",
                        "`forward (timed)`, `backward (timed)`: the timed iteration's timers against the sums "
                        "predicted (backward with its recomputed forwards); an op kind: its forward measured one op "
                        "at a time, a sync after each, in one instrumented iteration.")
        _write_wide(table[["mem_actual", "mem_normal", "mem_extra"]].T.rename(
            index={"mem_actual": "actual", "mem_normal": "predict (norm)", "mem_extra": "predict (extra)"}),
            out / f"perf_model_mem_{setting}_{model}.csv")
        panels.append((model, table, _published(published, f"perf_model_time_large_{model}.csv"),
                       _published(published, f"perf_model_mem_large_{model}.csv")))
    if panels:
        fig, axes = plt.subplots(2, len(panels), figsize=(4.6 * len(panels), 6), squeeze=False)
        for col, (model, table, ref_t, ref_m) in enumerate(panels):
            for row, (what, actual, predict, ref) in enumerate((("time", "time_actual", "time_predict", ref_t),
                                                                ("memory", "mem_actual", "mem_total", ref_m))):
                ax = axes[row][col]
                ratios = [float(table.loc[s, predict]) / float(table.loc[s, actual]) for s in table.index]
                labels = [f"{s}\nreproduced" for s in table.index]
                if ref is not None:
                    for s in ref.columns:
                        pred = float(ref.loc["predict", s]) if what == "time" else float(
                            ref.loc["predict (norm)", s]) + float(ref.loc["predict (extra)", s])
                        ratios.append(pred / float(ref.loc["actual", s]))
                        labels.append(f"{s}\npublished")
                ax.bar(range(len(ratios)), ratios, color=["#d62728"] * len(table.index) + ["#ff9896"] *
                       (len(ratios) - len(table.index)))
                ax.axhline(1.0, color="black", lw=0.8)
                ax.set_xticks(range(len(ratios)), labels, fontsize=6, rotation=60)
                ax.set_ylabel(f"predicted / actual {what}")
                ax.set_title(f"{model}: {what}")
        fig.suptitle("Aceso performance-model accuracy (pale: the paper's published numbers)", fontsize=9)
        fig.tight_layout()
        save_figure(fig, out, f"fig9_perf_model_{setting}")
    return "\n".join(lines)


def build(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """`reproflow report`: the runtime's runs (one row per trained config) and a summary of the profiles."""
    written: list[Path] = []
    kinds = frame["kind"] if "kind" in frame.columns else pd.Series("ops", index=frame.index)
    train = frame[kinds == "train"]
    if not train.empty:
        table = wide(aggregates(newest(train[(train["rank"] == AGGREGATE) & train["iteration"].isna()])),
                     ["experiment", "plan", "config_name"], ["iteration_ms", "samples_per_s", "tflops_per_gpu"])
        losses = train[train["metric"] == "loss"].sort_values("iteration").groupby("config_name")["value"]
        table["loss_first"] = table["config_name"].map(losses.first())
        table["loss_last"] = table["config_name"].map(losses.last())
        written += write_table(table, out_dir, "aceso_train", "Aceso runtime: trained configs",
                               "TFLOP/s: model FLOPs (3 x forward matmul/conv FLOPs, recompute not counted) per rank.")
    rest = frame[kinds != "train"]
    if not rest.empty:
        table = wide(aggregates(newest(rest)), ["suite", "experiment", "point"], sorted(rest["metric"].unique()))
        written += write_table(table, out_dir, "aceso_summary", "aceso: profiles")
    small = _folded(out_dir)
    if len(small):
        written += write_table(small, out_dir, "aceso_small", "Aceso's small setting: both configs per model",
                               "The result scripts' per-model tables in one (their CSVs are under aceso/): "
                               "samples/s and normalised throughput of the Megatron-LM plan and Aceso's config, "
                               "same_config (1: the search returned the plan itself), both configs, iteration "
                               "time measured and predicted (ms; after_training: from the ops profiled again "
                               "right after that training), memory (MB) and search cost (s).")
    return written


# The result scripts' per-model tables of the small setting, folded into one by `build` (the page lists
# that one, not these).
_FOLD_PREFIX = {"e2e_thpt": "samples_per_s_", "e2e_norm_thpt": "normalised_", "e2e_same_config": "",
                "e2e_configs": "config_", "perf_model_time": "time_ms_", "perf_model_mem": "memory_mb_",
                "search_cost": "search_s_"}
FOLDED = tuple(f"{stem}_small_" for stem in _FOLD_PREFIX)


def _folded(reports: Path) -> pd.DataFrame:
    """One row per model and size of the small setting, the result scripts' tables side by side."""
    rows: dict[tuple[str, str], dict[str, object]] = {}
    for stem, prefix in _FOLD_PREFIX.items():
        for model, table in _small_tables(reports, stem).items():
            for size in table.columns:
                row = rows.setdefault((model, size), {"model": model, "size": size})
                row.update({f"{prefix}{name}": value for name, value in table[size].items()})
    return pd.DataFrame(list(rows.values()))


def _small_tables(reports: Path, stem: str) -> dict[str, pd.DataFrame]:
    """`<reports>/aceso/<stem>_small_<model>.csv` per model, as written by the result scripts."""
    found = {}
    for model in MODELS:
        path = reports / "aceso" / f"{stem}_small_{model}.csv"
        if path.is_file():
            found[model] = pd.read_csv(path, index_col=0)
    return found
