"""Rank program for test_timing: reproflow's timed loop against an independent bare loop.

Both time the same all_reduce in the same process group and the same mode (non-blocking or
blocking), interleaved, so load on the machine affects both alike. Rank 0 prints one JSON line.
"""

import json
import statistics
import sys

import torch
import torch.distributed as dist

from reproflow.rank.context import RunContext
from reproflow.rank.timing import bare_loop_seconds, time_per_op


def main() -> None:
    nbytes, iters, trials = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ctx = RunContext.from_env("cpu", "gloo", 120)
    buf = torch.rand(nbytes // 4)
    got: dict[str, list[float]] = {"ours": [], "bare": [], "ours_blocking": [], "bare_blocking": []}
    issue = lambda async_op: dist.all_reduce(buf, async_op=async_op)  # noqa: E731
    for _ in range(trials):
        for blocking, suffix in ((False, ""), (True, "_blocking")):
            mine = time_per_op(ctx, issue, 1, iters, blocking)
            got["ours" + suffix].append(statistics.median(ctx.gather_floats(mine)))
            dist.barrier()
            bare = bare_loop_seconds(issue, iters, blocking)
            got["bare" + suffix].append(statistics.median(ctx.gather_floats(bare)))
    if ctx.rank == 0:
        print(json.dumps({k: statistics.median(v) for k, v in got.items()}), flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
