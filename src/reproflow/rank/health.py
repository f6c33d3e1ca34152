"""The health gate: a short all-reduce on the whole allocation before any point is measured.

A node with a broken NIC, a wrong driver or a corrupting link makes every number of its job
meaningless. Like MLPerf's NCCL sanity check before training, each job sums known values over
every rank, checks every element, and times it. The result goes into every row of the job, and
aggregation leaves out (and lists) the points of jobs whose gate failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from reproflow.rank.context import RunContext
from reproflow.store.results import GATE_FAIL, GATE_PASS


@dataclass(frozen=True)
class Gate:
    """The gate's verdict and what it measured (or why it failed)."""

    status: str
    detail: str


def health_gate(ctx: RunContext, corrupt: bool = False, numel: int = 1 << 20, iters: int = 3) -> Gate:
    """All-reduce `numel` float32 values `iters` times on every rank and check each element.

    Rank r contributes r + 1 everywhere, so every element must equal world * (world + 1) / 2, a
    value float32 holds exactly. `corrupt` makes this rank contribute wrong values (fault injection).
    """
    world = ctx.world_size
    expected = world * (world + 1) / 2
    mine = torch.full((numel,), float(ctx.rank + 1), dtype=torch.float32, device=ctx.device)
    if corrupt:
        mine[::97] += 1.0
    ctx.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        out = mine.clone()
        dist.all_reduce(out)
    ctx.sync()
    seconds = (time.perf_counter() - start) / iters
    wrong = int((out != expected).sum().item())
    problems = ctx.failures(f"{wrong} of {numel} summed values wrong (expected {expected:g})" if wrong else "")
    slowest = max(ctx.gather_floats(seconds))
    mib = numel * 4 / 2**20
    if problems:
        return Gate(GATE_FAIL, f"all_reduce of {mib:g} MiB over {world} ranks: {problems}")
    # nccl-tests' bus bandwidth of an all-reduce: 2 (n - 1) / n of the algorithm bandwidth; one rank moves
    # nothing over a bus, so it has none to show.
    bus = (f"busBW {2 * (world - 1) / world * numel * 4 / slowest / 1e9:.3g} GB/s" if world > 1
           else "one rank: no bus traffic")
    return Gate(GATE_PASS, f"all_reduce of {mib:g} MiB over {world} ranks on {','.join(sorted(set(ctx.hosts())))}: "
                      f"{slowest * 1e3:.2f} ms, {bus}")
