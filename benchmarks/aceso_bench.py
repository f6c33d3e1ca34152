"""`make bench`: Aceso search cost and result on the reference's miniset database.

For GPT-1.3B, T5-770M and Wide-ResNet-1B on 1 node x 4 GPUs (the reference's small settings),
runs reproflow's search (one process per pipeline depth) and records its wall time, the time
until its best config was found, the predicted throughput of that config and of the best
Megatron-LM uniform plan. Writes <out>/aceso_search.csv. Needs the miniset (../shared).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from pathlib import Path

import pandas as pd

from reproflow.families.aceso.costmodel import CostModel
from reproflow.families.aceso.database import read_database
from reproflow.families.aceso.models import model
from reproflow.families.aceso.plans import best_feasible, megatron_plans
from reproflow.families.aceso.search import Options, search
from reproflow.report import to_markdown

MINISET = Path(__file__).resolve().parents[2] / "shared" / "reference-data" / "aceso" / "profiled-time-miniset"
SMALL = [("gpt", "1_3B", 512, (1, 2, 4, 8)), ("t5", "770M", 512, (1, 2, 4, 8)), ("resnet", "1B", 768, (16, 32, 48, 64))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="folder for aceso_search.csv")
    parser.add_argument("--database", type=Path, default=MINISET, help="the reference's miniset database")
    parser.add_argument("--budgets", type=float, nargs="+", default=[2.0, 5.0], help="seconds per depth")
    args = parser.parse_args()
    if not args.database.is_dir():
        print(f"bench: aceso search skipped: no miniset database at {args.database}", file=sys.stderr)
        return 0
    rows = []
    for name, size, gbs, mbs in SMALL:
        m = model(name, size)
        db = read_database(args.database, m, list(mbs), m.max_tp(4))
        ops = m.full_op_list(db.ops)
        cost = CostModel(db, 4, 12000)
        uniform = best_feasible(megatron_plans(cost, ops, gbs, 4, m.max_tp(4), range(1, 5)), 12000)
        for budget in args.budgets:
            print(f"bench: aceso search {name} {size}, {budget:g} s per depth ...", flush=True)
            start = time.monotonic()
            results = search(CostModel(db, 4, 12000), ops, Options(gbs, mbs, 1, 4, 12000, m.max_tp(4),
                                                                   budget_s=budget), range(1, 5))
            wall = time.monotonic() - start
            best = min((r for r in results if r.best), key=lambda r: r.best.time)  # type: ignore[union-attr]
            assert best.best is not None and uniform is not None
            rows.append({"model": name, "size": size, "gpus": 4, "global_batch": gbs, "budget_s_per_depth": budget,
                         "wall_s": round(wall, 2), "to_best_s": round(best.seconds_to_best, 2),
                         "stages": best.num_stages, "iteration_ms": round(best.best.time, 2),
                         "samples_per_s": round(gbs / (best.best.time / 1000), 2),
                         "memory_mb": round(best.best.memory), "megatron_samples_per_s":
                         round(uniform.prediction.throughput(gbs), 2),
                         "explored": sum(r.explored for r in results)})
    frame = pd.DataFrame(rows)
    frame["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "aceso_search.csv", index=False)
    print(to_markdown(frame.drop(columns=["timestamp"])))
    print(f"bench: wrote {out / 'aceso_search.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
