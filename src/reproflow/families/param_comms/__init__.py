"""param comms: collective latency and bandwidth, as facebookresearch/param `comms.py` measures them.

Per message size: elements per rank, latency min / p50 / p75 / p95 / max across ranks (each rank's
mean time per operation), algBW = bytes / p50 and busBW = algBW x the nccl-tests factor. Sizes are
total buffer sizes, as in param and nccl-tests. Tensor collectives use the flat-tensor forms
(`all_gather_into_tensor` / `all_gather_single`, `reduce_scatter_tensor` / `reduce_scatter_single`,
`all_to_all_single`); `send_recv` is the nccl-tests ring: every rank sends to rank+1 and receives
from rank-1 in one group. With `implementation = "param"` the original comms.py measures instead
(original.py), inside the same job, and its output becomes the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from reproflow.context import ALL_GATHER, REDUCE_SCATTER, RunContext
from reproflow.errors import ParamError
from reproflow.families.param_comms import nccl_tests, original
from reproflow.family import Family, Measurement
from reproflow.params import Param
from reproflow.timing import STATS, rank_stats, time_per_op

IMPLEMENTATIONS = ("reproflow", "param", "nccl-tests")

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")
# Collectives whose buffer is split across ranks: at least one element per rank.
SPLIT = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
}
MAX_SIZES = 100


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busBW / algBW factor (doc/PERFORMANCE.md), as param's getBusBW."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in SPLIT:
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "send_recv"):
        return 1.0
    raise ValueError(f"no bus factor for {collective!r}")


def message_sizes(begin: int, end: int, factor: int, step: int) -> list[int]:
    """Sizes from `begin` to `end` inclusive: times `factor`, or plus `step` bytes when step > 0."""
    sizes = []
    size = begin
    while size <= end and len(sizes) <= MAX_SIZES:
        sizes.append(size)
        nxt = size + step if step > 0 else size * factor
        size = max(nxt, size + 1)
    return sizes


def element_counts(collective: str, size: int, element_size: int, world_size: int) -> tuple[int, int]:
    """(total elements, elements per rank) for a total buffer of `size` bytes.

    Split collectives round down to a multiple of the world size and carry at least one element
    per rank; the others carry at least one element (param's fixBeginSize).
    """
    total = size // element_size
    if collective in SPLIT:
        per_rank = max(total // world_size, 1)
        return per_rank * world_size, per_rank
    total = max(total, 1)
    return total, total


def check(params: Mapping[str, Any], world_size: int) -> None:
    """Cross-parameter rules, checked before any collective runs."""
    if params["begin_size"] > params["end_size"]:
        raise ParamError(f"begin_size {params['begin_size']} is larger than end_size {params['end_size']}.")
    if params["step_bytes"] == 0 and params["step_factor"] < 2:
        raise ParamError("step_factor must be 2 or more when step_bytes is 0.")
    sizes = message_sizes(params["begin_size"], params["end_size"], params["step_factor"], params["step_bytes"])
    if len(sizes) > MAX_SIZES:
        raise ParamError(f"the sweep has more than {MAX_SIZES} sizes; raise step_factor or step_bytes.")
    if params["root"] >= world_size:
        raise ParamError(f"root {params['root']} is not a rank of a {world_size}-rank job.",
                         f"0 to {world_size - 1}")
    if params["collective"] == "send_recv" and world_size < 2:
        raise ParamError("send_recv needs at least 2 ranks.")
    if params["implementation"] == "param":
        original.check(params)


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    """The original tool must be present where the job runs."""
    if params["implementation"] == "param":
        original.runtime_check(params, ctx.backend)
    elif params["implementation"] == "nccl-tests":
        nccl_tests.runtime_check(params, ctx)


class _Buffers:
    """The tensors of one collective at one size, and the call that issues it once."""

    def __init__(self, collective: str, total: int, per_rank: int, dtype: torch.dtype, ctx: RunContext,
                 root: int) -> None:
        self.collective, self.ctx, self.root = collective, ctx, root
        dev = ctx.device
        if dtype.is_floating_point:
            make = lambda n: torch.rand(n, device=dev).to(dtype) / ctx.world_size  # noqa: E731
        else:
            make = lambda n: torch.randint(0, 10, (n,), device=dev, dtype=dtype)  # noqa: E731
        if collective == "all_gather":
            self.inp, self.out = make(per_rank), torch.empty(total, dtype=dtype, device=dev)
        elif collective == "reduce_scatter":
            self.inp, self.out = make(total), torch.empty(per_rank, dtype=dtype, device=dev)
        elif collective in ("all_to_all", "send_recv"):
            self.inp, self.out = make(total), torch.empty(total, dtype=dtype, device=dev)
        else:
            self.inp = self.out = make(total)

    def issue(self, async_op: bool) -> Any:
        c, r = self.collective, self.ctx
        if c == "all_reduce":
            return dist.all_reduce(self.inp, async_op=async_op)
        if c == "all_gather":
            return ALL_GATHER(self.out, self.inp, async_op=async_op)
        if c == "reduce_scatter":
            return REDUCE_SCATTER(self.out, self.inp, async_op=async_op)
        if c == "all_to_all":
            return dist.all_to_all_single(self.out, self.inp, async_op=async_op)
        if c == "broadcast":
            return dist.broadcast(self.inp, src=self.root, async_op=async_op)
        if c == "reduce":
            return dist.reduce(self.inp, dst=self.root, async_op=async_op)
        ops = [
            dist.P2POp(dist.isend, self.inp, (r.rank + 1) % r.world_size),
            dist.P2POp(dist.irecv, self.out, (r.rank - 1) % r.world_size),
        ]
        works = dist.batch_isend_irecv(ops)
        if async_op:
            return works
        for w in works:
            w.wait()
        return None

    def count_errors(self) -> int:
        """Fill known values, run the collective once, and count wrong output elements (-c in nccl-tests)."""
        c, r = self.collective, self.ctx
        w, me = r.world_size, r.rank
        per = self.out.numel() // w if c in ("all_gather", "all_to_all") else 0
        if c == "all_to_all":
            # Rank r sends chunk j filled with r*w + j; rank r then holds chunk j = j*w + r.
            self.inp.copy_(torch.arange(w, device=r.device).repeat_interleave(per) + me * w)
            expected = torch.arange(w, device=r.device).repeat_interleave(per) * w + me
        elif c == "broadcast":
            self.inp.fill_(3 if me == self.root else 0)
            expected = torch.full_like(self.inp, 3, dtype=torch.float64)
        elif c == "send_recv":
            self.inp.fill_(me + 1)
            expected = torch.full((self.out.numel(),), (me - 1) % w + 1, device=r.device)
        elif c == "all_gather":
            self.inp.fill_(me + 1)
            expected = torch.arange(1, w + 1, device=r.device).repeat_interleave(per)
        else:
            self.inp.fill_(me + 1)
            expected = torch.full((self.out.numel(),), w * (w + 1) / 2, device=r.device)
        self.issue(False)
        r.sync()
        if c == "reduce" and me != self.root:
            return 0  # only the root's buffer is defined after a reduce
        got = self.out.to(torch.float64)
        tol = 1e-2 if self.out.dtype in (torch.float16, torch.bfloat16) else 1e-6
        return int((~torch.isclose(got, expected.to(torch.float64), rtol=tol, atol=0)).sum().item())


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Sweep the message sizes of one collective with the chosen implementation."""
    if params["implementation"] == "param":
        return original.run(ctx, params)
    if params["implementation"] == "nccl-tests":
        return nccl_tests.run(ctx, params)
    return measure(ctx, params)


def measure(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """reproflow's own sweep; every rank runs this, rank 0's rows are kept."""
    collective, dtype_name = params["collective"], params["dtype"]
    dtype = DTYPES[dtype_name]
    element_size = torch.empty(0, dtype=dtype).element_size()
    factor = bus_factor(collective, ctx.world_size)
    out: list[Measurement] = []
    for size in message_sizes(params["begin_size"], params["end_size"], params["step_factor"],
                              params["step_bytes"]):
        total, per_rank = element_counts(collective, size, element_size, ctx.world_size)
        bufs = _Buffers(collective, total, per_rank, dtype, ctx, params["root"])
        seconds = time_per_op(ctx, bufs.issue, params["warmup_iters"], params["iters"], params["blocking"])
        per_rank_s = ctx.gather_floats(seconds)
        stats = rank_stats(per_rank_s)
        nbytes = total * element_size
        algbw = nbytes / stats["p50"] / 1e9
        coords = {"size_bytes": nbytes, "elements_per_rank": per_rank}
        out.extend(Measurement("time_us", s * 1e6, "us", coords, rank=i) for i, s in enumerate(per_rank_s))
        out.extend(Measurement(f"latency_{k}_us", stats[k] * 1e6, "us", coords) for k in STATS)
        out.append(Measurement("algbw", algbw, "GB/s", coords))
        out.append(Measurement("busbw", algbw * factor, "GB/s", coords))
        if params["check"]:
            wrong = sum(int(x) for x in ctx.gather_floats(float(bufs.count_errors())))
            out.append(Measurement("wrong_elements", float(wrong), "count", coords))
        del bufs
    return out


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    """param's COMMS-RES table: one line per size."""
    by_size: dict[int, dict[str, float]] = {}
    per_rank: dict[int, int] = {}
    for m in rows:
        if m.rank is None:
            by_size.setdefault(m.coords["size_bytes"], {})[m.metric] = m.value
            per_rank[m.coords["size_bytes"]] = m.coords["elements_per_rank"]
    mode = "blocking" if params["blocking"] else "non-blocking"
    checked = any("wrong_elements" in v for v in by_size.values())
    # nccl-tests gives one mean time per size (time_us), no percentiles across ranks.
    time_head = "Time(us):mean" if params["implementation"] == "nccl-tests" else "Latency(us):p50"
    lines = [
        f"COMMS-RES-{params['collective']}-{params['dtype']} ({params['implementation']}, {mode}, "
        f"{params['iters']} iters, {params['warmup_iters']} warm-up)",
        f"{'size (B)':>14} {'nElementsPerRank':>17} {time_head:>16} {'p75':>10} {'p95':>10} "
        f"{'Min':>10} {'Max':>10} {'AlgBW(GB/s)':>12} {'BusBW(GB/s)':>12}" + (f" {'#wrong':>7}" if checked else ""),
    ]
    fmt: Callable[[float | None], str] = lambda v: f"{'-':>10}" if v is None else f"{v:10.1f}"  # noqa: E731
    for size in sorted(by_size):
        v = by_size[size]
        line = (
            f"{size:>14d} {per_rank[size]:>17d} {v.get('latency_p50_us', v.get('time_us', 0.0)):>16.1f} "
            f"{fmt(v.get('latency_p75_us'))} {fmt(v.get('latency_p95_us'))} {fmt(v.get('latency_min_us'))} "
            f"{fmt(v.get('latency_max_us'))} "
            f"{v['algbw']:>12.3f} {v['busbw']:>12.3f}"
        )
        if "wrong_elements" in v:
            line += f" {int(v['wrong_elements']):>7d}"
        lines.append(line)
    return "\n".join(lines)


FAMILY = Family(
    name="param_comms",
    summary="collective latency, algBW and busBW over a message-size sweep (param comms.py, nccl-tests)",
    params=(
        Param("collective", "str", "all_reduce", "collective to time", choices=COLLECTIVES),
        Param("begin_size", "size", "1K", "first total buffer size (param --b)"),
        Param("end_size", "size", "64M", "last total buffer size, inclusive (param --e)"),
        Param("step_factor", "int", 2, "multiply the size by this (param --f)", minimum=1, maximum=1024),
        Param("step_bytes", "size", 0, "add this many bytes instead of multiplying when > 0 (param --sb)"),
        Param("warmup_iters", "int", 5, "untimed iterations per size (param --w)", minimum=0, maximum=100000),
        Param("iters", "int", 20, "timed iterations per size (param --n)", minimum=1, maximum=1000000),
        Param("blocking", "bool", False, "wait for every operation (param --z 1); default: back to back"),
        Param("dtype", "str", "float32", "element type (param --data-type)", choices=tuple(DTYPES)),
        Param("root", "int", 0, "root rank of broadcast and reduce (param --root)", minimum=0),
        Param("check", "bool", True, "after timing, run once on known data and count wrong elements"),
        Param("implementation", "str", "reproflow", "who measures: reproflow, the original param comms.py "
              "from $PARAM_DIR, or nccl-tests from $NCCL_TESTS_DIR (one node, GPUs)", choices=IMPLEMENTATIONS),
    ),
    run=run,
    table=table,
    check=check,
    runtime_check=runtime_check,
)
