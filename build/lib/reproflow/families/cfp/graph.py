"""CFP's analysis pass on the ATen graph of a training step: contraction strategies, ParallelBlocks, segments.

The step (forward, loss, backward) is captured with make_fx on fake tensors: the PyTorch counterpart
of the XLA HLO the reference analyses. On a 1-D mesh of n devices a tensor is replicated (R, -1 here)
or split on one dim (S(d), d here). Every tensor contraction (mm, addmm, bmm, and attention's
heads_matmul) has a few strategies: split the rows, split the columns, split the contraction
(partial sums, then an all-reduce), and split the batch (bmm) or the batch or the heads (heads_matmul).

A ParallelBlock starts at a contraction no block covers yet (its entry). For each entry strategy the
output partition is propagated through later operators by rules that need no communication: pointwise
ops keep it, reshapes and transposes move it, reductions and softmaxes over another dim keep it.
Parameters and constants take any partition for free (a parameter is stored split; a constant is
sliced). An operator joins the block when every entry strategy propagates through it; a contraction
joins with the strategy its propagated operand implies. A backward contraction that reads an operand
of the block (the weight of a linear, or its saved input) joins it with the strategy that operand's
partition implies, so a block's one choice fixes its forward and backward GEMMs, as in the reference.
Blocks of one half layer (attention, or the MLP / experts) form a segment; segments with the same
operators and shapes map to one profiled unique segment. On a 2-D mesh each block takes one of its
1-D strategies per mesh axis (Analysis.choices, MeshStrategy).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

R = -1  # replicated; a non-negative int is the split dim

LAYOUT = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "clone", "detach",
          "alias", "contiguous", "unsqueeze", "squeeze", "_to_copy", "lift_fresh_copy"}
POINTWISE = {"add", "sub", "mul", "div", "where", "masked_fill", "gelu", "silu", "relu", "neg", "exp", "rsqrt",
             "pow", "sqrt", "tanh", "sigmoid", "cos", "sin", "bitwise_not", "logical_not", "eq", "ne", "lt", "gt",
             "le", "ge", "gelu_backward", "silu_backward", "threshold_backward", "tanh_backward",
             "sigmoid_backward", "fill", "zeros_like", "ones_like", "full_like", "reciprocal", "abs",
             "scalar_tensor"}
ALONG_DIM = {"_softmax", "_log_softmax", "cumsum", "_softmax_backward_data", "_log_softmax_backward_data"}
REDUCE = {"sum", "mean", "amax", "argmax", "amin", "argmin"}
SPLIT = {"split", "split_with_sizes", "chunk", "unbind"}
CONTRACTION = {"mm", "addmm", "bmm", "heads_matmul"}
FACTORY = {"arange", "ones", "zeros", "full", "empty", "scalar_tensor", "tril", "triu", "outer", "rand", "randn"}


def op_name(node: fx.Node) -> str:
    """The ATen overload packet's name (aten.view.default -> view), or the Python function's."""
    t = node.target
    packet = getattr(t, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(t, "__name__", str(t))


def shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(int(s) for s in val.shape) if isinstance(val, torch.Tensor) else None


@dataclass(frozen=True)
class Strategy:
    """One way to run a contraction on the mesh: the split of each operand and of the output
    (R or a dim); `allreduce` when the output holds partial sums."""

    lhs: int
    rhs: int
    out: int
    allreduce: bool

    def text(self, ranks: tuple[int, int, int]) -> str:
        """Alpa's notation, one letter per dim: `SR = SR x RR`, `RR = RS x SR (allreduce)`."""
        def spec(p: int, n: int) -> str:
            return "".join("S" if d == p else "R" for d in range(n))
        s = f"{spec(self.out, ranks[2])} = {spec(self.lhs, ranks[0])} x {spec(self.rhs, ranks[1])}"
        return s + (" (allreduce)" if self.allreduce else "")


@dataclass(frozen=True)
class MeshStrategy:
    """A contraction's strategy on a 2-D mesh: one 1-D strategy per mesh axis. Partitions are then
    tuples, one entry per axis (the same dim split on both axes is split over all devices, as
    Alpa's S01)."""

    axes: tuple[Strategy, ...]

    @property
    def lhs(self) -> tuple[int, ...]:
        return tuple(s.lhs for s in self.axes)

    @property
    def rhs(self) -> tuple[int, ...]:
        return tuple(s.rhs for s in self.axes)

    @property
    def out(self) -> tuple[int, ...]:
        return tuple(R if s.allreduce else s.out for s in self.axes)

    @property
    def allreduce(self) -> bool:
        return any(s.allreduce for s in self.axes)

    def text(self, ranks: tuple[int, int, int]) -> str:
        """The seed's notation: `SS = SR x RS @ {0,1}` (each split dim's mesh axes, in the output's dim
        order then the operands'), `(allreduce @ 1)` for the axes holding partial sums."""
        def spec(parts: tuple[int, ...], n: int) -> tuple[str, list[str]]:
            letters, where = "", []
            for d in range(n):
                axes = "".join(str(i) for i, p in enumerate(parts) if p == d)
                letters += "S" if axes else "R"
                where += [axes] if axes else []
            return letters, where

        (o, wo), (a, wa), (b, wb) = (spec(self.out, ranks[2]), spec(self.lhs, ranks[0]), spec(self.rhs, ranks[1]))
        seen = list(dict.fromkeys(wo + wa + wb))
        text = f"{o} = {a} x {b} @ {{{','.join(seen)}}}"
        partial = [str(i) for i, s in enumerate(self.axes) if s.allreduce]
        return text + (f" (allreduce @ {','.join(partial)})" if partial else "")


def strategies(node: fx.Node, n: int) -> list[Strategy]:
    """The strategies of a contraction on n devices whose split dims divide by n."""
    a, b = (node.args[1], node.args[2]) if op_name(node) == "addmm" else (node.args[0], node.args[1])
    sa, sb = shape(a), shape(b)
    assert sa is not None and sb is not None
    if len(sa) == 2:  # [m, k] x [k, n]
        cands = [(Strategy(0, R, 0, False), sa[0]), (Strategy(R, 1, 1, False), sb[1]),
                 (Strategy(1, 0, R, True), sa[1])]
    elif len(sa) == 3:  # [b, m, k] x [b, k, n]
        cands = [(Strategy(0, 0, 0, False), sa[0]), (Strategy(1, R, 1, False), sa[1]),
                 (Strategy(R, 2, 2, False), sb[2]), (Strategy(2, 1, R, True), sa[2])]
    else:  # heads_matmul: [b, heads, m, k] x [b, heads, k, n]
        cands = [(Strategy(0, 0, 0, False), sa[0]), (Strategy(1, 1, 1, False), sa[1]),
                 (Strategy(2, R, 2, False), sa[2]), (Strategy(R, 3, 3, False), sb[3]),
                 (Strategy(3, 2, R, True), sa[3])]
    return [s for s, size in cands if size % n == 0]


def layout_chain(x: fx.Node, stop: Callable[[fx.Node], bool] = lambda _: False) -> list[fx.Node]:
    """x, then what it is a layout op (view, transpose, clone, ...) of, and so on back to the first node that is
    not one or that `stop` accepts, which ends the list."""
    chain = [x]
    while not stop(chain[-1]) and chain[-1].op == "call_function" and op_name(chain[-1]) in LAYOUT and \
            isinstance(chain[-1].args[0], fx.Node):
        chain.append(chain[-1].args[0])
    return chain


def operands(node: fx.Node) -> tuple[fx.Node, fx.Node]:
    a, b = (node.args[1], node.args[2]) if op_name(node) == "addmm" else (node.args[0], node.args[1])
    assert isinstance(a, fx.Node) and isinstance(b, fx.Node)
    return a, b


def _reshape(src: Sequence[int], dst: Sequence[int], p: int, n: int) -> int | None:
    """Where a split of dim p of `src` lands in `dst`, if the same contiguous chunks stay on each device."""
    if p == R:
        return R
    before = math.prod(src[:p])
    for j in range(len(dst)):
        if math.prod(dst[:j]) == before and dst[j] % n == 0 and src[p] % n == 0:
            if (dst[j] >= src[p] and dst[j] % src[p] == 0) or (dst[j] < src[p] and src[p] % dst[j] == 0):
                return j
            return None
    return None


def _dims(node: fx.Node, arg: Any) -> list[int]:
    rank = len(shape(node.args[0]) or ())
    dims = arg if isinstance(arg, (list, tuple)) else [arg]
    return [d % rank for d in dims] if rank else []


def propagate(node: fx.Node, placed: dict[fx.Node, int], free: Callable[[fx.Node], bool], n: int) -> Any:
    """The output partition of `node` (a dim, R, or a list for tuple outputs) given the partitions of its
    inputs in `placed`; None when the operator would need communication. Inputs not placed must be free."""
    name = op_name(node)
    tensors = [a for a in node.all_input_nodes if shape(a) is not None or op_name(a) in SPLIT | {"native_layer_norm"}]
    ins = [a for a in tensors if a in placed]
    if not ins or any(a not in placed and not free(a) for a in tensors):
        return None
    out = shape(node)
    if name == "getitem":
        src = placed[node.args[0]]
        return src[node.args[1]] if isinstance(src, list) else src
    if name in CONTRACTION:
        s = implied(node, placed, free, n)
        return None if s is None else R if s.allreduce else s.out
    if name == "cat":  # pieces split alike, joined along another dim (rotary embedding's halves)
        parts = {placed.get(x) for x in node.args[0]} if all(x in placed for x in node.args[0]) else {None}
        dim = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(out or (0,))
        q = parts.pop() if len(parts) == 1 else None
        return q if isinstance(q, int) and q != dim else None
    first = node.args[0]
    p = placed.get(first) if isinstance(first, fx.Node) else None
    if name in POINTWISE or name in ALONG_DIM:
        if out is None:
            return None
        dims = set()
        for a in ins:
            q = placed[a]
            if q == R:
                continue
            sa = shape(a) or ()
            d = q + len(out) - len(sa)
            if sa[q] != out[d]:
                return None
            dims.add(d)
        if len(dims) > 1:
            return None
        d = dims.pop() if dims else R
        if name in ALONG_DIM and d != R and next(x for x in node.args if isinstance(x, int)) % len(out) == d:
            return None
        if d != R and out[d] % n:
            return None
        return d
    if not isinstance(p, int) or len(ins) != 1 or ins[0] is not first:
        return None
    src = shape(first) or ()
    if p == R:
        return [R] * 3 if name in SPLIT | {"native_layer_norm"} else R
    if name in ("view", "_unsafe_view", "reshape"):
        return _reshape(src, out or (), p, n)
    if name in ("clone", "detach", "alias", "contiguous", "_to_copy", "lift_fresh_copy"):
        return p
    if name == "t":
        return 1 - p
    if name == "transpose":
        d0, d1 = (int(d) % len(src) for d in node.args[1:3])
        return d1 if p == d0 else d0 if p == d1 else p
    if name == "permute":
        return [int(d) % len(src) for d in node.args[1]].index(p)
    if name == "expand":
        shift = len(node.args[1]) - len(src)
        return p + shift if src[p] > 1 else None
    if name == "unsqueeze":
        d = int(node.args[1]) % (len(src) + 1)
        return p + (d <= p)
    if name == "squeeze" and len(node.args) > 1:
        ds = _dims(node, node.args[1])
        return None if p in ds else p - sum(d < p for d in ds)
    if name == "slice":  # a slice along another dim than the split one
        dim = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(src)
        return None if dim == p else p
    if name in SPLIT:
        dim = int(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(src)
        return None if dim == p else [p] * len(node.meta["val"])
    if name in REDUCE:
        if len(node.args) < 2:
            return None
        ds = _dims(node, node.args[1])
        keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        return None if p in ds else p if keep else p - sum(d < p for d in ds)
    if name == "native_layer_norm":
        return [p] * 3 if p < len(src) - len(node.args[1]) else None
    if name == "embedding":  # (weight, indices): the weight is a free parameter
        return None
    return None


def implied(node: fx.Node, placed: dict[fx.Node, Any], free: Callable[[fx.Node], bool], n: int) -> Strategy | None:
    """The strategy of a contraction that its placed operands allow with no communication: a split operand
    must be used split as it is, a replicated or free operand can be sliced. Row splits win ties."""
    a, b = operands(node)
    for s in strategies(node, n):
        if all((x in placed and placed[x] in (R, want)) or (x not in placed and free(x))
               for x, want in ((a, s.lhs), (b, s.rhs))):
            return s
    return None


@dataclass
class Block:
    """A ParallelBlock: its entry contraction, member nodes, and per entry strategy the partition of each
    member and the strategy of each member contraction."""

    index: int
    entry: fx.Node
    strategies: list[Strategy]
    members: list[fx.Node] = field(default_factory=list)
    placements: list[dict[fx.Node, Any]] = field(default_factory=list)
    # per strategy: the partition of members, of the operands contractions use and of stored parameters
    known: list[dict[fx.Node, Any]] = field(default_factory=list)
    plans: dict[fx.Node, list[Strategy]] = field(default_factory=dict)
    layer: str = ""
    n: int = 1

    def signature(self) -> tuple:
        """What makes two blocks interchangeable: their operators, shapes and contraction plans."""
        return tuple((op_name(m), shape(m)) for m in self.members) + tuple(
            (op_name(c), tuple((s.lhs, s.rhs) for s in plan)) for c, plan in self.plans.items())


@dataclass
class Analysis:
    graph: fx.GraphModule
    blocks: list[Block]
    segments: list[tuple[int, int]]
    mapped: list[int]  # per segment, the index of the segment it maps to (the first with the same signature)
    param_names: dict[fx.Node, str]
    param_of: dict[fx.Node, fx.Node]  # a parameter, or a layout view of one -> the parameter
    n: int
    seconds: float
    mesh: tuple[int, ...] = ()  # axis sizes of a 2-D mesh; () for a 1-D mesh of n devices

    def contractions(self) -> list[fx.Node]:
        return [nd for nd in self.graph.graph.nodes if op_name(nd) in CONTRACTION]

    def unique_segments(self) -> list[int]:
        return sorted(set(self.mapped))

    def choices(self, b: Block) -> list[tuple[int, ...]]:
        """A block's strategies on the mesh, as indices into its 1-D strategies, one per axis. On a 2-D
        mesh: the same strategy on both axes (over all devices), then data parallelism (the first
        strategy splitting the batch or rows) on axis 0 with each other strategy on axis 1, as Megatron
        with data parallelism; not every pair, which would square a segment's profiled space."""
        k = range(len(b.strategies))
        if len(self.mesh) < 2:
            return [(i,) for i in k]
        data = next((i for i in k if b.strategies[i].lhs == 0 and not b.strategies[i].allreduce), None)
        return [(i, i) for i in k] + ([(data, j) for j in k if j != data] if data is not None else [])

    def search_space(self, segment: int) -> list[int]:
        lo, hi = self.segments[segment]
        return [len(self.choices(b)) for b in self.blocks[lo:hi]]

    def plan(self, b: Block, c: fx.Node, choice: int) -> Strategy | MeshStrategy:
        """Contraction c's strategy when its block b takes its `choice`-th strategy on the mesh."""
        pick = self.choices(b)[choice]
        return b.plans[c][pick[0]] if len(pick) == 1 else MeshStrategy(tuple(b.plans[c][i] for i in pick))

    def operator_space(self, segment: int) -> int:
        """Per-operator enumeration: the product of every contraction's strategy count in the segment."""
        lo, hi = self.segments[segment]
        return math.prod(len(strategies(c, b.n)) for b in self.blocks[lo:hi] for c in b.plans)

    def flops(self) -> float:
        """FLOPs of one step: 2 m n k per contraction (forward and backward GEMMs of the graph)."""
        total = 0.0
        for nd in self.contractions():
            a, b = operands(nd)
            sa, sb = shape(a) or (), shape(b) or ()
            total += 2 * math.prod(sa) * sb[-1]
        return total


def upstream(start: fx.Node, keep: Callable[[fx.Node], bool], stop: Callable[[fx.Node], bool]) -> set[fx.Node]:
    """The nodes `keep` accepts among those met walking back from `start` through inputs, going no further
    back than nodes `stop` accepts."""
    out, seen, todo = set(), set(), [start]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        if keep(x):
            out.add(x)
        if not stop(x):
            todo.extend(x.all_input_nodes)
    return out


def capture(step: Callable[..., Any], *inputs: Any) -> fx.GraphModule:
    """The ATen graph of `step` traced on fake tensors (no memory, any size)."""
    return make_fx(step, tracing_mode="fake")(*inputs)


def analyse(gm: fx.GraphModule, param_names: dict[fx.Node, str], n: int, mesh: tuple[int, ...] = ()) -> Analysis:
    """Grow ParallelBlocks on the graph for n devices, assign them to layers by their parameters' names
    and map repeated segments (see the module's docstring). On a 2-D `mesh` (axis sizes, product n)
    the blocks are the 1-D ones over all n devices, each axis taking one of their strategies
    (Analysis.choices): a split that divides by n divides by each axis."""
    t0 = time.perf_counter()
    nodes = list(gm.graph.nodes)
    order = {nd: i for i, nd in enumerate(nodes)}
    const: set[fx.Node] = set()
    for nd in nodes:  # constants: computed from factory ops only
        if nd.op == "call_function" and (op_name(nd) in FACTORY or (nd.all_input_nodes and all(
                a in const for a in nd.all_input_nodes))):
            const.add(nd)
    param_of: dict[fx.Node, fx.Node] = {}  # a layout view of a parameter -> the parameter
    for nd in nodes:
        if nd in param_names:
            param_of[nd] = nd
        elif nd.op == "call_function" and op_name(nd) in LAYOUT and nd.args[0] in param_of:
            param_of[nd] = param_of[nd.args[0]]

    def free(x: fx.Node) -> bool:
        return x in const or x in param_of

    covered: set[fx.Node] = set()
    blocks: list[Block] = []
    for nd in nodes:
        if op_name(nd) not in CONTRACTION or nd in covered:
            continue
        if _attach(nd, blocks, n):
            covered.add(nd)
            continue
        block = Block(len(blocks), nd, strategies(nd, n), n=n)
        block.placements = [{nd: s.out if not s.allreduce else R} for s in block.strategies]
        block.known = [dict(p) for p in block.placements]
        block.plans[nd] = list(block.strategies)
        _record(block, nd, param_of, n)
        block.members.append(nd)
        for m in nodes[order[nd] + 1:]:
            if m in covered or m.op != "call_function" or not any(a in block.placements[0] for a in m.all_input_nodes):
                continue
            outs = [propagate(m, pl, free, n) for pl in block.placements]
            if any(o is None for o in outs):
                continue
            if op_name(m) in CONTRACTION:
                plan = [implied(m, pl, free, n) for pl in block.placements]
                if any(s is None for s in plan):
                    continue
                block.plans[m] = plan  # type: ignore[assignment]
                outs = [R if s.allreduce else s.out for s in plan]  # type: ignore[union-attr]
            for pl, known, o in zip(block.placements, block.known, outs, strict=True):
                pl[m] = known[m] = o
            if m in block.plans:
                _record(block, m, param_of, n)
            block.members.append(m)
            covered.add(m)
        covered.add(nd)
        blocks.append(block)
    layer_re = re.compile(r"^(layers\.\d+\.\d+)\.")
    prev = "prologue"
    for b in blocks:
        names = [param_names[param_of[x]] for c in b.plans for x in operands(c) if x in param_of]
        layers = [m.group(1) if (m := layer_re.match(s)) else s.split(".")[0] for s in names]
        b.layer = layers[0] if layers else prev
        prev = b.layer
    segments: list[tuple[int, int]] = []
    for i, b in enumerate(blocks):
        if segments and blocks[segments[-1][0]].layer == b.layer:
            segments[-1] = (segments[-1][0], i + 1)
        else:
            segments.append((i, i + 1))
    sigs = [tuple(blocks[j].signature() for j in range(lo, hi)) for lo, hi in segments]
    mapped = [sigs.index(s) for s in sigs]
    return Analysis(gm, blocks, segments, mapped, param_names, param_of, n, time.perf_counter() - t0,
                    tuple(mesh) if len(mesh) > 1 else ())


def _attach(nd: fx.Node, blocks: list[Block], n: int) -> bool:
    """Join a backward contraction to the block whose forward made what it reads: a layer's weight or saved
    input. Of the blocks that know one of its operands (walking back through views and transposes) that
    is the earliest; the gradient it also reads was made later, often by the next layer's or the head's
    block, where it is replicated and would leave the contraction's strategy free (the weight's gradient
    then came out split the other way and was gathered every step). Per strategy of the block, the
    contraction takes the strategy that the block's partitions of its operands imply; where those allow
    none, the strategy one operand implies, the first operand first."""
    found: dict[int, dict[fx.Node, list[Any]]] = {}
    alone: list[tuple[int, dict[fx.Node, list[Any]]]] = []
    for x in operands(nd):
        chain = layout_chain(x, lambda y: any(y in b.known[0] for b in blocks))
        block = next((b for b in blocks if chain[-1] in b.known[0]), None)
        if block is None:
            continue
        parts = []
        for known in block.known:
            q = known[chain[-1]]
            for z in reversed(chain[:-1]):
                q = None if q is None else propagate(z, {z.args[0]: q}, lambda _: True, n)
            parts.append(q)
        if None not in parts:
            found.setdefault(block.index, {})[x] = parts
            alone.append((block.index, {x: parts}))
    for index, placed in [*sorted(found.items()), *alone]:
        block = blocks[index]
        plan = [implied(nd, {x: parts[k] for x, parts in placed.items()}, lambda _: True, n)
                for k in range(len(block.known))]
        if None not in plan:
            block.plans[nd] = plan  # type: ignore[assignment]
            _record(block, nd, {}, n)
            return True
    return False


def _record(block: Block, c: fx.Node, param_of: dict[fx.Node, fx.Node], n: int) -> None:
    """Remember, per strategy, the partition each operand of contraction c is used with, and for a view of
    a parameter the partition the parameter is stored with."""
    for k, known in enumerate(block.known):
        s = block.plans[c][k]
        for y, want in zip(operands(c), (s.lhs, s.rhs), strict=True):
            known.setdefault(y, want)
            if y in param_of and (q := stored(y, param_of[y], want, n)) is not None:
                known.setdefault(param_of[y], q)


def stored(view: fx.Node, param: fx.Node, want: int, n: int) -> int | None:
    """The partition `param` is stored with so that its layout view `view` (a transpose, a reshape) has
    partition `want`; None when no stored partition gives it without communication."""
    z, q = view, want
    while z is not param and q is not None:
        src = z.args[0]
        q = next((c for c in range(R, len(shape(src) or ())) if propagate(z, {src: c}, lambda _: True, n) == q),
                 None)
        z = src
    return q


def describe(a: Analysis) -> str:
    """The analysis pass's printout, in the reference's form."""
    lines = []
    index = {nd: i for i, nd in enumerate(a.graph.graph.nodes)}
    for b in a.blocks:
        lines.append(f"Parallel Block {b.index}:  ({b.layer})")
        for m in b.members + [c for c in b.plans if c not in b.members]:
            lines.append(f"    {index[m]} {m.format_node()}")
            if m in b.plans:
                lines.append("    Plan: " + "".join(f"{strategies(m, b.n).index(s)}, " for s in b.plans[m]))
    for (lo, hi), k in zip(a.segments, a.mapped, strict=True):
        lines.append(f"ParallelBlocks sequence: ({lo}, {hi}) mapped to  {a.segments[k]}")
    lines.append(f"global analysis time: {a.seconds}")
    return "\n".join(lines)


def strategy_map(a: Analysis) -> str:
    """Every contraction and its available strategies, like the reference's strategy_map.txt; on a 2-D
    mesh, the strategies its block's choices give it, in the seed's notation."""
    index = {nd: i for i, nd in enumerate(a.graph.graph.nodes)}
    owner = {c: b for b in a.blocks for c in b.plans}
    out = []
    for nd in a.contractions():
        x, y = operands(nd)
        out.append(f"Instruction {index[nd]}: {nd.format_node()}  {shape(x)} x {shape(y)} -> {shape(nd)}")
        ranks = (len(shape(x) or ()), len(shape(y) or ()), len(shape(nd) or ()))
        options = (strategies(nd, a.n) if not a.mesh else
                   dict.fromkeys(a.plan(owner[nd], nd, k) for k in range(len(a.choices(owner[nd])))))
        out.extend(f"Strategy {s.text(ranks)}" for s in options)
    return "\n".join(out) + "\n"
