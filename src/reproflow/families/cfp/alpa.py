"""The Alpa-style baseline: every contraction picks its own strategy by an integer linear program.

As Alpa's intra-operator pass (on a 1-D mesh): each contraction has the strategies of graph.py; a
strategy costs its communication (an all-reduce of the output for a split contraction), an edge
between a producing and a consuming contraction costs the resharding of the tensor between them
(nothing when the partition propagates, a slice from replicated, an all-gather otherwise, as
DTensor does it on this mesh), and a parameter pays for bringing its gradient to the partition it
is stored with (all-reduce, reduce-scatter or all-gather). Compute is the same for every split, so
like Alpa the model leaves it out. The program is solved with HiGHS (scipy.optimize.milp); the
runner then executes the assignment like any other plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch.fx as fx
import torch.utils._pytree as pytree
from scipy.optimize import Bounds, LinearConstraint, milp

from reproflow.families.cfp import graph
from reproflow.families.cfp.graph import Analysis, R, Strategy


@dataclass
class Solution:
    assign: dict[fx.Node, Strategy]
    predicted_s: float
    seconds: float  # building and solving the program
    variables: int


def _bytes(node: fx.Node) -> float:
    val = node.meta.get("val")
    return float(val.numel() * val.element_size()) if val is not None and hasattr(val, "numel") else 0.0


def reshard_s(src: int | None, dst: int, nbytes: float, n: int, bandwidth: float) -> float:
    """Seconds to bring a tensor from partition src (None: partial sums) to dst."""
    if src is None:  # all-reduce to replicated, reduce-scatter to a split
        return (2 if dst == R else 1) * (n - 1) / n * nbytes / bandwidth
    if src in (dst, R):
        return 0.0
    return (n - 1) / n * nbytes / bandwidth  # all-gather (and a local chunk for a split to another dim)


def _producers(x: fx.Node, contractions: set[fx.Node]) -> set[fx.Node]:
    out, seen, todo = set(), set(), [x]
    while todo:
        y = todo.pop()
        if y in seen:
            continue
        seen.add(y)
        if y in contractions:
            out.add(y)
        elif y.op == "call_function":
            todo.extend(y.all_input_nodes)
    return out


def _arrives(a: Analysis, c: fx.Node, s: Strategy, x: fx.Node, order: dict[fx.Node, int]) -> int | None:
    """The partition operand x has when contraction c runs strategy s and its output propagates to x
    without communication; R when the propagation breaks (the all-gather happens on the way)."""
    placed: dict[fx.Node, int] = {c: R if s.allreduce else s.out}
    for nd in list(a.graph.graph.nodes)[order[c] + 1:order[x] + 1]:
        if nd.op != "call_function" or not any(i in placed for i in nd.all_input_nodes):
            continue
        q = graph.propagate(nd, placed, lambda _: True, a.n)
        if q is not None:
            placed[nd] = q
    q = placed.get(x)
    return q if isinstance(q, int) else R


def solve(a: Analysis, bandwidth: float) -> Solution:
    """The cheapest assignment of a strategy to every contraction under the cost model above."""
    t0 = time.perf_counter()
    cons = a.contractions()
    cset = set(cons)
    order = {nd: i for i, nd in enumerate(a.graph.graph.nodes)}
    strat = {c: graph.strategies(c, a.n) for c in cons}
    var = {}
    cost: list[float] = []
    for c in cons:
        for i, s in enumerate(strat[c]):
            var[c, i] = len(cost)
            cost.append(reshard_s(None, R, _bytes(c), a.n, bandwidth) if s.allreduce else 0.0)
    pairs: list[tuple[int, int, int]] = []  # (edge variable, x variable, y variable)

    def edge(ci: int, dj: int, price: float) -> None:
        if price > 0:
            pairs.append((len(cost), ci, dj))
            cost.append(price)

    for d in cons:
        for k, x in enumerate(graph.operands(d)):
            if x in a.param_of:
                continue
            for c in _producers(x, cset):
                if order[c] >= order[d]:
                    continue
                for i, s in enumerate(strat[c]):
                    q = _arrives(a, c, s, x, order)
                    for j, t in enumerate(strat[d]):
                        edge(var[c, i], var[d, j], reshard_s(q, (t.lhs, t.rhs)[k], _bytes(x), a.n, bandwidth))
    _gradient_edges(a, cons, strat, var, edge, bandwidth)
    nvar = len(cost)
    rows, lo, hi = [], [], []
    for c in cons:  # one strategy per contraction
        row = np.zeros(nvar)
        row[[var[c, i] for i in range(len(strat[c]))]] = 1
        rows.append(row), lo.append(1), hi.append(1)
    for e, xi, yj in pairs:  # e >= x_i + y_j - 1
        row = np.zeros(nvar)
        row[[e, xi, yj]] = [1, -1, -1]
        rows.append(row), lo.append(-1), hi.append(np.inf)
    integral = np.zeros(nvar)
    integral[:len(var)] = 1
    res = milp(np.array(cost), constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integral,
               bounds=Bounds(0, 1))
    if res.x is None:
        raise RuntimeError(f"the Alpa-style program has no solution: {res.message}")
    assign = {c: strat[c][max(range(len(strat[c])), key=lambda i: res.x[var[c, i]])] for c in cons}
    return Solution(assign, float(res.fun), time.perf_counter() - t0, nvar)


def _gradient_edges(a: Analysis, cons: list[fx.Node], strat: dict[fx.Node, list[Strategy]],
                    var: dict[tuple[fx.Node, int], int], edge: Callable[[int, int, float], None],
                    bandwidth: float) -> None:
    """A parameter is stored as its first contraction uses it; its gradient, made by a backward contraction,
    is brought to that partition (the data-parallel all-reduce when the parameter is replicated)."""
    out = next(nd for nd in a.graph.graph.nodes if nd.op == "output")
    params = list(a.param_names)
    grads = pytree.tree_leaves(out.args[0])[-len(params):]
    first: dict[fx.Node, tuple[fx.Node, int, fx.Node]] = {}
    for c in cons:
        for k, y in enumerate(graph.operands(c)):
            if y in a.param_of and a.param_of[y] not in first:
                first[a.param_of[y]] = (c, k, y)
    for p, g in zip(params, grads, strict=True):
        chain = [g]
        while chain[-1] not in strat and chain[-1].op == "call_function" and graph.op_name(chain[-1]) in graph.LAYOUT:
            chain.append(chain[-1].all_input_nodes[0])
        src = chain[-1]
        if p not in first or src not in strat:
            continue  # e.g. a bias gradient, a sum: left to the runtime
        c, k, y = first[p]
        for i, s in enumerate(strat[src]):
            at: int | None = None
            if not s.allreduce:
                at = s.out
                for z in reversed(chain[:-1]):
                    q = graph.propagate(z, {z.all_input_nodes[0]: at}, lambda _: True, a.n)
                    at = q if isinstance(q, int) else _GATHERED
            for j, t in enumerate(strat[c]):
                stored = graph.stored(y, p, (t.lhs, t.rhs)[k], a.n)
                if stored is not None:
                    edge(var[src, i], var[c, j], reshard_s(at, stored, _bytes(p), a.n, bandwidth))


_GATHERED = -9  # a partition the propagation lost: reaching any other costs an all-gather
