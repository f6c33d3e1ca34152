"""`make bench-gpu`: param compute's GEMM on one GPU against a bare torch.mm loop and the GPU's peak.

Dataset A's GEMM shapes in fp32, tf32 and bf16: reproflow's TFLOP/s (the param_compute family, param's
timing) beside a bare torch.mm loop of the same shape and precision (goal >= 0.95), and beside the
bf16 rate of an 8192^3 matmul on the same GPU (its dense peak in practice). Rows carry the machine,
driver, torch, CUDA and NCCL versions. Writes <out>/gemm.csv and prints the table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch
from rank_ratio import _value, alternate, bare_gemm_tflops

from reproflow.families.param_compute.datasets import DATASETS
from reproflow.rank.context import RunContext
from reproflow.reporting.report import to_markdown
from reproflow.spec.family import get_family
from reproflow.spec.params import resolve

GOAL = 0.95
DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16}


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


def peak_bf16(steps: int, trials: int) -> float:
    """The median bf16 TFLOP/s of an 8192^3 matmul: what this GPU's tensor cores give in practice."""
    bare_gemm_tflops(8192, 8192, 8192, 200, "cuda", torch.bfloat16)  # about a second: clocks up to speed
    return statistics.median(bare_gemm_tflops(8192, 8192, 8192, steps, "cuda", torch.bfloat16) for _ in range(trials))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/gpu", help="folder for gemm.csv")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials per case (median taken)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per measurement")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench-gpu: this torch sees no GPU; run it on a GPU node", file=sys.stderr)
        return 2
    for var, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(var, value)
    ctx = RunContext.from_env("cuda", "nccl", 600)
    fam = get_family("param_compute")
    peak = peak_bf16(args.steps, args.trials)
    print(f"bench-gpu: 8192^3 bf16 matmul: {peak:.1f} TFLOP/s", flush=True)
    records = []
    for dtype, torch_dtype in DTYPES.items():
        torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
        for m, n, k in DATASETS["gemm"]["A"]:
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
    frame["peak_bf16_8192_tflops"] = peak
    frame["fraction_of_peak"] = frame["reproflow_tflops"] / peak
    for key, value in machine().items():
        frame[key] = value
    frame["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "gemm.csv", index=False)
    print(to_markdown(frame[["dtype", "m", "n", "k", "reproflow_tflops", "bare_tflops", "ratio", "fraction_of_peak"]],
                      floatfmt=".3f"))
    for dtype, group in frame.groupby("dtype", sort=False):
        print(f"{dtype}: median ratio {group['ratio'].median():.3f} ({int(group['meets_goal'].sum())}/{len(group)} "
              f">= {GOAL}), best {group['reproflow_tflops'].max():.1f} TFLOP/s = "
              f"{group['fraction_of_peak'].max():.3f} of the 8192^3 bf16 rate")
    print(f"bench-gpu: wrote {out / 'gemm.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
