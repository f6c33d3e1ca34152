"""Aceso's op profiler as a reproflow family: every op of a model, really run on the job's ranks
(the TP group: gloo on CPU, NCCL on GPUs), timed forward and backward, with its sizes.

Per op and point (model, size, micro-batch, algo; TP size = the job's world size): forward time
(mean of `repeats` calls after `warmup`, averaged over the ranks), backward time (the same for a
backward pass to the inputs and the weights), input and output size (MB, carried tensors
included), weights per rank, activations (tensors the forward keeps for backward plus new
outputs) and reserved memory. `reproflow aceso database` writes these rows as Aceso's CSV files.

Differences from the reference profiler: the backward also computes weight gradients (the
reference differentiates with respect to the op inputs only); on CPU, activations are the tensors
autograd saves plus new outputs and reserved memory is 0 (no caching allocator; on GPUs both come
from the CUDA allocator, as in the reference; the reserved growth of the backward is measured on
its first pass); and CPU runs use float32 (GPUs fp16 for GPT and T5, as the reference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from reproflow.context import ALL_GATHER, REDUCE_SCATTER, RunContext
from reproflow.errors import ParamError
from reproflow.families.aceso import resnet_ops, transformer_ops
from reproflow.families.aceso.database import FIELDS, OP_COLUMNS, P2P_LATENCY_FILE
from reproflow.families.aceso.models import GPT, RESNET, T5
from reproflow.families.aceso.tp import Env, Group, OpDef
from reproflow.family import Measurement
from reproflow.memory import SavedBytes
from reproflow.timing import time_steps

MB = 2**20
IMAGE = 224  # Wide-ResNet input side, as the reference (ImageNet)


def check(params: Mapping[str, Any], world_size: int) -> None:
    if params["kind"] == "p2p":
        if world_size != 2:
            raise ParamError(f"kind 'p2p' runs on 2 ranks, not {world_size}.", "a launch of 2 ranks")
        return
    if params["kind"] == "collectives":
        if world_size < 2:
            raise ParamError("kind 'collectives' needs 2 or more ranks.", "procs_per_node x nodes >= 2")
        parse_sizes(params["sizes_mb"])
        return
    world_size = tp_size(params, world_size)
    sizes = {"resnet": RESNET, "t5": T5}.get(params["model"], GPT)
    if params["size"] not in sizes:
        raise ParamError(f"'size' = {params['size']!r} is not a {params['model']} size.", ", ".join(sizes))
    if params["model"] == "resnet":
        base = RESNET[params["size"]][1]
        if base % world_size:
            raise ParamError(f"base channels ({base}) do not split over {world_size} TP ranks.",
                             "a TP size dividing them")
        return
    if params["model"] == "t5" and params["algo"] != 0:
        raise ParamError("'algo' = 1: T5 ops have partition algorithm 0 only, as in the reference.", "0")
    d = transformer_ops.dims(params["model"], params["size"], params["seq_len"])
    for what, n in (("heads", d.heads), ("ffn", d.ffn), ("vocab", d.vocab), ("hidden", d.hidden)):
        if n % world_size:
            raise ParamError(f"{what} ({n}) does not split over {world_size} TP ranks.", "a TP size dividing it")


def tp_size(params: Mapping[str, Any], world_size: int) -> int:
    """The TP size profiled: `tp`, or the job's world. The job runs world / tp TP groups at once,
    so every rank of a node is busy, as every GPU is in training (on a CPU, ranks share its cores)."""
    tp = params["tp"] or world_size
    if world_size % tp:
        raise ParamError(f"'tp' = {tp} does not divide the job's {world_size} ranks.", "a TP size dividing the ranks")
    return tp


def tp_group(ctx: RunContext, tp: int) -> Group:
    """This rank's TP group: consecutive blocks of `tp` ranks (created on every rank, in order)."""
    if tp == ctx.world_size:
        return Group(tp, ctx.rank, dist.group.WORLD if tp > 1 else None)
    mine = None
    for first in range(0, ctx.world_size, tp):
        pg = dist.new_group(list(range(first, first + tp))) if tp > 1 else None
        if first <= ctx.rank < first + tp:
            mine = pg
    return Group(tp, ctx.rank % tp, mine)


def op_defs(params: Mapping[str, Any]) -> list[OpDef]:
    """Every distinct op of the model, in model order."""
    mbs, algo = params["mbs"], params["algo"]
    if params["model"] == "resnet":
        blocks, base, width = RESNET[params["size"]]
        dims = resnet_ops.Dims(blocks, base, width, params["seq_len"] or IMAGE)
        return [resnet_ops.build(op, mbs, algo) for op in resnet_ops.op_list(dims)]
    d = transformer_ops.dims(params["model"], params["size"], params["seq_len"])
    names = transformer_ops.T5_OPS if d.t5 else transformer_ops.GPT_OPS
    return [transformer_ops.build(op, d, mbs, algo) for op in names]


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t.is_floating_point())


def _mean_over_ranks(ctx: RunContext, seconds: float) -> float:
    values = ctx.gather_floats(seconds)
    return sum(values) / len(values)


def profile_op(ctx: RunContext, tp: Group, op: OpDef, index: int, dtype: torch.dtype, warmup: int,
               repeats: int) -> dict[str, float]:
    """Forward and backward microseconds and sizes (MB) of one op on this rank's TP group."""
    weights = {k: w.random_local(tp.size, ctx.device, dtype) for k, w in op.weights.items()}
    inputs = [a.random(tp.size, 1, ctx.device, dtype) for a in op.ins]
    data = {k: a.random(tp.size, 1, ctx.device, dtype) for k, a in op.data.items()}
    env = Env(tp, data.__getitem__, key=(index,))

    def forward() -> tuple[torch.Tensor, ...]:
        return op.forward(env, weights, *inputs)

    cuda = ctx.device.type == "cuda"
    if cuda:  # the reference's measure: growth of allocated and reserved memory around one pass
        torch.cuda.synchronize(ctx.device)
        alloc0, res0 = torch.cuda.memory_allocated(ctx.device), torch.cuda.memory_reserved(ctx.device)
    with SavedBytes([*inputs, *weights.values()]) as saved:
        outputs = forward()
    old = saved.exclude | set(saved.storages)
    new_out = [o for o in outputs if o.untyped_storage().data_ptr() not in old]
    activations = saved.total + _bytes(new_out)
    fwd_reserved = bwd_reserved = 0.0
    if cuda:
        torch.cuda.synchronize(ctx.device)
        alloc1, res1 = torch.cuda.memory_allocated(ctx.device), torch.cuda.memory_reserved(ctx.device)
        activations = alloc1 - alloc0
        fwd_reserved = max(0.0, (res1 - res0) - (alloc1 - alloc0))
    ctx.barrier()
    # With autograd recording, as the runtime (and the reference's profiler) runs the forward pass: on
    # small ops the graph's bookkeeping is a good part of the time.
    fwd = time_steps(ctx.sync, forward, warmup, repeats)
    outs = [o for o in outputs if o.requires_grad]
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, grads, retain_graph=True)  # first pass: allocates the gradients
    if cuda:
        torch.cuda.synchronize(ctx.device)
        bwd_reserved = max(0.0, torch.cuda.memory_reserved(ctx.device) - res1)
    ctx.barrier()
    bwd = time_steps(ctx.sync, lambda: torch.autograd.backward(outs, grads, retain_graph=True), warmup, repeats)
    # The runtime's optimizer (Adam over the stage's weights) costs per op what it costs on the op's own.
    params = [w for w in weights.values() if w.grad is not None]
    ctx.barrier()
    optimizer = time_steps(ctx.sync, torch.optim.Adam(params).step, warmup, repeats) if params else 0.0
    return {
        "forward-compute": _mean_over_ranks(ctx, fwd) * 1e6,
        "backward-compute": _mean_over_ranks(ctx, bwd) * 1e6,
        "input_size": _bytes(inputs) / MB,
        "output_size": _bytes(list(outputs)) / MB,
        "weights": _bytes(list(weights.values())) / MB,
        "activations": activations / MB,
        "fwd_reserved": fwd_reserved / MB,
        "bwd_reserved": bwd_reserved / MB,
        "optimizer-step": _mean_over_ranks(ctx, optimizer) * 1e6,
    }


def parse_sizes(text: str) -> list[int]:
    """'0-16,32,64' -> [0, 1, ..., 16, 32, 64] (whole MB, as the collective tables are keyed)."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ParamError(f"'sizes_mb' = {text!r} is not a list of MB sizes.", "e.g. '0-16,32,64'") from None
    return sorted(out)


def collectives(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Time of all_gather, all_reduce, reduce_scatter and all_to_all over the job's ranks per whole MB
    (the full, gathered size; 0 MB is one element), as Aceso's comm profiler: ms per call."""
    dtype = torch.float16 if ctx.device.type == "cuda" else torch.float32
    n, esize = ctx.world_size, torch.empty(0, dtype=dtype).element_size()
    out = []
    for mb in parse_sizes(params["sizes_mb"]):
        count = max(n, mb * MB // esize // n * n)
        full = torch.randn(count, device=ctx.device, dtype=dtype)
        part = torch.randn(count // n, device=ctx.device, dtype=dtype)
        calls = {
            "all_gather": lambda: ALL_GATHER(full, part),  # noqa: B023
            "all_reduce": lambda: dist.all_reduce(full),  # noqa: B023
            "reduce_scatter": lambda: REDUCE_SCATTER(part, full),  # noqa: B023
            "all_to_all": lambda: dist.all_to_all_single(full.clone(), full),  # noqa: B023
        }
        for prim, call in calls.items():
            ctx.barrier()
            ms = _mean_over_ranks(ctx, time_steps(ctx.sync, call, params["warmup"], params["repeats"])) * 1000
            out.append(Measurement("time", ms, "ms", {"prim": prim, "size_mb": mb, "gpus": n}))
        ctx.log(f"  {mb} MB: " + ", ".join(f"{m.coords['prim']} {m.value:.3f} ms" for m in out[-4:]))
    return out


def p2p(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Rank 0 sends 1, 2, 4, ... MB to rank 1 (Aceso's p2p_band_profiler): GB/s per size. The link is
    'inter' when the two ranks are on different hosts."""
    dtype = torch.float16 if ctx.device.type == "cuda" else torch.float32
    hosts = ctx.hosts()
    link = "intra" if hosts[0] == hosts[1] else "inter"
    out = []
    one = torch.zeros(1, device=ctx.device, dtype=dtype)

    def ping() -> None:
        if ctx.rank == 0:
            dist.send(one, 1)
        elif ctx.rank == 1:
            dist.recv(one, 0)
    ctx.barrier()
    # The cost of a message of any size (the runtime model adds it to every stage boundary it crosses).
    latency = ctx.gather_floats(time_steps(ctx.sync, ping, params["warmup"], params["repeats"]))[1]
    out.append(Measurement("latency", latency * 1e6, "us", {"size_mb": 0, "link": link}))
    mb = 1
    while mb <= params["p2p_max_mb"]:
        buf = torch.randn(mb * MB // torch.empty(0, dtype=dtype).element_size(), device=ctx.device, dtype=dtype)

        def once() -> None:
            if ctx.rank == 0:
                dist.send(buf, 1)  # noqa: B023
            elif ctx.rank == 1:
                dist.recv(buf, 0)  # noqa: B023
        ctx.barrier()
        seconds = ctx.gather_floats(time_steps(ctx.sync, once, params["warmup"], params["repeats"]))[1]
        out.append(Measurement("bandwidth", mb / 1024 / seconds, "GB/s", {"size_mb": mb, "link": link}))
        mb *= 2
    ctx.log(f"  p2p {link}: latency {out[0].value:.1f} us, " + ", ".join(f"{m.coords['size_mb']} MB {m.value:.2f} GB/s"
                                                                      for m in out[1:]))
    return out


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Profile the ops, the collectives or the P2P bandwidth (`kind`); rank 0's rows are kept."""
    if params["kind"] == "collectives":
        return collectives(ctx, params)
    if params["kind"] == "p2p":
        return p2p(ctx, params)
    dtype = torch.float16 if ctx.device.type == "cuda" else torch.float32
    out: list[Measurement] = []
    tp = tp_group(ctx, tp_size(params, ctx.world_size))
    for index, op in enumerate(op_defs(params)):
        torch.manual_seed(1234 + index)
        values = profile_op(ctx, tp, op, index, dtype, params["warmup"], params["repeats"])
        coords = {"op": op.name, "op_index": index, "tp": tp.size}
        units = {"forward-compute": "us", "backward-compute": "us", "optimizer-step": "us"}
        out += [Measurement(k, v, units.get(k, "MB"), coords) for k, v in values.items()]
        ctx.log(f"  {op.name}: fwd {values['forward-compute']:.1f} us, bwd {values['backward-compute']:.1f} us")
    return out


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    """What the point adds to the database, as the reference's files show it."""
    if params["kind"] == "collectives":
        lines = ["collective,gpus,data_size(MB),time(ms)"]
        lines += [f"{m.coords['prim']},{m.coords['gpus']},{m.coords['size_mb']},{m.value:.3f}" for m in rows]
        return "\n".join(lines)
    if params["kind"] == "p2p":
        link = rows[0].coords["link"] if rows else "?"
        band = [m for m in rows if m.metric == "bandwidth"]
        latency = "".join(f"\n{P2P_LATENCY_FILE}: {m.value:.1f} us" for m in rows if m.metric == "latency")
        return (f"p2p_{link}_node.csv\n" + ",".join(str(m.coords["size_mb"]) for m in band) + "\n"
                + ",".join(f"{m.value:.2f}" for m in band) + latency)
    by_op: dict[str, dict[str, float]] = {}
    for m in rows:
        by_op.setdefault(m.coords["op"], {})[m.metric] = m.value
    lines = [",".join(OP_COLUMNS)]
    lines += [f"{op}," + ",".join(f"{v[f]:.3f}" for f in FIELDS) for op, v in by_op.items()]
    return "\n".join(lines)
