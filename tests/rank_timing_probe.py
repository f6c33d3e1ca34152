"""Rank program for test_timing: reproflow's timed loop against an independent bare loop.

Both time the same all_reduce in the same process group, interleaved, so load on the machine
affects both alike. Rank 0 prints one JSON line.
"""

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from reproflow.context import RunContext
from reproflow.timing import time_per_op


def bare_seconds(buf: torch.Tensor, iters: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    return (time.perf_counter() - start) / iters


def main() -> None:
    nbytes, iters, trials = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ctx = RunContext.from_env("cpu", "gloo", 120)
    buf = torch.rand(nbytes // 4)
    ours, ours_blocking, bare = [], [], []
    for _ in range(trials):
        issue = lambda async_op: dist.all_reduce(buf, async_op=async_op)  # noqa: E731
        ours.append(statistics.median(ctx.gather_floats(time_per_op(ctx, issue, 1, iters, False))))
        ours_blocking.append(statistics.median(ctx.gather_floats(time_per_op(ctx, issue, 1, iters, True))))
        bare.append(statistics.median(ctx.gather_floats(bare_seconds(buf, iters))))
    if ctx.rank == 0:
        print(json.dumps({"ours": statistics.median(ours), "ours_blocking": statistics.median(ours_blocking),
                          "bare": statistics.median(bare)}), flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
