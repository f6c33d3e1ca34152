"""The sweep of a param comms point: its collectives and element types, the message sizes, the elements
per rank, and the nccl-tests bus factor."""

from __future__ import annotations

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")
# Collectives whose buffer is split across ranks: at least one element per rank.
SPLIT = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")
MAX_SIZES = 100


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busBW / algBW factor (doc/PERFORMANCE.md), as param's getBusBW."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in SPLIT:
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "send_recv"):
        return 1.0
    raise ValueError(f"no bus factor for {collective!r}")


def message_sizes(begin: int, end: int, factor: int, step: int) -> list[int]:
    """Sizes from `begin` to `end` inclusive: times `factor`, or plus `step` bytes when step > 0."""
    sizes = []
    size = begin
    while size <= end and len(sizes) <= MAX_SIZES:
        sizes.append(size)
        nxt = size + step if step > 0 else size * factor
        size = max(nxt, size + 1)
    return sizes


def element_counts(collective: str, size: int, element_size: int, world_size: int) -> tuple[int, int]:
    """(total elements, elements per rank) for a total buffer of `size` bytes.

    Split collectives round down to a multiple of the world size and carry at least one element
    per rank; the others carry at least one element (param's fixBeginSize).
    """
    total = size // element_size
    if collective in SPLIT:
        per_rank = max(total // world_size, 1)
        return per_rank * world_size, per_rank
    total = max(total, 1)
    return total, total
