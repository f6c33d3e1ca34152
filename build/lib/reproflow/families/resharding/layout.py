"""Meshes, sharding specs and tiles: where each piece of a tensor lives before and after resharding.

A mesh is a block of hosts x devices per host. The source mesh takes the job's first hosts and
the destination mesh the next ones, as Alpa's `get_device_meshes` does, so the two never share a
host. Device (h, d) of a mesh is rank `(first_host + h) * host_size + d`: on Slurm a host is a
node (torchrun numbers a node's ranks contiguously); locally hosts are emulated by the same map.

A spec says, per mesh axis, whether that axis shards a tensor dimension or replicates:
`"S0,R"` shards dim 0 over the hosts and replicates over each host's devices (DTensor
`(Shard(0), Replicate())`); `"S1,S1"` splits dim 1 over hosts, then each host's part over its
devices (Alpa's one-entry mapping over the flattened mesh). Internally an axis may split several
tensor dims, which the local all-gather rewrite needs (`S0/2+S1/2`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from reproflow.spec.errors import ParamError

# (start, stop) per tensor dim
Box = tuple[tuple[int, int], ...]
# One mesh axis: the tensor dims it splits, major first, and into how many parts; () replicates.
Axis = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Mesh:
    """`hosts` x `devices` ranks starting at host `first_host` of the job."""

    hosts: int
    devices: int
    first_host: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.hosts, self.devices)

    def ranks(self, host_size: int) -> list[int]:
        """Ranks of the mesh's devices, host-major."""
        return [(self.first_host + h) * host_size + d for h, d in product(range(self.hosts), range(self.devices))]

    def text(self) -> str:
        return f"{self.hosts}x{self.devices}"


@dataclass(frozen=True)
class Spec:
    """How a tensor of `shape` is laid out over a 2-D mesh: one Axis per mesh axis."""

    axes: tuple[Axis, Axis]

    def text(self, mesh: Mesh) -> str:
        """The readable form, e.g. 'S0,R', or 'S0/2+S1/2' for an axis split over two dims."""
        out = []
        for axis, size in zip(self.axes, mesh.shape, strict=True):
            if not axis:
                out.append("R")
            elif len(axis) == 1 and axis[0][1] == size:
                out.append(f"S{axis[0][0]}")
            else:
                out.append("+".join(f"S{d}/{f}" for d, f in axis))
        return ",".join(out)

    def chunks(self, ndim: int) -> list[int]:
        """Number of tiles along each tensor dim."""
        n = [1] * ndim
        for axis in self.axes:
            for d, f in axis:
                n[d] *= f
        return n


def parse_mesh(text: str, field: str, first_host: int = 0) -> Mesh:
    """'2x4' -> 2 hosts of 4 devices; errors name the field."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ParamError(f"'{field}' = {text!r} is not a mesh shape.",
                         "HOSTSxDEVICES with positive integers, e.g. '2x4'")
    return Mesh(int(parts[0]), int(parts[1]), first_host)


def parse_shape(text: str, field: str) -> tuple[int, ...]:
    """'1024x1024x512' -> (1024, 1024, 512)."""
    parts = text.lower().split("x")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ParamError(f"'{field}' = {text!r} is not a tensor shape.",
                         "positive integers joined by x, e.g. '1024x512'")
    return tuple(int(p) for p in parts)


def parse_spec(text: str, mesh: Mesh, shape: tuple[int, ...], field: str) -> Spec:
    """Parse 'S<d>' or 'R' per mesh axis and check that every tensor dim splits evenly."""
    entries = [e.strip().upper() for e in text.split(",")]
    allowed = "two comma-separated entries, one per mesh axis (hosts, devices): R, or S<d> to shard tensor dim d"
    if len(entries) != 2:
        raise ParamError(f"'{field}' = {text!r} has {len(entries)} entries for a 2-D mesh.", allowed)
    axes: list[Axis] = []
    for entry, size in zip(entries, mesh.shape, strict=True):
        if entry == "R":
            axes.append(())
        elif entry[:1] == "S" and entry[1:].isdigit() and int(entry[1:]) < len(shape):
            axes.append(((int(entry[1:]), size),) if size > 1 else ())
        else:
            raise ParamError(f"'{field}' = {text!r}: {entry!r} is not R or S<d> with d < {len(shape)}.", allowed)
    spec = Spec((axes[0], axes[1]))
    for dim, n in enumerate(spec.chunks(len(shape))):
        if shape[dim] % n:
            raise ParamError(f"'{field}' = {text!r} splits tensor dim {dim} (size {shape[dim]}) into {n} parts, "
                             "which does not divide it.", f"a shape whose dim {dim} is a multiple of {n}")
    return spec


def device_boxes(spec: Spec, mesh: Mesh, shape: tuple[int, ...]) -> list[Box]:
    """The index box each device of the mesh holds, host-major."""
    n = spec.chunks(len(shape))
    boxes = []
    for coords in product(range(mesh.hosts), range(mesh.devices)):
        index = [0] * len(shape)
        for axis, c in zip(spec.axes, coords, strict=True):
            stride = math.prod(f for _, f in axis)
            for d, f in axis:  # mixed radix, the first part most significant
                stride //= f
                index[d] = index[d] * f + (c // stride) % f
        boxes.append(tuple((i * (s // k), (i + 1) * (s // k)) for i, s, k in zip(index, shape, n, strict=True)))
    return boxes


def intersect(a: Box, b: Box) -> Box | None:
    """The common part of two boxes, or None."""
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b, strict=True))
    return out if all(lo < hi for lo, hi in out) else None


def numel(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def relative(box: Box, within: Box) -> tuple[slice, ...]:
    """Slices selecting `box` inside a tensor that holds `within`."""
    return tuple(slice(lo - w0, hi - w0) for (lo, hi), (w0, _) in zip(box, within, strict=True))


def allgather_rewrite(spec: Spec, mesh: Mesh, shape: tuple[int, ...]) -> tuple[Spec | None, str]:
    """Alpa's `_rewrite_allgather_spec`: split the device-axis replication over tensor dims.

    Each destination device then receives 1/r of its tile and the r devices of a host all-gather
    the rest. Returns (rewritten spec, '') or (None, why the rewrite does not apply). As in Alpa it
    applies only when the all-gather stays inside a host, and each tensor dim in order takes
    gcd(remaining replicas, its tile length) more parts. Where that leaves some replication
    (Alpa warns and keeps it), reproflow does not rewrite at all.
    """
    if all(axis or size == 1 for axis, size in zip(spec.axes, mesh.shape, strict=True)):
        return None, "the destination is already fully sharded"
    if not spec.axes[0] and mesh.hosts > 1:
        return None, "the destination is replicated across hosts, so the all-gather would cross nodes"
    if spec.axes[1] or mesh.devices == 1:
        return None, "nothing is replicated within a host"
    n = spec.chunks(len(shape))
    replicas, parts = mesh.devices, []
    for dim, size in enumerate(shape):
        g = math.gcd(replicas, size // n[dim])
        if g > 1:
            parts.append((dim, g))
            replicas //= g
        if replicas == 1:
            break
    if replicas != 1:
        return None, f"the tile cannot be split evenly over the {mesh.devices} devices of a host"
    return Spec((spec.axes[0], tuple(parts))), ""
