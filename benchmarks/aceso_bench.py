"""`make bench`: Aceso search cost and result.

1. On the reference's miniset database (../shared): GPT-1.3B, T5-770M and Wide-ResNet-1B on 1 node x
   4 GPUs, the artifact's small setting (`aceso reproduce small --sizes reference`), with the search's
   default budget in explored cases (and seconds per depth where --budgets gives them). Records the
   search's wall time and explored cases, the predicted throughput of its config and of the
   Megatron-LM plan the artifact's scripts set: <out>/aceso_search.csv.
2. Search cost against depth, as the reference's figure 9: GPT scale-layer with 8 ... 1024 layers
   on 1 node x 8 GPUs (batch 1024, 28000 MB), on a database this machine's profiler produced
   (`workflows/aceso-profile-scale.toml`, profiled first if missing; TP up to 2):
   <out>/aceso_scale_search.csv and .png, beside the reference's published search times.
3. The cost of one evaluated config at depth: one pipeline depth of the artifact's own 1024-layer
   scale-layer database (../shared, eurosys), 2, 4 and 8 stages, the reference model, a fixed
   budget: configs explored, ms per config and the best found: <out>/aceso_depth_cost.csv.
4. The budget in cases makes a search a function of its database: GPT-13B on the artifact's eurosys
   database (its large setting, 4 x 8 GPUs), searched on every core and then on one core alone:
   config, predicted iteration, explored cases, wall time: <out>/aceso_budget.csv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from stamp import stamp

from reproflow.app.cli import main as reproflow
from reproflow.families.aceso.costmodel import CostModel
from reproflow.families.aceso.database import read_database, write_from_rows
from reproflow.families.aceso.models import model
from reproflow.families.aceso.plans import best_feasible, megatron_plans
from reproflow.families.aceso.search import DepthSearch, Options, budget_text, search
from reproflow.families.aceso.settings import CASES, SETTINGS
from reproflow.reporting.report import load_results, to_markdown

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-data" / "aceso"
MINISET = SHARED / "profiled-time-miniset"
EUROSYS = SHARED / "profiled-time-eurosys"
PUBLISHED = SHARED / "reference-results" / "search_cost_scale_scale-layer.csv"
LAYERS = (8, 16, 32, 64, 128, 256, 512, 1024)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="folder for the CSVs and the figure")
    parser.add_argument("--database", type=Path, default=MINISET, help="the reference's miniset database")
    parser.add_argument("--budgets", type=float, nargs="*", default=[],
                        help="seconds per depth, searched beside the default budget in explored cases")
    parser.add_argument("--scale-budget", type=float, default=10.0, help="seconds per depth, scale experiment")
    parser.add_argument("--layers", type=int, nargs="+", default=list(LAYERS), help="scale experiment depths")
    parser.add_argument("--depth-budget", type=float, default=10.0, help="seconds per depth-cost search")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.database.is_dir():
        code = small(args.database, args.budgets, out)
        if code:
            return code
    else:
        print(f"bench: aceso miniset search skipped: no miniset database at {args.database}", file=sys.stderr)
    if EUROSYS.is_dir():
        depth_cost(EUROSYS, args.depth_budget, out)
        code = budget(EUROSYS, out)
        if code:
            return code
    else:
        print(f"bench: aceso depth cost and budget skipped: no eurosys database at {EUROSYS}", file=sys.stderr)
    return scale(out, args.scale_budget, args.layers)


def depth_cost(database: Path, budget: float, out: Path, layers: int = 1024) -> None:
    """One depth's search alone (no process pool) at 2, 4 and 8 stages: what an evaluation costs."""
    m = model("scale-layer", "scale-layer", layers)
    db = read_database(database, m, [1, 2, 4, 8], 8)
    ops = m.full_op_list(db.ops)
    rows = []
    for stages in (2, 4, 8):
        print(f"bench: aceso depth cost, {layers} layers, {stages} stages, {budget:g} s ...", flush=True)
        result = DepthSearch(CostModel(db, 8, 28000, kind="reference"), ops,
                             Options(1024, (1, 2, 4, 8), 1, 8, 28000, 8, budget_s=budget), stages).run()
        rows.append({"layers": layers, "ops": len(ops), "stages": stages, "budget_s": budget,
                     "seconds": round(result.seconds, 2), "explored": result.explored,
                     "ms_per_config": round(result.seconds / max(result.explored, 1) * 1000, 2),
                     "best_ms": round(result.best.time, 2) if result.best else None})
    _write(pd.DataFrame(rows), out / "aceso_depth_cost.csv")


def _fresh(folder: Path) -> Path:
    """An empty folder for one search: a search finding its earlier manifest there reuses its configs, and
    the benchmark would time nothing."""
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def _searched(logs: Path, name: str, size: str) -> dict:
    """One size's search as its manifest records it, with a digest of every depth's config as written
    (what "the same config" means, byte for byte)."""
    folder = logs / "aceso" / "search" / name / size
    manifest = json.loads(max(folder.glob("search-*.json"), key=lambda p: p.stat().st_mtime).read_text())
    digest = hashlib.sha256(b"".join((folder / n).read_bytes() for n in sorted(manifest["configs"]))).hexdigest()
    gbs = manifest["options"]["global_batch_size"]
    return {"model": name, "size": size, "global_batch": gbs, "budget": manifest["budget"],
            "stages": int(manifest["configs"][0].split("stages")[0].rsplit("_", 1)[1]),
            "iteration_ms": manifest["best_ms"], "megatron_ms": manifest["megatron_ms"],
            "samples_per_s": round(gbs / (manifest["best_ms"] / 1000), 2),
            "megatron_samples_per_s": round(gbs / (manifest["megatron_ms"] / 1000), 2),
            "depths": len(manifest["configs"]), "configs_sha256": digest[:16],
            "explored": sum(d["explored"] for d in manifest["depths"]), "wall_s": manifest["search_s"]}


def budget(database: Path, out: Path) -> int:
    """GPT-13B's large-setting search on every core, then on one: the same config, whatever the cores."""
    cores = os.sched_getaffinity(0)
    rows = []
    for allowed in (cores, {min(cores)}):
        logs = _fresh(out / "aceso-budget" / f"{len(allowed)}-cores")
        print(f"bench: aceso GPT-13B search on {len(allowed)} core(s) ...", flush=True)
        os.sched_setaffinity(0, allowed)  # the search's worker processes inherit it
        try:
            code = reproflow(["aceso", "reproduce", "large", "--models", "gpt", "--model-sizes", "13B",
                              "--profiled-time-path", str(database), "--log-path", str(logs),
                              "--out", str(logs / "reports"), "--results", str(logs / "results")])
        finally:
            os.sched_setaffinity(0, cores)
        if code:
            return code
        rows.append({"cores": len(allowed), **_searched(logs, "gpt", "13B")})
    _write(pd.DataFrame(rows), out / "aceso_budget.csv")
    return 0


def small(database: Path, budgets: list[float], out: Path) -> int:
    """The artifact's small setting on its miniset (`aceso reproduce small --sizes reference`): each
    model's search against its Megatron-LM plan, as the artifact's scripts set both."""
    rows = []
    for seconds in (None, *budgets):
        logs = _fresh(out / "aceso-small" / ("count" if seconds is None else f"{seconds:g}s"))
        print(f"bench: aceso search on the miniset, {budget_text(CASES, seconds)} ...", flush=True)
        clock = [] if seconds is None else ["--time-budget-total", f"{seconds:g}"]
        code = reproflow(["aceso", "reproduce", "small", "--sizes", "reference", "--model", "reference",
                          "--profiled-time-path",
                          str(database), "--log-path", str(logs), "--out", str(logs / "reports"),
                          "--results", str(logs / "results"), *clock])
        if code:
            return code
        rows += [_searched(logs, s.model, s.size) for s in SETTINGS["small"]]
    _write(pd.DataFrame(rows), out / "aceso_search.csv")
    return 0


def scale(out: Path, budget: float, layers: list[int]) -> int:
    db = out / "aceso-db-scale"
    if not (db / "gpt_scale-layer_mbs1_tp1_algo0.csv").is_file():
        results = out / "aceso-profile"
        print("bench: profiling GPT scale-layer ops (workflows/aceso-profile-scale.toml) ...", flush=True)
        code = reproflow(["run", "aceso-profile-scale", "--results", str(results)])
        if code:
            return code
        write_from_rows(load_results(results), db)
    rows = []
    for n in layers:
        m = model("scale-layer", "scale-layer", n)
        database = read_database(db, m, [1, 2, 4, 8], 2)
        ops = m.full_op_list(database.ops)
        cost = CostModel(database, 8, 28000)
        uniform = best_feasible(megatron_plans(cost, ops, 1024, 8, 2, range(1, 9)), 28000)
        print(f"bench: aceso search scale-layer, {n} layers ({len(ops)} ops), {budget:g} s per depth ...", flush=True)
        start = time.monotonic()
        results = search(cost, ops, Options(1024, (1, 2, 4, 8), 1, 8, 28000, 2, budget_s=budget), range(1, 9))
        wall = time.monotonic() - start
        best = min((r for r in results if r.best), key=lambda r: r.best.time)  # type: ignore[union-attr]
        assert best.best is not None
        rows.append({"layers": n, "ops": len(ops), "budget_s_per_depth": budget, "wall_s": round(wall, 2),
                     "to_best_s": round(best.seconds_to_best, 2),
                     "iteration_ms": round(best.best.time, 2),
                     "samples_per_s": round(1024 / (best.best.time / 1000), 3),
                     "megatron_samples_per_s": round(uniform.prediction.throughput(1024), 3) if uniform else None,
                     "explored": sum(r.explored for r in results)})
    frame = pd.DataFrame(rows)
    if PUBLISHED.is_file():
        published = pd.read_csv(PUBLISHED, index_col=0, skipinitialspace=True)
        for system in ("aceso", "alpa"):
            values = {int(c.removesuffix("layers")): float(v) for c, v in published.loc[system].items()}
            frame[f"published_{system}_search_s"] = [values.get(n) or None for n in frame["layers"]]
    _write(frame, out / "aceso_scale_search.csv")
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    ax.plot(frame["layers"], frame["wall_s"], "-o", label=f"reproflow, wall ({budget:g} s budget per depth)")
    ax.plot(frame["layers"], frame["to_best_s"], "--o", label="reproflow, until its best config")
    for system in ("aceso", "alpa"):
        col = f"published_{system}_search_s"
        if col in frame and frame[col].notna().any():
            ax.plot(frame["layers"], frame[col], ":s",
                    label=f"{system.capitalize()} search (published, for 1 x 8 V100)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPT layers (scale-layer: hidden 512, 8 heads)")
    ax.set_ylabel("search time (s)")
    ax.set_title("Search cost against model depth, 1 node x 8 GPUs", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(out / "aceso_scale_search.png", dpi=130, bbox_inches="tight")
    plt.close(fig)
    print(f"bench: wrote {out / 'aceso_scale_search.png'}")
    return 0


def _write(frame: pd.DataFrame, path: Path) -> None:
    stamp(frame).to_csv(path, index=False)
    print(to_markdown(frame))
    print(f"bench: wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
