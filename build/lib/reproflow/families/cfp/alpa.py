"""The Alpa-style baseline: every contraction picks its own strategy by an integer linear program.

As Alpa's intra-operator pass (on a 1-D mesh): each contraction has the strategies of graph.py; a
strategy costs its communication (an all-reduce of the output for a split contraction, and what
moves at every operator after it that its output's partition cannot pass: an all-gather for a norm
over a split hidden dim, an all-reduce of the partial sums a sum over it leaves), an edge between a
producing and a consuming contraction costs the resharding of the tensor between them (nothing when
the partition propagates, a slice from replicated, an all-gather otherwise, as DTensor does it on
this mesh), and a parameter pays for bringing its
gradient to the partition it is stored with (all-reduce, reduce-scatter or all-gather). A collective
costs as in Alpa's model, alpha per ring step plus its bytes over the bandwidth, both fitted to
all-gathers measured on the job's link (`fit_link`): without alpha, many small tensor-parallel
collectives look free. Compute is the same for every split, so like Alpa the model leaves it out.
The program is solved with HiGHS (scipy.optimize.milp); the runner then executes the assignment like
any other plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.fx as fx
import torch.utils._pytree as pytree
from scipy.optimize import Bounds, LinearConstraint, milp, nnls

from reproflow.families.cfp import graph
from reproflow.families.cfp.graph import Analysis, R, Strategy


@dataclass
class Solution:
    assign: dict[fx.Node, Strategy]
    predicted_s: float
    seconds: float  # building and solving the program
    variables: int
    terms: Terms  # the cost model it minimised, to price other assignments with


def _bytes(node: fx.Node) -> float:
    val = node.meta.get("val")
    return float(val.numel() * val.element_size()) if val is not None and hasattr(val, "numel") else 0.0


@dataclass(frozen=True)
class Link:
    """Alpa's collective cost: `alpha` seconds a ring step, and bytes over `bandwidth` (bytes/s)."""

    bandwidth: float
    alpha: float = 0.0

    def ring(self, phases: int, nbytes: float, n: int) -> float:
        """Seconds of `phases` ring passes (all-gather or reduce-scatter: 1; all-reduce: 2) of nbytes on n."""
        return phases * (n - 1) * (self.alpha + nbytes / n / self.bandwidth)


def fit_link(samples: list[tuple[float, float]], n: int) -> Link:
    """alpha and bandwidth fitted by non-negative least squares to (bytes, seconds) of all-gathers on n
    devices: seconds = (n - 1) * alpha + (n - 1) / n * bytes / bandwidth."""
    design = np.array([[n - 1, (n - 1) / n * b] for b, _ in samples])
    (alpha, per_byte), _ = nnls(design, np.array([t for _, t in samples]))
    if per_byte <= 0:
        raise ValueError(f"all-gather times {samples} do not grow with their size: no bandwidth to fit")
    return Link(1 / per_byte, float(alpha))


def traced_s(collectives: list[tuple[str, float]], n: int, link: Link) -> float:
    """Seconds of the collectives a plan's lowered step runs (execute.Lowered.collectives) at the link:
    an all-reduce two ring passes, the others one."""
    return sum(link.ring(2 if name == "all_reduce" else 1, nbytes, n) for name, nbytes in collectives)


def reshard_s(src: int | None, dst: int, nbytes: float, n: int, link: Link) -> float:
    """Seconds to bring a tensor from partition src (None: partial sums) to dst."""
    if n == 1:  # one device holds everything: nothing moves
        return 0.0
    if src is None:  # all-reduce to replicated, reduce-scatter to a split
        return link.ring(2 if dst == R else 1, nbytes, n)
    if src in (dst, R):
        return 0.0
    return link.ring(1, nbytes, n)  # all-gather (and a local chunk for a split to another dim)


def _producers(x: fx.Node, contractions: set[fx.Node]) -> set[fx.Node]:
    """The contractions whose outputs reach x through other operators."""
    return graph.upstream(x, contractions.__contains__, lambda y: y in contractions or y.op != "call_function")


def _spread(a: Analysis, c: fx.Node, s: Strategy, order: dict[fx.Node, int], contractions: set[fx.Node]
            ) -> tuple[dict[fx.Node, Any], list[tuple[int, float]]]:
    """Contraction c's output partition under strategy s, carried through every operator after it that reads
    it (forward and backward) up to the contractions that read it, and the collectives on the way as (ring
    passes, bytes): where the partition cannot pass an operator, the operator's output is replicated."""
    placed: dict[fx.Node, Any] = {c: R if s.allreduce else s.out}  # a list for an operator of several outputs
    moved: list[tuple[int, float]] = []
    for nd in list(a.graph.graph.nodes)[order[c] + 1:]:
        if nd.op != "call_function" or nd in contractions or not any(i in placed for i in nd.all_input_nodes):
            continue
        q = graph.propagate(nd, placed, lambda _: True, a.n)
        if q is None:
            moved += _broken(nd, placed)
            q = R
        placed[nd] = q
    return placed, moved


def _broken(nd: fx.Node, placed: dict[fx.Node, Any]) -> list[tuple[int, float]]:
    """What the runtime moves where a split input stops at `nd`: a norm over the split dim or a softmax along
    it gathers the input (an all-gather); a sum or mean over it leaves partial sums, all-reduced when read.
    Operators the propagation rules do not know are left unpriced, as before these rules."""
    name, first = graph.op_name(nd), nd.args[0]
    p = placed.get(first) if isinstance(first, fx.Node) else None
    if not isinstance(p, int) or p == R:
        return []
    rank = len(graph.shape(first) or ())
    if name in ("native_layer_norm", "native_layer_norm_backward"):
        normalized = len(nd.args[2 if name.endswith("backward") else 1])
        return [(1, _bytes(x)) for x in nd.all_input_nodes if placed.get(x, R) != R] if p >= rank - normalized else []
    if name in graph.ALONG_DIM and next(x for x in nd.args if isinstance(x, int)) % rank == p:
        return [(1, _bytes(first))]
    if name in graph.REDUCE:
        return [(2, _bytes(nd))]
    return []


@dataclass
class Terms:
    """The cost model on a graph: each contraction's strategies, the cost of choosing one, and the cost of
    each pair of choices (producer strategy i, consumer strategy j) that reshards between them."""

    strat: dict[fx.Node, list[Strategy]]
    node: dict[tuple[fx.Node, int], float]
    edges: list[tuple[fx.Node, int, fx.Node, int, float]]

    def cost(self, assign: dict[fx.Node, Strategy]) -> float:
        """The modelled cost of an assignment (seconds; bytes moved when bandwidth is 1)."""
        pick = {c: self.strat[c].index(s) for c, s in assign.items()}
        return sum(self.node[c, pick[c]] for c in pick) + sum(
            v for c, i, d, j, v in self.edges if pick[c] == i and pick[d] == j)


def terms(a: Analysis, link: Link) -> Terms:
    """Alpa's per-strategy and resharding costs on the graph (see the module's docstring)."""
    cons = a.contractions()
    cset = set(cons)
    order = {nd: i for i, nd in enumerate(a.graph.graph.nodes)}
    strat = {c: graph.strategies(c, a.n) for c in cons}
    spread = {(c, i): _spread(a, c, s, order, cset) for c in cons for i, s in enumerate(strat[c])}
    t = Terms(strat, {(c, i): (reshard_s(None, R, _bytes(c), a.n, link) if s.allreduce else 0.0)
                      + sum(link.ring(phases, b, a.n) for phases, b in spread[c, i][1])
                      for c in cons for i, s in enumerate(strat[c])}, [])
    for d in cons:
        for k, x in enumerate(graph.operands(d)):
            if x in a.param_of:
                continue
            for c in sorted(_producers(x, cset), key=order.__getitem__):  # a fixed order: the same program
                if order[c] >= order[d]:                                    # on every rank
                    continue
                for i in range(len(strat[c])):
                    q = spread[c, i][0].get(x, R)
                    q = q if isinstance(q, int) else R
                    for j, u in enumerate(strat[d]):
                        t.edges.append((c, i, d, j, reshard_s(q, (u.lhs, u.rhs)[k], _bytes(x), a.n, link)))
    first = _first_uses(a)
    _weight_edges(a, t, link, first)
    _gradient_edges(a, t, link, first)
    t.edges = [e for e in t.edges if e[4] > 0]
    return t


def solve(a: Analysis, link: Link) -> Solution:
    """The cheapest assignment of a strategy to every contraction, as an integer linear program:
    x_ci = 1 when c runs strategy i, e >= x_ci + x_dj - 1 for every priced pair."""
    t0 = time.perf_counter()
    t = terms(a, link)
    var = {key: k for k, key in enumerate(t.node)}
    cost = list(t.node.values()) + [e[4] for e in t.edges]
    nvar = len(cost)
    rows, lo, hi = [], [], []
    for c, options in t.strat.items():  # one strategy per contraction
        row = np.zeros(nvar)
        row[[var[c, i] for i in range(len(options))]] = 1
        rows.append(row), lo.append(1), hi.append(1)
    for k, (c, i, d, j, _) in enumerate(t.edges):
        row = np.zeros(nvar)
        row[[len(var) + k, var[c, i], var[d, j]]] = [1, -1, -1]
        rows.append(row), lo.append(-1), hi.append(np.inf)
    integral = np.zeros(nvar)
    integral[:len(var)] = 1
    res = milp(np.array(cost), constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integral,
               bounds=Bounds(0, 1))
    if res.x is None:
        raise RuntimeError(f"the Alpa-style program has no solution: {res.message}")
    assign = {c: opts[max(range(len(opts)), key=lambda i: res.x[var[c, i]])] for c, opts in t.strat.items()}
    return Solution(assign, float(res.fun), time.perf_counter() - t0, nvar, t)


def _first_uses(a: Analysis) -> dict[fx.Node, tuple[fx.Node, int, fx.Node]]:
    """Each parameter's first use by a contraction (in graph order): (the contraction, which operand, the
    operand: the parameter or a layout view of it). The parameter is stored as that use wants it."""
    first: dict[fx.Node, tuple[fx.Node, int, fx.Node]] = {}
    for c in a.contractions():
        for k, y in enumerate(graph.operands(c)):
            if y in a.param_of and a.param_of[y] not in first:
                first[a.param_of[y]] = (c, k, y)
    return first


def _weight_edges(a: Analysis, t: Terms, link: Link, first: dict[fx.Node, tuple[fx.Node, int, fx.Node]]) -> None:
    """Every later use of a parameter that wants it in another partition than it is stored with gathers it
    there, each step (a weight split one way for its forward GEMM and another for a backward one: the
    runtime's all-gathers of weights, which the program did not price before)."""
    for d in a.contractions():
        for k, x in enumerate(graph.operands(d)):
            if x not in a.param_of or first[a.param_of[x]][:2] == (d, k):
                continue
            p = a.param_of[x]
            c, k0, y = first[p]
            for i, s in enumerate(t.strat[c]):
                kept = graph.stored(y, p, (s.lhs, s.rhs)[k0], a.n)
                for j, u in enumerate(t.strat[d]):
                    need = graph.stored(x, p, (u.lhs, u.rhs)[k], a.n)
                    if kept is not None and need is not None and c is not d:
                        t.edges.append((c, i, d, j, reshard_s(kept, need, _bytes(p), a.n, link)))


def _gradient_edges(a: Analysis, t: Terms, link: Link, first: dict[fx.Node, tuple[fx.Node, int, fx.Node]]) -> None:
    """A parameter is stored as its first contraction uses it; its gradient, made by a backward contraction,
    is brought to that partition (from partial sums the contraction's own all-reduce, priced once)."""
    out = next(nd for nd in a.graph.graph.nodes if nd.op == "output")
    params = list(a.param_names)
    grads = pytree.tree_leaves(out.args[0])[-len(params):]
    strat = t.strat
    for p, g in zip(params, grads, strict=True):
        chain = graph.layout_chain(g, strat.__contains__)
        src = chain[-1]
        if p not in first or src not in strat:
            continue  # e.g. a bias gradient, a sum: left to the runtime
        c, k, y = first[p]
        for i, s in enumerate(strat[src]):
            at: int | None = R  # a split contraction's all-reduce is its own cost already (Terms.node)
            if not s.allreduce:
                at = s.out
                for z in reversed(chain[:-1]):
                    q = graph.propagate(z, {z.all_input_nodes[0]: at}, lambda _: True, a.n)
                    at = q if isinstance(q, int) else _GATHERED
            for j, u in enumerate(strat[c]):
                stored = graph.stored(y, p, (u.lhs, u.rhs)[k], a.n)
                if stored is not None:
                    t.edges.append((src, i, c, j, reshard_s(at, stored, _bytes(p), a.n, link)))


_GATHERED = -9  # a partition the propagation lost: reaching any other costs an all-gather
