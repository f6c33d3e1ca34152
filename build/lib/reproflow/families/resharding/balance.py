"""Alpa's load-balance solvers (`ReshardingLoadBalancingTaskSolver` and friends), deterministic.

A work is one unit task seen by the solver: the workers (hosts; one NIC per host is assumed) that
hold its data, the workers that receive it, and its duration in bytes. A solver returns the
sender worker of each work and the order in which the works are issued. Every rank computes the
plan itself, so the randomised greedy solver draws from a seeded generator and the depth-first
search stops after a number of visited nodes instead of Alpa's 1 s wall-clock budget: both give
the same plan on every rank and in every run.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

GREEDY_ROUNDS = 100  # random permutations tried per concurrent set, as in Alpa
SEARCH_BUDGET = 20000  # nodes the depth-first search may visit


@dataclass(frozen=True)
class Work:
    senders: tuple[int, ...]
    receivers: tuple[int, ...]
    duration: int


Solution = tuple[list[int], list[int]]  # (sender worker per work, issue order)


def over_size(works: list[Work], n_workers: int) -> Solution:
    """loadbalance_size: in natural order, each work goes to its least-loaded sender."""
    loads = [0] * n_workers
    senders = []
    for w in works:
        s = min(w.senders, key=lambda x: loads[x])
        loads[s] += w.duration
        senders.append(s)
    return senders, list(range(len(works)))


def greedy_order(works: list[Work], n_workers: int, seed: int, rounds: int = GREEDY_ROUNDS) -> Solution:
    """loadbalance_order (greedy): repeatedly issue the largest set of works that can run at once.

    A set admits a work when none of its receivers is busy and one of its senders is free; the
    sender is drawn with weight (max load - load + 1). Of `rounds` random permutations the largest
    set wins, ties going to the smallest spread of loads afterwards.
    """
    rng = random.Random(seed)
    loads = [0] * n_workers
    senders: list[int] = [-1] * len(works)
    order: list[int] = []
    while len(order) < len(works):
        placed = set(order)
        remaining = [i for i in range(len(works)) if i not in placed]
        best: tuple[int, float, list[int], list[int]] | None = None
        for _ in range(rounds):
            used: set[int] = set()
            ids: list[int] = []
            chosen: list[int] = []
            for i in rng.sample(remaining, len(remaining)):
                w = works[i]
                free = [s for s in w.senders if s not in used]
                if not free or any(r in used for r in w.receivers):
                    continue
                top = max(loads[s] for s in free)
                s = rng.choices(free, weights=[top - loads[s] + 1 for s in free])[0]
                used.add(s)
                used.update(w.receivers)
                ids.append(i)
                chosen.append(s)
            trial = list(loads)
            for i, s in zip(ids, chosen, strict=True):
                trial[s] += works[i].duration
            spread = statistics.pstdev(trial)
            if best is None or len(ids) > best[0] or (len(ids) == best[0] and spread < best[1]):
                best = (len(ids), spread, ids, chosen)
        assert best is not None
        for i, s in zip(best[2], best[3], strict=True):
            order.append(i)
            senders[i] = s
            loads[s] += works[i].duration
    return senders, order


def finish_times(works: list[Work], senders: list[int | None], order: list[int], n_workers: int) -> list[int]:
    """Simulate issuing `order`: a work starts when its sender and receivers are all free."""
    now = [0] * n_workers
    for i in order:
        s = senders[i]
        assert s is not None
        w = works[i]
        start = max([now[s]] + [now[r] for r in w.receivers])
        for x in (s, *w.receivers):
            now[x] = start + w.duration
    return now


def search_order(works: list[Work], n_workers: int, budget: int = SEARCH_BUDGET) -> Solution:
    """loadbalance_order (search): depth-first over (next work, sender), pruned by a lower bound.

    The bound gives every remaining work to the sender that would be free first and adds its
    duration to that sender and to the receivers. The best complete schedule found wins.
    """
    cur_senders: list[int | None] = [None] * len(works)
    cur_order: list[int] = []
    best: list[object] = [None, [], []]  # finish time, senders, order
    visits = 0

    def bound(now: list[int], remaining: list[int]) -> int:
        extra = [0] * n_workers
        for i in remaining:
            w = works[i]
            s = min(w.senders, key=lambda x: extra[x] + now[x])
            for x in (s, *w.receivers):
                extra[x] += w.duration
        return max(a + b for a, b in zip(extra, now, strict=True))

    def dfs() -> None:
        nonlocal visits
        if visits >= budget:
            return
        visits += 1
        now = finish_times(works, cur_senders, cur_order, n_workers)
        if len(cur_order) == len(works):
            if best[0] is None or max(now) < best[0]:  # type: ignore[operator]
                best[:] = [max(now), list(cur_senders), list(cur_order)]
            return
        placed = set(cur_order)
        remaining = [i for i in range(len(works)) if i not in placed]
        if best[0] is not None and bound(now, remaining) > best[0]:  # type: ignore[operator]
            return
        for i in remaining:
            cur_order.append(i)
            for s in works[i].senders:
                cur_senders[i] = s
                dfs()
            cur_senders[i] = None
            cur_order.pop()

    dfs()
    return best[1], best[2]  # type: ignore[return-value]
