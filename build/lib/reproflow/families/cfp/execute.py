"""Capture a training step (or one segment of it) as an ATen graph, and run the graph under a plan on a mesh.

A plan is one strategy per ParallelBlock. The runner interprets the graph with DTensors on a 1-D or
2-D DeviceMesh (gloo on CPUs, NCCL on GPUs; on 2-D a partition has one entry per axis): every
parameter is stored with the partition its block's strategy gives it, every contraction's operands
are redistributed to its strategy's partitions, and
DTensor's own propagation runs everything in between, communicating where partitions disagree
(block boundaries). Gradients are brought to their parameter's partition (the data-parallel
all-reduce where the parameter is replicated, in buckets as the backward pass makes them) and an SGD
update is applied, so a timed call is a whole training step. The peak of live local bytes is tracked
as the plan's memory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import register_sharding
from torch.fx.experimental.proxy_tensor import make_fx

from reproflow.families.cfp import graph, models
from reproflow.families.cfp.graph import Analysis, R

LR = 1e-3


@register_sharding(torch.ops.reproflow_cfp.heads_matmul.default)
def _heads_matmul_sharding(a: Any, b: Any) -> list[tuple[list[Any], list[Any]]]:
    """DTensor's strategies for attention's matmul (models.heads_matmul), as graph.strategies lists them:
    split the batch, the heads, the rows or the columns, or the contraction (partial sums)."""
    return [([Replicate()], [Replicate(), Replicate()]), ([Shard(0)], [Shard(0), Shard(0)]),
            ([Shard(1)], [Shard(1), Shard(1)]), ([Shard(2)], [Shard(2), Replicate()]),
            ([Shard(3)], [Replicate(), Shard(3)]), ([Partial()], [Shard(3), Shard(2)])]



def placement(p: int, mesh_size: int = 2) -> list[Any]:
    """DTensor placements of partition p. On a one-device mesh every partition is the whole tensor, so
    Replicate: some torch releases (2.11) refuse views of a dimension sharded even over one device."""
    return [Replicate()] if p == R or mesh_size == 1 else [Shard(p)]


def placements(p: int | tuple[int, ...], mesh: DeviceMesh) -> list[Any]:
    """DTensor placements of a partition on `mesh`: an int on a 1-D mesh, one entry per axis on a 2-D one."""
    if isinstance(p, tuple):
        return [placement(q, mesh.size(i))[0] for i, q in enumerate(p)]
    return placement(p, mesh.size())


@dataclass
class Captured:
    """A step's graph, its analysis, and example inputs (parameters first)."""

    analysis: Analysis
    params: dict[str, torch.Tensor]
    inputs: list[torch.Tensor]  # the step's other inputs: tokens and targets, or activation and its gradient
    input_placements: list[Any]  # partitions: ints on a 1-D mesh, tuples (one per axis) on a 2-D one


def capture(module: nn.Module, inputs: Sequence[torch.Tensor], n: int, kind: str,
            input_placements: Sequence[Any] = (), mesh: tuple[int, ...] = ()) -> Captured:
    """Capture `module`'s training step and analyse it for n devices. kind "model": inputs are
    (tokens, targets) and the step returns the loss; "layer": (x, dy) -> y and the gradients of x;
    "head": (x, targets) -> loss and the gradient of x. Gradients of every parameter follow."""
    params = {k: v.detach() for k, v in module.named_parameters()}

    def step(params: dict[str, torch.Tensor], a: torch.Tensor, b: torch.Tensor) -> Any:
        if kind == "model":
            loss = torch.func.functional_call(module, params, (a, b))
            return loss, torch.autograd.grad(loss, list(params.values()))
        if kind == "head":
            loss = torch.func.functional_call(module, params, (a, b))
            return loss, torch.autograd.grad(loss, [a, *params.values()])
        y = torch.func.functional_call(module, params, (a,))
        return y, torch.autograd.grad(y, [a, *params.values()], b)

    example = [x.detach().requires_grad_(kind != "model" and i == 0 and x.is_floating_point())
               for i, x in enumerate(inputs)]
    gm = graph.capture(step, {k: v.requires_grad_() for k, v in params.items()}, *example)
    holders = [nd for nd in gm.graph.nodes if nd.op == "placeholder"]
    names = dict(zip(holders, params, strict=False))
    a = graph.analyse(gm, names, n, mesh)
    return Captured(a, params, list(inputs), list(input_placements) or [_replicated(a)] * len(inputs))


def _replicated(a: Analysis) -> Any:
    """The replicated partition on the analysis's mesh."""
    return (R,) * len(a.mesh) if a.mesh else R


Assignment = Mapping[fx.Node, graph.Strategy | graph.MeshStrategy]


def assignment(a: Analysis, choice: Sequence[int]) -> dict[fx.Node, graph.Strategy | graph.MeshStrategy]:
    """Every contraction's strategy under a plan of one strategy (on the mesh) per ParallelBlock."""
    if len(choice) != len(a.blocks):
        raise ValueError(f"a plan needs {len(a.blocks)} strategies, one per ParallelBlock; got {len(choice)}")
    return {c: a.plan(b, c, k) for b, k in zip(a.blocks, choice, strict=True) for c in b.plans}


def param_placements(a: Analysis, assign: Assignment) -> dict[fx.Node, Any]:
    """Each parameter's stored partition: the one its first contraction (in graph order) uses it with
    (on a 2-D mesh, axis by axis); an addmm's bias split where the output's columns are (Megatron's
    column-parallel bias), else replicated: a replicated bias of a column-split layer has a split gradient,
    gathered every step."""
    out: dict[fx.Node, Any] = {}
    for c in a.contractions():
        s = assign[c]
        for y, want in zip(graph.operands(c), (s.lhs, s.rhs), strict=True):
            if y not in a.param_of:
                continue
            wants = want if isinstance(want, tuple) else (want,)
            q = tuple(graph.stored(y, a.param_of[y], w, a.n) for w in wants)
            if None not in q:
                out.setdefault(a.param_of[y], q if isinstance(want, tuple) else q[0])
        if graph.op_name(c) == "addmm" and c.args[0] in a.param_of:
            cols = s.out if isinstance(s.out, tuple) else R if s.allreduce else s.out
            bias = tuple(0 if p == 1 else R for p in cols) if isinstance(cols, tuple) else 0 if cols == 1 else R
            out.setdefault(a.param_of[c.args[0]], bias)
    return out


@dataclass
class StepResult:
    outputs: list[Any]  # the graph's outputs as DTensors (loss or y, then gradients)
    seconds: float
    peak_bytes: int


class Runner:
    """Runs a captured step on a mesh with a strategy for every contraction (a plan)."""

    def __init__(self, cap: Captured, mesh: DeviceMesh, assign: Assignment) -> None:
        a = cap.analysis
        self.cap, self.mesh = cap, mesh
        self.nodes = list(a.graph.graph.nodes)
        self.forced = {c: (s.lhs, s.rhs) for c, s in assign.items()}
        pplace = param_placements(a, assign)
        holders = [nd for nd in self.nodes if nd.op == "placeholder"]
        self.holder_places = [pplace.get(nd, _replicated(a)) for nd in holders[:len(cap.params)]] + \
            cap.input_placements
        last: dict[fx.Node, int] = {}
        for i, nd in enumerate(self.nodes):
            for x in nd.all_input_nodes:
                last[x] = i
        self.free_after: dict[int, list[fx.Node]] = {}
        for nd, i in last.items():
            self.free_after.setdefault(i, []).append(nd)
        self.values = [distribute_tensor(v.detach().clone(), mesh, placements(p, mesh)) for v, p in
                       zip([*cap.params.values(), *cap.inputs], self.holder_places, strict=True)]
        self.replicate_at = _read_whole(a, assign)
        out = next(nd for nd in self.nodes if nd.op == "output")
        self.grad_of = {nd: i for i, nd in enumerate(pytree.tree_leaves(out.args[0])[-len(cap.params):])}

    def _wrap(self, x: Any) -> Any:
        # Factory ops (ones, arange, zeros) make plain tensors, on the device the graph was traced on:
        # the same on every rank, so replicated.
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
            return DTensor.from_local(x.to(self.mesh.device_type), self.mesh, [Replicate()] * self.mesh.ndim,
                                      run_check=False)
        return x

    def compute(self, values: Sequence[DTensor], track: bool = False) -> tuple[list[Any], list[DTensor], int]:
        """The graph on `values` (parameters, then inputs): its other outputs (loss or y, gradients of
        inputs), the parameters' gradients on their parameters' partitions, and (track) the peak of live
        bytes."""
        env: dict[fx.Node, Any] = {}
        live = peak = 0
        outputs: list[Any] = []
        holders = iter(values)
        nparams = len(self.cap.params)
        buckets = _Buckets(self.mesh, values[:nparams])
        for i, nd in enumerate(self.nodes):
            if nd.op == "placeholder":
                env[nd] = self._whole_once(nd, next(holders))
            elif nd.op == "call_function":
                args = fx.node.map_aggregate(fx.node.map_arg(nd.args, env.__getitem__), self._wrap)
                kwargs = fx.node.map_aggregate(fx.node.map_arg(nd.kwargs, env.__getitem__), self._wrap)
                if nd in self.forced:
                    args = self._force(nd, list(args))
                env[nd] = self._whole_once(nd, self._reduced_once(nd, nd.target(*args, **kwargs)))
                if nd in self.grad_of:
                    buckets.add(self.grad_of[nd], env[nd])
                if track:
                    live += _bytes(env[nd])
                    peak = max(peak, live)
            elif nd.op == "output":
                outputs = pytree.tree_leaves(fx.node.map_arg(nd.args[0], env.__getitem__))
            for x in self.free_after.get(i, ()):
                gone = env.pop(x)
                live -= _bytes(gone) if track and x.op != "placeholder" else 0
        return outputs[:-nparams], buckets.finish(outputs[-nparams:]), peak

    def _reduced_once(self, nd: fx.Node, value: Any) -> Any:
        """Partial sums read by several operators are summed here, once: the residual stream's sums after a
        split contraction are read by the next norm and again by its backward, and each read summed them
        anew (an all-reduce the profiled segments never showed, 8 of them a step on GPT)."""
        if len(nd.users) < 2 or not isinstance(value, DTensor) or not any(isinstance(p, Partial)
                                                                           for p in value.placements):
            return value
        return value.redistribute(self.mesh, [Replicate() if isinstance(p, Partial) else p for p in value.placements])

    def _whole_once(self, nd: fx.Node, value: Any) -> Any:
        """A value several contractions read whole (each through its own view or transpose) is made whole
        here, once: a batch-split gradient handed back to a tensor-parallel layer was gathered by each of its
        readers, twice a layer where the search priced one all-gather at the boundary."""
        if nd not in self.replicate_at or not isinstance(value, DTensor):
            return value
        want = [Replicate()] * self.mesh.ndim
        return value if list(value.placements) == want else value.redistribute(self.mesh, want)

    def step(self, update: bool = True) -> StepResult:
        """One step: the graph, gradients to their parameters' partitions, and (update) SGD on the parameters."""
        dist.barrier()
        t0 = time.perf_counter()
        outputs, grads, peak = self.compute(self.values, track=True)
        nparams = len(self.cap.params)
        if update:
            for i, g in enumerate(grads):
                self.values[i] = (self.values[i] - LR * g).detach()
        for o in outputs + grads:
            o.to_local().sum().item()  # waits for the collectives still in flight
        elapsed = time.perf_counter() - t0
        dist.barrier()
        peak += sum(_bytes(v) for v in self.values[:nparams])
        self.last = StepResult(outputs + grads, elapsed, peak)
        return self.last

    def seconds(self) -> float:
        """One training step; this rank's seconds (timing.slowest_steps takes the slowest rank's)."""
        return self.step().seconds

    def _force(self, nd: fx.Node, args: list[Any]) -> tuple[Any, ...]:
        lhs, rhs = self.forced[nd]
        i = 1 if graph.op_name(nd) == "addmm" else 0
        for j, p in ((i, lhs), (i + 1, rhs)):
            want = placements(p, self.mesh)
            if tuple(args[j].placements) != tuple(want):
                args[j] = args[j].redistribute(self.mesh, want)
        return tuple(args)


class _Buckets:
    """Gradients brought to their parameters' partitions as the backward pass makes them. Partial sums on
    the axes where the parameter is replicated (the data-parallel gradients) are all-reduced as flat
    buffers, a bucket as soon as it holds its share of bytes (DDP's: 1 MiB first, then 25 MiB), so that
    their communication overlaps the rest of the backward pass as DDP's does; the rest are redistributed
    one by one at the end."""

    FIRST, CAP = 1 << 20, 25 << 20  # DistributedDataParallel's first bucket and its bucket_cap_mb default

    def __init__(self, mesh: DeviceMesh, params: Sequence[DTensor]) -> None:
        self.mesh, self.params = mesh, params
        self.open: dict[tuple[int, ...], list[tuple[int, DTensor]]] = {}
        self.sent: list[tuple[list[tuple[int, DTensor]], torch.Tensor]] = []  # buckets and their all-reduces
        self.cap = self.FIRST

    def add(self, i: int, g: Any) -> None:
        """Parameter i's gradient, just made: into its axes' bucket, all-reduced when the bucket is full."""
        pl = self.params[i].placements
        axes = tuple(k for k, (x, y) in enumerate(zip(g.placements, pl, strict=True))
                     if isinstance(x, Partial) and isinstance(y, Replicate))
        if not axes or any(k not in axes and x != y for k, (x, y) in enumerate(zip(g.placements, pl, strict=True))):
            return
        bucket = self.open.setdefault(axes, [])
        bucket.append((i, g))
        if sum(x.to_local().numel() * x.element_size() for _, x in bucket) >= self.cap:
            self._reduce(axes)
            self.cap = self.CAP

    def _reduce(self, axes: tuple[int, ...]) -> None:
        # Functional all-reduces: the same collectives eagerly, and ones a lowered step can hold (their
        # waits are moved to the first reader, see Lowered); nothing reads them before finish().
        bucket = self.open.pop(axes)
        flat = torch.cat([g.to_local().reshape(-1) for _, g in bucket])
        for k in axes:
            flat = funcol.all_reduce(flat, "sum", (self.mesh, k) if self.mesh.ndim > 1 else self.mesh)
        self.sent.append((bucket, flat))

    def finish(self, grads: list[DTensor]) -> list[DTensor]:
        """Every gradient on its parameter's partition: the last buckets reduced, the others redistributed."""
        for axes in list(self.open):
            self._reduce(axes)
        bucketed = {i for bucket, _ in self.sent for i, _ in bucket}
        out = [g if i in bucketed else g.redistribute(self.mesh, p.placements)
               for i, (g, p) in enumerate(zip(grads, self.params, strict=True))]
        for bucket, flat in self.sent:
            for (i, g), piece in zip(bucket, flat.split([g.to_local().numel() for _, g in bucket]), strict=True):
                out[i] = DTensor.from_local(piece.view_as(g.to_local()), self.mesh, self.params[i].placements,
                                            run_check=False)
        return out


class Lowered:
    """A plan's step lowered once to local ATen ops and functional collectives (make_fx traces the
    DTensor runner: placements are propagated and redistributions decided while tracing), then run
    as that plain graph. The same computation and communication as Runner, without DTensor's per-op
    dispatch, which on small models costs more than a plan saves."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.nparams = len(runner.cap.params)
        self.places = [tuple(v.placements) for v in runner.values]
        # The same tensors live as in the DTensor runner; tracking them while tracing would put a view of
        # every output into the graph (to_local), doubling its nodes.
        self.peak_bytes = runner.step(update=False).peak_bytes
        self.locals = [v.to_local() for v in runner.values]
        self.out_places: list[tuple[Any, ...]] = []
        t0 = time.perf_counter()
        # On fake tensors: DTensor decides the same local ops and collectives without running them, and
        # a step's trace takes half the time it takes on real tensors (measured on the tiny models).
        self.graph = _waits_at_readers(make_fx(self._traced, tracing_mode="fake")(*self.locals))
        self.trace_s = time.perf_counter() - t0

    def _traced(self, *local: torch.Tensor) -> list[torch.Tensor]:
        """The runner's step on DTensors made from local tensors; local outputs (outputs, gradients,
        then the updated parameters)."""
        mesh = self.runner.mesh
        values = [DTensor.from_local(x, mesh, p, run_check=False) for x, p in zip(local, self.places, strict=True)]
        outputs, grads, _ = self.runner.compute(values)
        self.out_places = [tuple(o.placements) for o in outputs + grads]
        # Each gradient is on its parameter's partition: SGD on the local shards, one op for all of them.
        new = torch._foreach_add(list(local[:self.nparams]), [g.to_local() for g in grads], alpha=-LR)
        return [o.to_local() for o in outputs + grads] + list(new)

    def collectives(self) -> list[tuple[str, float]]:
        """Each collective the step's graph runs, (its name, its output bytes): what the plan communicates, as
        the runtime decided it, to hold a cost model against."""
        out = []
        for nd in self.graph.graph.nodes:
            if nd.op == "call_function" and "_c10d_functional" in str(nd.target) and "wait" not in str(nd.target):
                val = nd.meta.get("val")
                out.append((str(nd.target).split(".")[-2], float(val.numel() * val.element_size()) if val is not None
                            else 0.0))
        return out

    def step(self, update: bool = True) -> StepResult:
        """One step of the lowered graph (and, update, the parameters it computed)."""
        dist.barrier()
        t0 = time.perf_counter()
        out = self.graph(*self.locals)
        n = len(out) - self.nparams
        if update:
            self.locals[:self.nparams] = [t.detach() for t in out[n:]]
        if self.runner.mesh.device_type == "cuda":
            torch.cuda.synchronize()  # the graph waited for its collectives; the device may still be working
        elapsed = time.perf_counter() - t0
        dist.barrier()
        mesh = self.runner.mesh
        self.last = StepResult([DTensor.from_local(o, mesh, p, run_check=False)
                                for o, p in zip(out[:n], self.out_places, strict=True)], elapsed, self.peak_bytes)
        return self.last

    def seconds(self) -> float:
        """One training step; this rank's seconds."""
        return self.step().seconds


def _waits_at_readers(gm: fx.GraphModule) -> fx.GraphModule:
    """The graph with each collective's wait moved to just before the first op that reads its result.
    Traced, a functional collective's wait follows it at once, so a gradient bucket's all-reduce would hold
    up the rest of the backward pass; eagerly the wait happens at the first read, as here."""
    order = {nd: i for i, nd in enumerate(gm.graph.nodes)}
    for nd in list(gm.graph.nodes):
        if nd.op == "call_function" and nd.target is torch.ops._c10d_functional.wait_tensor.default:
            readers = [u for u in (*nd.users, *nd.args[0].users) if u is not nd]
            if readers:
                min(readers, key=order.__getitem__).prepend(nd)
    gm.recompile()
    return gm


def _read_whole(a: Analysis, assign: Assignment) -> set[fx.Node]:
    """The values (not parameters) that two or more contraction operands read replicated, each through its
    own chain of layout ops (views, transposes, clones) back to the value."""
    readers: dict[fx.Node, set[fx.Node]] = {}
    for c, s in assign.items():
        for y, want in zip(graph.operands(c), (s.lhs, s.rhs), strict=True):
            if y in a.param_of or any(w != R for w in (want if isinstance(want, tuple) else (want,))):
                continue
            readers.setdefault(graph.layout_chain(y)[-1], set()).add(y)
    return {root for root, ys in readers.items() if len(ys) > 1}


def _bytes(x: Any) -> int:
    return sum(t.to_local().numel() * t.element_size() for t in pytree.tree_leaves(x) if isinstance(t, DTensor))


def errors(model: str, c: models.ModelConfig, batch_size: int, loss: float,
           grads: Sequence[torch.Tensor]) -> tuple[float, float]:
    """A step's loss and full gradients (in parameter order) against the unsharded model's on this process:
    the absolute loss error and the largest gradient error relative to that gradient's largest entry."""
    ref = models.build(model, c)
    ref_loss = ref(*models.batch(c, batch_size))
    ref_loss.backward()
    grad_err = max(float((g.cpu() - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-30))  # type: ignore[union-attr]
                   for g, p in zip(grads, ref.parameters(), strict=True))
    return abs(loss - float(ref_loss.detach())), grad_err
