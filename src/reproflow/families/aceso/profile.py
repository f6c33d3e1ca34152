"""Aceso's op profiler as a reproflow family: every op of a model, really run on the job's ranks
(the TP group: gloo on CPU, NCCL on GPUs), timed forward and backward, with its sizes.

Per op and point (model, size, micro-batch, algo; TP size = the job's world size): forward time
and backward time (to the inputs and the weights) and Adam step, timed op by op in whole passes over
the ops as a training step runs them (median of `repeats` passes after `warmup`, or of more until they
take `repeat_seconds`, averaged over the ranks), input and output size (MB, carried tensors
included), weights per rank, activations (tensors the forward keeps for backward plus new
outputs) and reserved memory. `reproflow aceso database` writes these rows as Aceso's CSV files.

Differences from the reference profiler: the backward also computes weight gradients (the
reference differentiates with respect to the op inputs only); on CPU, activations are the tensors
autograd saves plus new outputs and reserved memory is 0 (no caching allocator; on GPUs both come
from the CUDA allocator, as in the reference; the reserved growth of the backward is measured on
its first pass); and CPU runs use float32 (GPUs fp16 for GPT and T5, as the reference).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from reproflow.families.aceso import resnet_ops, transformer_ops
from reproflow.families.aceso.database import FIELDS, OP_COLUMNS, P2P_LATENCY_FILE
from reproflow.families.aceso.models import GPT, RESNET, T5
from reproflow.families.aceso.tp import Env, Group, OpDef
from reproflow.rank.context import ALL_GATHER, REDUCE_SCATTER, RunContext
from reproflow.rank.memory import SavedBytes, keep_freed_memory
from reproflow.rank.timing import time_steps
from reproflow.spec.errors import ParamError
from reproflow.spec.family import Measurement

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


def computed(outputs: tuple[torch.Tensor, ...], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs a backward pass starts from: those that take a gradient, less the inputs an op hands
    on unchanged (a residual, attention's keys and values, the encoder's output). Training passes
    their gradients through at no cost; started from here they cost a copy into the input's gradient
    each (T5's decoder ops hand on two or three: its tiny model's backward profiled 25 % above what
    the runtime's backward took)."""
    return [o for o in outputs if o.requires_grad and not any(o is x for x in inputs)]


@dataclass
class Prepared:
    """One op ready to run on this rank's TP group: its weights, inputs and a forward call."""

    forward: Callable[[], tuple[torch.Tensor, ...]]
    inputs: list[torch.Tensor]
    weights: list[torch.Tensor]
    grads: list[torch.Tensor]  # one per computed output, as the backward pass feeds it
    values: dict[str, float]  # sizes and memory (MB)


def prepare_op(ctx: RunContext, tp: Group, op: OpDef, index: int, dtype: torch.dtype) -> Prepared:
    """An op's weights and inputs, and its sizes and memory (MB) from one forward and backward pass."""
    weights = {k: w.random_local(tp.size, ctx.device, dtype) for k, w in op.weights.items()}
    inputs = [a.random(tp.size, 1, ctx.device, dtype) for a in op.ins]
    # The data (images, token ids, labels) takes no gradient, as in training: the stem's backward computes
    # its weight's alone (the images' gradient was 21 % of the tiny Wide-ResNet's profiled backward).
    data = {k: a.random(tp.size, 1, ctx.device, dtype).requires_grad_(False) for k, a in op.data.items()}
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
    outs = computed(outputs, inputs)
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, grads)  # first pass: allocates the gradients
    if cuda:
        torch.cuda.synchronize(ctx.device)
        bwd_reserved = max(0.0, torch.cuda.memory_reserved(ctx.device) - res1)
    return Prepared(forward, inputs, [w for w in weights.values() if w.grad is not None], grads, {
        "input_size": _bytes(inputs) / MB,
        "output_size": _bytes(list(outputs)) / MB,
        "weights": _bytes(list(weights.values())) / MB,
        "activations": activations / MB,
        "fwd_reserved": fwd_reserved / MB,
        "bwd_reserved": bwd_reserved / MB,
    })


# GPU cycles the device waits before each timed op (about 1 ms on an H200 at 1.98 GHz), longer than
# the host takes to queue the op, so the op's events time the device's work alone.
HEAD_START_CYCLES = 2_000_000


@dataclass
class Lap:
    """One op's timing: the host's seconds in the call, and on CUDA the device's (from two events)."""

    host_s: float
    events: tuple[Any, Any] | None = None

    def device_s(self) -> float:
        """The device's seconds, once the stream has been synchronised (0 on CPUs: the host did the work)."""
        return self.events[0].elapsed_time(self.events[1]) / 1e3 if self.events else 0.0


def lap(ctx: RunContext, op: Callable[..., Any], *args: Any) -> tuple[Any, Lap]:
    """Run `op(*args)` and time it. On CPUs work is done when the call returns: the host's time is the
    op's. On CUDA the device is first given a head start (it sleeps while the host queues the op), so
    the events around the op time its kernels alone, and the host's time is its dispatch: in a
    training step, where nothing waits on the host between ops, an op costs the longer of the two.
    Timing each op with a host sync instead adds the sync's cost to every op, which a training step never
    pays (docs/aceso-results.md, on one GPU)."""
    if ctx.device.type != "cuda":
        begin = time.perf_counter()
        out = op(*args)
        return out, Lap(time.perf_counter() - begin)
    torch.cuda._sleep(HEAD_START_CYCLES)
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    begin = time.perf_counter()
    out = op(*args)
    host_s = time.perf_counter() - begin
    last.record()
    return out, Lap(host_s, (first, last))


def backward_call_s(ctx: RunContext, calls: int = 101) -> float:
    """Host seconds of a backward call through a one-element, one-node graph (the median of `calls`):
    what timing an op's backward on its own adds, which a training step, one call per stage, does not
    pay: tens of microseconds on a CPU, a large share of a tiny model's op."""
    x = torch.ones(1, device=ctx.device, requires_grad=True)
    grad = torch.ones(1, device=ctx.device)
    seconds = []
    for _ in range(calls):
        y = x * 1.0
        x.grad = None
        ctx.sync()
        seconds.append(lap(ctx, torch.autograd.backward, [y], [grad])[1].host_s)
    return sorted(seconds)[calls // 2]


def time_passes(ctx: RunContext, ops: list[Prepared], warmup: int, repeats: int,
                seconds: float = 0.0) -> list[dict[str, float]]:
    """Microseconds of each op's forward, backward and Adam step, timed op by op inside whole passes
    (forward in order with autograd recording, backward in reverse, then the optimizer), as a
    training step runs them; the median of `repeats` passes after `warmup`, or of more until the timed
    passes take `seconds` (the slowest rank's, so every rank runs as many), averaged over the ranks.
    A pass the scheduler preempts does not count, nor, with `seconds`, a slowdown of the whole
    machine shorter than half of them: 10 passes of the tiny T5's ops take under a second, and one
    such profile, right after a training at the usual speed, timed every op about 21 % slow.

    Not one op called over and over on its own tensors, as the reference times it: those stay in
    cache, and where more ranks than cores share a CPU a few short calls run either alone on a core or
    not at all (the scheduler's slices are milliseconds); with 4 ranks on 2 cores that timed small ops
    at a half to a quarter of what the runtime's op timers saw. An op's backward is timed without the
    cost of a backward call itself (`backward_call_s`) and without adding a gradient into a leaf input,
    neither of which training pays. On CUDA an op costs the longer of its kernels and its dispatch
    (`lap`)."""
    optimizers = [torch.optim.Adam(p.weights) if p.weights else None for p in ops]
    passes: list[np.ndarray] = []  # per pass: op x (forward, backward, step) seconds
    timed = 0.0
    call = backward_call_s(ctx)
    ctx.barrier()
    while len(passes) < warmup + repeats or timed < seconds:
        begin = time.perf_counter()
        laps: dict[tuple[int, int], Lap] = {}
        outputs = []
        for k, p in enumerate(ops):
            out, laps[k, 0] = lap(ctx, p.forward)
            outputs.append(computed(out, p.inputs))
        for k in reversed(range(len(ops))):
            for x in ops[k].inputs:  # training hands an input's gradient on; it adds none into a leaf
                x.grad = None
            laps[k, 1] = lap(ctx, torch.autograd.backward, outputs[k], ops[k].grads)[1]
        for k, opt in enumerate(optimizers):
            if opt is not None:
                laps[k, 2] = lap(ctx, opt.step)[1]
        ctx.sync()
        one = np.zeros((len(ops), 3))
        for (k, phase), t in laps.items():
            one[k, phase] = max(t.device_s(), t.host_s - (call if phase == 1 else 0.0), 0.0)
        passes.append(one)
        if seconds and len(passes) > warmup:
            timed += max(ctx.gather_floats(time.perf_counter() - begin))
    median = np.median(np.stack(passes[warmup:]), axis=0)
    return [{name: _mean_over_ranks(ctx, float(t[i])) * 1e6
             for i, name in enumerate(("forward-compute", "backward-compute", "optimizer-step"))} for t in median]


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

    def ping() -> None:  # a round trip, timed on rank 0: one-way sends timed on the receiver count
        if ctx.rank == 0:  # how late the sender started too (over a shaped link, 0.2 to 2 ms a message)
            dist.send(one, 1)
            dist.recv(one, 1)
        elif ctx.rank == 1:
            dist.recv(one, 0)
            dist.send(one, 0)
    ctx.barrier()
    # The cost of a message of any size (the runtime model adds it to every stage boundary it crosses).
    latency = ctx.gather_floats(time_steps(ctx.sync, ping, params["warmup"], max(params["repeats"], 100)))[0] / 2
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
    keep_freed_memory()  # as the runtime: ops timed in the memory state of a training process
    out: list[Measurement] = []
    tp = tp_group(ctx, tp_size(params, ctx.world_size))
    defs = op_defs(params)
    prepared = []
    for index, op in enumerate(defs):
        torch.manual_seed(1234 + index)
        prepared.append(prepare_op(ctx, tp, op, index, dtype))
    times = time_passes(ctx, prepared, params["warmup"], params["repeats"], params["repeat_seconds"])
    for index, (op, p, t) in enumerate(zip(defs, prepared, times, strict=True)):
        values = {"forward-compute": t["forward-compute"], "backward-compute": t["backward-compute"], **p.values,
                  "optimizer-step": t["optimizer-step"]}
        coords = {"op": op.name, "op_index": index, "tp": tp.size}
        out += [Measurement(k, v, "us" if k in t else "MB", coords) for k, v in values.items()]
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
