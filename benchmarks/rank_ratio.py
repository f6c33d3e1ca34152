"""Rank program of `make bench`: reproflow's reported numbers against bare torch loops.

    comms SIZES ITERS TRIALS OUT   all_reduce busBW: the param_comms family vs a bare dist.all_reduce loop
                                   in the same mode (async launches + wait, or synchronous calls)
    gemm  SHAPES STEPS TRIALS OUT  GEMM TFLOP/s: the param_compute family vs a bare torch.mm loop

Trials alternate which side goes first so drift on a busy machine affects both alike.
Rank 0 appends one JSON line per measurement to OUT.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from reproflow.rank.context import RunContext
from reproflow.rank.timing import bare_loop_seconds
from reproflow.spec.family import get_family
from reproflow.spec.params import resolve


def _value(rows, metric: str) -> float:
    return next(m.value for m in rows if m.metric == metric and m.rank is None)


def bare_allreduce_busbw(ctx: RunContext, nbytes: int, iters: int, blocking: bool) -> float:
    """busBW of a plain loop in the same mode, with the nccl-tests factor written out here."""
    buf = torch.rand(nbytes // 4)
    dist.all_reduce(buf)
    dist.barrier()
    mine = bare_loop_seconds(lambda async_op: dist.all_reduce(buf, async_op=async_op), iters, blocking)
    p50 = statistics.median(ctx.gather_floats(mine))
    n = ctx.world_size
    return nbytes / p50 / 1e9 * 2 * (n - 1) / n


def bare_gemm_tflops(m: int, n: int, k: int, steps: int, device: str = "cpu",
                     dtype: torch.dtype = torch.float32) -> float:
    """A plain torch.mm loop (synchronised before and after on a GPU)."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    torch.mm(a, b)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        torch.mm(a, b)
    sync()
    return 2 * m * n * k / ((time.perf_counter() - start) / steps) / 1e12


def alternate(trials: int, ours: Callable[[], float], bare: Callable[[], float]) -> tuple[float, float]:
    """Medians of both sides over `trials`, each trial running the other side first."""
    got: dict[str, list[float]] = {"ours": [], "bare": []}
    sides = [("ours", ours), ("bare", bare)]
    for trial in range(trials):
        for name, measure in sides if trial % 2 == 0 else sides[::-1]:
            got[name].append(measure())
    return statistics.median(got["ours"]), statistics.median(got["bare"])


def main() -> None:
    mode, spec, count, trials, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    ctx = RunContext.from_env("cpu", "gloo", 600)
    records = []
    if mode == "comms":
        fam = get_family("param_comms")
        for size in (int(s) for s in spec.split(",")):
            for blocking in (False, True):
                params = resolve(fam.params, {"collective": "all_reduce", "begin_size": size, "end_size": size,
                                              "iters": count, "warmup_iters": 1, "blocking": blocking,
                                              "check": False})
                ours, bare = alternate(trials, lambda: _value(fam.run(ctx, params), "busbw"),  # noqa: B023
                                       lambda: bare_allreduce_busbw(ctx, size, count, blocking))  # noqa: B023
                records.append({"benchmark": "all_reduce busBW", "case": f"{size} B",
                                "reproflow_mode": "blocking" if blocking else "non-blocking",
                                "reproflow": ours, "bare": bare, "unit": "GB/s"})
    else:
        fam = get_family("param_compute")
        for shape in spec.split(";"):
            m, n, k = (int(x) for x in shape.split("x"))
            params = resolve(fam.params, {"kernel": "gemm", "shapes": [[m, n, k]], "steps": count, "warmups": 1})
            ours, bare = alternate(trials, lambda: _value(fam.run(ctx, params), "tflops"),  # noqa: B023
                                   lambda: bare_gemm_tflops(m, n, k, count))  # noqa: B023
            records.append({"benchmark": "GEMM fp32 TFLOP/s", "case": shape, "reproflow_mode": "param timing",
                            "reproflow": ours, "bare": bare, "unit": "TFLOP/s"})
    if ctx.rank == 0:
        with open(out, "a") as fh:
            for r in records:
                fh.write(json.dumps(r | {"world_size": ctx.world_size, "backend": ctx.backend,
                                         "torch_version": torch.__version__, "trials": trials}) + "\n")
    ctx.close()


if __name__ == "__main__":
    main()
