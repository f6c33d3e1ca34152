"""`make bench`: how close reproflow's param numbers are to bare torch timing loops.

all_reduce 1-64 MiB on 4 gloo processes (busBW ratio, goal >= 0.95) and GEMM shapes of param's
dataset A on one process (TFLOP/s ratio, goal >= 0.95). Writes <out>/param_ratios.csv.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from stamp import stamp

from reproflow.launch.local import run_ranks
from reproflow.reporting.report import to_markdown

GOAL = 0.95
HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="folder for param_ratios.csv")
    parser.add_argument("--trials", type=int, default=5, help="alternating trials per case (median taken)")
    parser.add_argument("--ranks", type=int, default=4, help="gloo processes for all_reduce")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "param_ratios.jsonl"
    raw.unlink(missing_ok=True)
    sizes = ",".join(str(2**p) for p in range(20, 27))  # 1 MiB .. 64 MiB
    shapes = "1024x1024x1024;512x4096x4096;4096x4096x512;1024x1024x256"
    runs = [("comms", sizes, "10", args.ranks), ("gemm", shapes, "10", 1)]
    for mode, spec, count, world in runs:
        print(f"bench: {mode} on {world} process(es), {args.trials} trials ...", flush=True)
        cmd = [sys.executable, str(HERE / "rank_ratio.py"), mode, spec, count, str(args.trials), str(raw)]
        code = run_ranks(cmd, world, out / "logs" / mode)
        if code:
            print(f"bench: {mode} failed with exit code {code}", file=sys.stderr)
            return code
    frame = pd.DataFrame([json.loads(line) for line in raw.read_text().splitlines()])
    frame["ratio"] = frame["reproflow"] / frame["bare"]
    frame["goal"] = GOAL
    frame["meets_goal"] = frame["ratio"] >= GOAL
    stamp(frame).to_csv(out / "param_ratios.csv", index=False)
    raw.unlink()
    cols = ["benchmark", "case", "reproflow_mode", "reproflow", "bare", "unit", "ratio", "meets_goal"]
    print(to_markdown(frame[cols], floatfmt=".3f"))
    for (bench, mode), group in frame.groupby(["benchmark", "reproflow_mode"]):
        print(f"{bench} ({mode}): median ratio {group['ratio'].median():.3f}, "
              f"{int(group['meets_goal'].sum())}/{len(group)} cases >= {GOAL}")
    print(f"bench: wrote {out / 'param_ratios.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
