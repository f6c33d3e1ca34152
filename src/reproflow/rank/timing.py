"""Timing helpers shared by the families: timed loops and statistics across ranks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from reproflow.rank.context import RunContext

STATS = ("min", "p50", "p75", "p95", "max")


def rank_stats(values: Sequence[float]) -> dict[str, float]:
    """min, p50, p75, p95, max of per-rank values (numpy's linear interpolation, as param)."""
    arr = np.asarray(values, dtype=np.float64)
    return {
        "min": float(arr.min()),
        "p50": float(np.percentile(arr, 50)),
        "p75": float(np.percentile(arr, 75)),
        "p95": float(np.percentile(arr, 95)),
        "max": float(arr.max()),
    }


def _wait(handles: Any) -> None:
    if handles is None:
        return
    if isinstance(handles, Iterable):
        for h in handles:
            h.wait()
    else:
        handles.wait()


def time_per_op(
    ctx: RunContext,
    issue: Callable[[bool], Any],
    warmup: int,
    iters: int,
    blocking: bool,
) -> float:
    """Seconds per operation on this rank, timed the way param and nccl-tests do.

    `issue(async_op)` launches the operation once and returns its work handle(s) when async.
    Non-blocking (param `--z 0`, the default): launch `iters` operations back to back, wait for
    all, divide the wall time. Blocking (`--z 1`): a barrier outside the timed region, then each
    operation is launched and waited for; the per-iteration times are summed.
    """
    for _ in range(warmup):
        _wait(issue(not blocking))
    ctx.barrier()
    if not blocking:
        start = time.perf_counter()
        handles = [issue(True) for _ in range(iters)]
        for h in handles:
            _wait(h)
        ctx.sync()
        return (time.perf_counter() - start) / iters
    total = 0.0
    for _ in range(iters):
        ctx.barrier()
        start = time.perf_counter()
        _wait(issue(False))
        ctx.sync()
        total += time.perf_counter() - start
    return total / iters


def bare_loop_seconds(issue: Callable[[bool], Any], iters: int, blocking: bool) -> float:
    """The plainest timing of `iters` operations: synchronous calls, or async launches then one wait.

    No warm-up, no barriers, no statistics: the reference the benchmarks and tests hold
    `time_per_op` against (call a barrier first so the ranks start together).
    """
    start = time.perf_counter()
    if blocking:
        for _ in range(iters):
            issue(False)
    else:
        for work in [issue(True) for _ in range(iters)]:
            work.wait()
    return (time.perf_counter() - start) / iters


def time_steps(sync: Callable[[], None], step: Callable[[], Any], warmup: int, steps: int) -> float:
    """Seconds per call of `step` after `warmup` untimed calls (param compute's method)."""
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - start) / steps


def slowest_steps(ctx: RunContext, step: Callable[[], float], warmup: int, steps: int) -> list[float]:
    """Seconds of each of `steps` calls after `warmup` untimed ones, each the slowest rank's. `step` runs one
    step (e.g. a training step from a barrier to its last collective) and returns this rank's seconds."""
    return interleaved_steps(ctx, {"": step}, warmup, steps)[""]


def rotation(names: Sequence[str], r: int) -> list[str]:
    """The order of round `r` of `interleaved_steps`: each round starts one runner later."""
    return [*names[r % len(names):], *names[:r % len(names)]]


def places(names: Sequence[str], count: int, per_turn: int = 2) -> dict[str, list[int]]:
    """Each timed step's place in its round (0: first) in `interleaved_steps` of runners `names`, so that
    rows can record the order the runners took their turns in."""
    return {name: [rotation(names, k // per_turn).index(name) for k in range(count)] for name in names}


def interleaved_steps(ctx: RunContext, steps: Mapping[str, Callable[[], float]], warmup: int, count: int,
                      per_turn: int = 2) -> dict[str, list[float]]:
    """`slowest_steps` of several runners (by name), `count` timed steps each, taken in turns after `warmup`
    untimed rounds: a turn is one untimed step (it brings the caches back after the other runners' steps,
    which slow the first step after them) and `per_turn` timed ones. A machine whose speed drifts while
    they run slows every runner alike, so their ratios keep; one runner after another would count the
    drift as a difference between them. Each round starts one runner later, so that every
    runner takes every place. One runner alone takes no untimed steps but its warm-up."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(-(-count // per_turn) if names else 0):
        for name in rotation(names, r):
            if len(names) > 1:
                steps[name]()
            for _ in range(min(per_turn, count - len(times[name]))):
                times[name].append(max(ctx.gather_floats(steps[name]())))
    return times
