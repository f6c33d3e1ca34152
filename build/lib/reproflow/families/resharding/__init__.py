"""Cross-mesh resharding: Alpa's 1-to-m and n-to-m microbenchmarks (arXiv 2211.05322, sections 5.1.1,
5.1.2 and 5.3.1) in torch.distributed.

A tensor sharded over a source mesh is moved to a destination mesh with another sharding. DTensor
cannot redistribute across meshes, so the plan is reproflow's own (layout.py, plan.py, balance.py)
and executed with point-to-point sends, sub-group broadcasts or broadcasts pipelined along a ring
of point-to-point sends (execute.py). One point is one case
in one configuration; it reports the reference's `exec_time_mean` and `exec_time_var` (seconds,
over the runs kept) and fails when any destination rank holds a wrong tile.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from reproflow.families.resharding.cases import CASES
from reproflow.families.resharding.plan import CUSTOM, LOADBALANCE, MODES, ORDER_ALGOS, Plan, make_plan, problem
from reproflow.spec.errors import ParamError, PointFailed
from reproflow.spec.family import Family, Measurement
from reproflow.spec.params import Param

if TYPE_CHECKING:
    from reproflow.rank.context import RunContext


@lru_cache(maxsize=64)
def _plan(items: tuple[tuple[str, Any], ...], host_size: int) -> Plan:
    return make_plan(dict(items), host_size)


def plan_for(params: Mapping[str, Any], host_size: int) -> Plan:
    """The point's plan, computed once per job and host size (the greedy solver is not free)."""
    return _plan(tuple(sorted(params.items())), host_size)


def check(params: Mapping[str, Any], world_size: int) -> None:
    """Everything that does not depend on how ranks sit on hosts."""
    if params["warmup_runs"] >= params["runs"]:
        raise ParamError(f"warmup_runs ({params['warmup_runs']}) leaves none of the {params['runs']} runs.",
                         "warmup_runs < runs")
    p = problem(params)
    plan_for(params, p.devices)


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    """The job must have the hosts and ranks per host the two meshes need."""
    plan = plan_for(params, ctx.host_size)
    hosts = ctx.world_size // ctx.host_size
    need = plan.problem.hosts
    if need > hosts:
        raise ParamError(f"case {plan.problem.name!r} needs {need} hosts ({plan.problem.src_mesh.hosts} source + "
                         f"{plan.problem.dst_mesh.hosts} destination); the job has {hosts} of {ctx.host_size} "
                         "ranks each.", f"nodes >= {need}")


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Time the plan, check every destination tile, and report the reference's statistics."""
    from reproflow.families.resharding.execute import expected_elements, run_plan  # torch: only on ranks

    plan = plan_for(params, ctx.host_size)
    ctx.log(f"  {len(plan.tasks)} unit tasks, {len(plan.transfers)} transfers, local all-gather "
            f"{plan.allgather_note}; hosts: {_host_names(ctx, plan)}")
    times, wrong = run_plan(ctx, plan, params["runs"])
    if wrong:
        raise PointFailed(f"tile check failed: {wrong} of {expected_elements(plan)} destination elements differ "
                          "from the source tensor")
    drop = params["warmup_runs"]
    kept = times[drop:]
    mean = statistics.fmean(kept)
    out = [Measurement("run_time", t, "s", {"run": i, "kept": i >= drop}) for i, t in enumerate(times)]
    out += [
        Measurement("exec_time_mean", mean, "s"),
        Measurement("exec_time_var", statistics.pvariance(kept), "s^2"),
        Measurement("effective_bw", plan.problem.nbytes / mean / 1e9, "GB/s"),
        Measurement("delivered_bw", plan.delivered_bytes() / mean / 1e9, "GB/s"),
        Measurement("unit_tasks", float(len(plan.tasks)), "count"),
        Measurement("transfers", float(len(plan.transfers)), "count"),
        Measurement("max_host_sent_bytes", float(max(plan.sent_per_host().values())), "B"),
        Measurement("wrong_elements", float(wrong), "count"),
    ]
    return out


def _host_names(ctx: RunContext, plan: Plan) -> str:
    """'0=node1 1=node2 ...' for the hosts the meshes use ('N emulated on X' locally); PointFailed if
    a host's ranks sit on different machines (then a 'host' would not share one NIC)."""
    names = ctx.hosts()
    hs = ctx.host_size
    hosts = []
    for h in range(plan.problem.hosts):
        on = sorted({str(n) for n in names[h * hs:(h + 1) * hs]})
        if len(on) != 1:
            raise PointFailed(f"ranks {h * hs}-{(h + 1) * hs - 1} should share one host but run on {', '.join(on)}; "
                              "start one process per GPU with torchrun --nproc_per_node (the sbatch scripts do).")
        hosts.append(on[0])
    if len(set(hosts)) < len(hosts):
        return f"{len(hosts)} emulated on {hosts[0]}, {hs} ranks each"
    return " ".join(f"{h}={name}" for h, name in enumerate(hosts))


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    """One line per point, with the fields of the reference's result record."""
    v = {m.metric: m.value for m in rows if m.metric != "run_time"}
    p = problem(params)
    return (f"{p.name}: {p.src_mesh.text()} -> {p.dst_mesh.text()}, {'x'.join(map(str, p.shape))} int32, "
            f"{p.src_spec} -> {p.dst_spec}, {params['resharding_mode']} / {params['resharding_loadbalance_mode']}"
            f"{' + local all-gather' if params['use_local_allgather'] else ''}: exec_time_mean "
            f"{v['exec_time_mean']:.6f} s, exec_time_var {v['exec_time_var']:.3g} s^2, "
            f"{v['effective_bw']:.3f} GB/s effective, {int(v['unit_tasks'])} unit tasks, tiles correct")


def explain(params: Mapping[str, Any], host_size: int) -> str:
    """The plan of one point, as `--explain` prints it."""
    return plan_for(params, host_size).explain()


FAMILY = Family(
    name="resharding",
    sample_coords=('run',),
    samples=('runs', 'run_time'),
    headline="effective_bw",
    summary="cross-mesh resharding (Alpa): 1-to-m and n-to-m cases, send_recv vs broadcasts, load balancing",
    params=(
        Param("case", "str", "case1", "reference case (1-to-NxG or caseK), or 'custom' with the five fields below",
              choices=(*CASES, CUSTOM)),
        Param("src_mesh", "str", "", "custom case: source mesh HOSTSxDEVICES, e.g. '2x4'"),
        Param("dst_mesh", "str", "", "custom case: destination mesh on the next hosts, e.g. '2x4'"),
        Param("shape", "str", "", "custom case: int32 tensor shape, e.g. '1024x1024x512'"),
        Param("src_spec", "str", "", "custom case: per mesh axis R (replicate) or S<d> (shard dim d), e.g. 'S0,R'"),
        Param("dst_spec", "str", "", "custom case: destination spec, same notation"),
        Param("scale", "int", 1, "divide the tensor's dim 0 by this (1: the reference's 1-2 GiB tensors)", minimum=1),
        Param("resharding_mode", "str", "send_recv", "send_recv (one sender per receiver), broadcast (the "
              "backend's own, over a sub-group) or ring_broadcast (pipelined in chunks along the receivers by host, "
              "as NCCL's ring)", choices=MODES),
        Param("chunk_bytes", "int", 524288, "ring_broadcast: bytes a receiver forwards while the next chunk arrives",
              minimum=4),
        Param("resharding_loadbalance_mode", "str", "normal", "how senders are chosen and tasks ordered",
              choices=LOADBALANCE),
        Param("use_local_allgather", "bool", False, "send_recv: receive 1/r, then all-gather within the host"),
        Param("order_algo", "str", "greedy", "loadbalance_order solver: Alpa's randomised greedy, or "
              "depth-first search", choices=ORDER_ALGOS),
        Param("seed", "int", 0, "seed of the greedy solver (every rank plans alike)"),
        Param("runs", "int", 13, "timed repetitions (reference: 13)", minimum=1, maximum=100000),
        Param("warmup_runs", "int", 3, "first runs dropped from the statistics (reference: 3)", minimum=0),
    ),
    run=run,
    table=table,
    check=check,
    runtime_check=runtime_check,
    explain=explain,
)
