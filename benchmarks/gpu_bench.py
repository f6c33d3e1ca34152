"""`make bench-gpu`: param compute's GEMM on one GPU against a bare torch.mm loop and the GPU's limits.

Dataset A's GEMM shapes in fp32, tf32 and bf16 (bf16 also at 8192^3 and at the shape of the fastest
published H100 matmul): reproflow's TFLOP/s (the param_compute family, param's timing) beside a bare
torch.mm loop of the same shape and precision (goal >= 0.95), each as a fraction of the GPU's dense
peak for its dtype (workflows/reference/limits.toml) and, in bf16, of the fastest matmul published for
it (the table's `h100-mamf`). Rows carry the machine, driver, torch, CUDA and NCCL versions. Writes
<out>/gemm.csv and prints the table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch
from rank_ratio import _value, alternate, bare_gemm_tflops

from reproflow.families.param_compute.datasets import DATASETS
from reproflow.rank.context import RunContext
from reproflow.reporting.limits import limits
from reproflow.reporting.report import to_markdown
from reproflow.spec.family import get_family
from reproflow.spec.params import resolve

GOAL = 0.95
DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16}
BEST_PUBLISHED = "h100-mamf"  # the fastest bf16 matmul published for an H100 (the H200's tensor cores are the same)


def machine() -> dict[str, str]:
    """The GPU, its driver and the software versions every row carries."""
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "torch_version": torch.__version__,
            "cuda_version": str(torch.version.cuda), "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
            "host": socket.gethostname()}


def shapes(dtype: str) -> list[tuple[int, int, int]]:
    """Dataset A's shapes; in bf16 also 8192^3 and the published best matmul's shape."""
    extra = [(8192, 8192, 8192)] + [(int(p["m"]), int(p["n"]), int(p["k"]))
                                    for p, _ in limits().published[BEST_PUBLISHED].values]
    return [tuple(s) for s in DATASETS["gemm"]["A"]] + (extra if dtype == "bfloat16" else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/gpu", help="folder for gemm.csv")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials per case (median taken)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per measurement")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES), help="precisions")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench-gpu: this torch sees no GPU; run it on a GPU node", file=sys.stderr)
        return 2
    for var, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(var, value)
    ctx = RunContext.from_env("cuda", "nccl", 600)
    fam = get_family("param_compute")
    bare_gemm_tflops(8192, 8192, 8192, 200, "cuda", torch.bfloat16)  # about a second: clocks up to speed
    records = []
    for dtype in args.dtypes:
        torch_dtype = DTYPES[dtype]
        torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
        for m, n, k in shapes(dtype):
            params = resolve(fam.params, {"kernel": "gemm", "shapes": [[m, n, k]], "dtype": dtype,
                                          "steps": args.steps, "warmups": 10})
            ours, bare = alternate(args.trials, lambda: _value(fam.run(ctx, params), "tflops"),  # noqa: B023
                                   lambda: bare_gemm_tflops(m, n, k, args.steps, "cuda", torch_dtype))  # noqa: B023
            records.append({"dtype": dtype, "m": m, "n": n, "k": k, "reproflow_tflops": ours, "bare_tflops": bare})
    torch.set_float32_matmul_precision("highest")
    ctx.close()
    frame = pd.DataFrame(records)
    frame["ratio"] = frame["reproflow_tflops"] / frame["bare_tflops"]
    frame["meets_goal"] = frame["ratio"] >= GOAL
    device = torch.cuda.get_device_name()
    # The limit `reproflow report` sets param_compute's TFLOP/s against: the GPU's dense peak for the dtype.
    peak = {d: limits().limit("param_compute", "tflops", {"dtype": d}, device, 1, 1) for d in args.dtypes}
    frame["dense_peak_tflops"] = frame["dtype"].map(lambda d: peak[d][0] if peak[d] else float("nan"))
    frame["of_dense_peak"] = frame["reproflow_tflops"] / frame["dense_peak_tflops"]
    best = limits().published[BEST_PUBLISHED].values[0][1]
    frame["published_best_tflops"] = frame["dtype"].map(lambda d: best if d == "bfloat16" else float("nan"))
    frame["of_published_best"] = frame["reproflow_tflops"] / frame["published_best_tflops"]
    for key, value in machine().items():
        frame[key] = value
    frame["timestamp"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "gemm.csv", index=False)
    print(to_markdown(frame[["dtype", "m", "n", "k", "reproflow_tflops", "bare_tflops", "ratio", "of_dense_peak",
                             "of_published_best"]], floatfmt=".3f"))
    for dtype, group in frame.groupby("dtype", sort=False):
        print(f"{dtype}: median ratio {group['ratio'].median():.3f} ({int(group['meets_goal'].sum())}/{len(group)} "
              f">= {GOAL}), best {group['reproflow_tflops'].max():.1f} TFLOP/s = "
              f"{group['of_dense_peak'].max():.3f} of the dense peak")
    print(f"bench-gpu: wrote {out / 'gemm.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
