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
from typing import TYPE_CHECKING, Any

from reproflow.families.param_comms.sweep import COLLECTIVES, DTYPES, MAX_SIZES, message_sizes
from reproflow.spec.errors import ParamError
from reproflow.spec.family import Family, Measurement
from reproflow.spec.params import Param

if TYPE_CHECKING:
    from reproflow.rank.context import RunContext

IMPLEMENTATIONS = ("reproflow", "param", "nccl-tests")


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
        from reproflow.families.param_comms import original

        original.check(params)


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    """The original tool must be present where the job runs."""
    from reproflow.families.param_comms import nccl_tests, original

    if params["implementation"] == "param":
        original.runtime_check(params, ctx.backend)
    elif params["implementation"] == "nccl-tests":
        nccl_tests.runtime_check(params, ctx)


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Sweep the message sizes of one collective with the chosen implementation."""
    # The implementations run collectives (torch): imported on the ranks, not where suites are listed.
    from reproflow.families.param_comms import measure, nccl_tests, original

    if params["implementation"] == "param":
        return original.run(ctx, params)
    if params["implementation"] == "nccl-tests":
        return nccl_tests.run(ctx, params)
    return measure.measure(ctx, params)


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
    headline="busbw",
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
        Param("dtype", "str", "float32", "element type (param --data-type)", choices=DTYPES),
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
