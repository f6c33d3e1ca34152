"""The resharding plan: unit tasks, the sender of each transfer, their order, and local all-gathers.

Decomposition (Alpa `ReshardingTaskSpec`): every destination tile is intersected with every source
tile; each non-empty intersection is a unit task, held by the N replicas of its source tile and
needed by the M replicas of its destination tile. Scheduling (`CrossMeshCommunicator`):

* send_recv: one transfer per (receiver, task), in the order dst tile -> receiver -> slice;
* broadcast: one transfer per task from one sender to all M receivers over a sub-group, with the
  backend's own broadcast;
* ring_broadcast: the same transfers, each pipelined in chunks along a chain of its receivers ordered
  by host (`Plan.chain`), as NCCL's ring broadcast runs Alpa's broadcast mode (NCCL_ALGO=Ring);
* sender choice: `normal` takes the least-loaded replica (bytes sent so far), `no_loadbalance` the
  first replica, `loadbalance_size` / `loadbalance_order` the solvers of balance.py over hosts;
* use_local_allgather (send_recv only): where Alpa's rewrite applies, each destination device
  receives 1/r of its tile and the devices of a host all-gather the rest.

A plan is plain data: `explain()` prints it and tests check it without running anything.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reproflow.families.resharding import balance
from reproflow.families.resharding.cases import CASES
from reproflow.families.resharding.layout import (
    Box,
    Mesh,
    allgather_rewrite,
    device_boxes,
    intersect,
    numel,
    parse_mesh,
    parse_shape,
    parse_spec,
)
from reproflow.spec.errors import ParamError
from reproflow.spec.params import readable_size

MODES = ("send_recv", "broadcast", "ring_broadcast")
LOADBALANCE = ("normal", "no_loadbalance", "loadbalance_size", "loadbalance_order")
ORDER_ALGOS = ("greedy", "search")
ITEMSIZE = 4  # int32, as the reference
CUSTOM = "custom"
CUSTOM_FIELDS = ("src_mesh", "dst_mesh", "shape", "src_spec", "dst_spec")


@dataclass(frozen=True)
class Problem:
    """A case resolved: meshes placed on hosts, the (scaled) shape and the two spec texts."""

    name: str
    shape: tuple[int, ...]
    src_mesh: Mesh
    dst_mesh: Mesh
    src_spec: str
    dst_spec: str

    @property
    def hosts(self) -> int:
        return self.src_mesh.hosts + self.dst_mesh.hosts

    @property
    def devices(self) -> int:
        return max(self.src_mesh.devices, self.dst_mesh.devices)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE


def _size(nbytes: int) -> str:
    return readable_size(nbytes, ".3g", iec=True)


def problem(params: Mapping[str, Any]) -> Problem:
    """The case named by `case` (or the custom fields), with dim 0 divided by `scale`."""
    name = params["case"]
    if name == CUSTOM:
        missing = [f for f in CUSTOM_FIELDS if not params[f]]
        if missing:
            raise ParamError(f"case 'custom' needs {', '.join(missing)}.", "set all of " + ", ".join(CUSTOM_FIELDS))
        fields = {f: params[f] for f in CUSTOM_FIELDS}
    else:
        given = [f for f in CUSTOM_FIELDS if params[f]]
        if given:
            raise ParamError(f"{', '.join(given)} only apply to case 'custom'; case {name!r} defines its own.",
                             "case = 'custom' with all five fields, or leave them empty")
        c = CASES[name]
        fields = {"src_mesh": c.src_mesh, "dst_mesh": c.dst_mesh, "shape": c.shape, "src_spec": c.src_spec,
                  "dst_spec": c.dst_spec}
    shape = parse_shape(fields["shape"], "shape")
    scale = params["scale"]
    if shape[0] % scale:
        raise ParamError(f"'scale' = {scale} does not divide dim 0 ({shape[0]}) of case {name!r}.",
                         f"a divisor of {shape[0]}")
    shape = (shape[0] // scale, *shape[1:])
    if math.prod(shape) >= 2**31:
        raise ParamError(f"the tensor {'x'.join(map(str, shape))} has 2^31 elements or more; int32 values "
                         "would overflow.", "a larger scale")
    src = parse_mesh(fields["src_mesh"], "src_mesh")
    dst = parse_mesh(fields["dst_mesh"], "dst_mesh", first_host=src.hosts)
    return Problem(name, shape, src, dst, fields["src_spec"], fields["dst_spec"])


@dataclass(frozen=True)
class UnitTask:
    """One destination tile intersected with one source tile."""

    dst_tile: int
    box: Box
    senders: tuple[int, ...]
    receivers: tuple[int, ...]
    src_tile_elems: int

    @property
    def nbytes(self) -> int:
        return numel(self.box) * ITEMSIZE


@dataclass(frozen=True)
class Transfer:
    """Task `task` sent by `sender` to `receivers` (one for send_recv, all replicas for broadcast)."""

    task: int
    sender: int
    receivers: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """Everything a rank needs to run one resharding, and what each destination must hold after it."""

    problem: Problem
    mode: str
    loadbalance: str
    host_size: int
    recv_spec: str  # what arrives over the network: the dst spec, or its all-gather rewrite
    allgather_note: str
    src_boxes: Mapping[int, Box]
    dst_boxes: Mapping[int, Box]
    recv_boxes: Mapping[int, Box]
    tasks: tuple[UnitTask, ...]
    transfers: tuple[Transfer, ...]
    gather_groups: tuple[tuple[int, ...], ...]
    chunk_bytes: int  # ring_broadcast: what one pipelined step forwards

    def host(self, rank: int) -> int:
        return rank // self.host_size

    def chain(self, t: Transfer) -> tuple[int, ...]:
        """The ring of a broadcast: the sender, then its receivers host by host (the destination mesh's
        hosts follow the source's), so that each byte enters and leaves each host's link once, as in
        NCCL's ring."""
        return (t.sender, *sorted(t.receivers, key=lambda r: (self.host(r), r)))

    def sent_per_host(self) -> dict[int, int]:
        """Bytes each source host sends (a broadcast counts once, as one NIC injects it)."""
        out: Counter[int] = Counter()
        for t in self.transfers:
            out[self.host(t.sender)] += self.tasks[t.task].nbytes
        return dict(sorted(out.items()))

    def delivered_bytes(self) -> int:
        """Bytes that end up on destination ranks (a replicated tile counts once per replica)."""
        return sum(numel(b) for b in self.dst_boxes.values()) * ITEMSIZE

    def explain(self) -> str:
        """A readable account of the plan."""
        p = self.problem
        shape = "x".join(map(str, p.shape))
        lines = [
            f"case {p.name}: {shape} int32 ({_size(p.nbytes)}), {self.mode} / {self.loadbalance}",
            f"  source      mesh {p.src_mesh.text()} on hosts {_span(p.src_mesh)}, spec {p.src_spec}, "
            f"ranks {sorted(self.src_boxes)}",
            f"  destination mesh {p.dst_mesh.text()} on hosts {_span(p.dst_mesh)}, spec {p.dst_spec}, "
            f"ranks {sorted(self.dst_boxes)}",
            f"  local all-gather: {self.allgather_note}",
        ]
        shapes = Counter((len(t.senders), len(t.receivers), t.nbytes) for t in self.tasks)
        parts = [f"{n} x ({s} -> {r}, {_size(b)})" for (s, r, b), n in shapes.items()]
        lines.append(f"  unit tasks: {len(self.tasks)} = " + " + ".join(parts)
                     + f"; {len(self.transfers)} transfers, in issue order:")
        for k, t in enumerate(self.transfers):
            task = self.tasks[t.task]
            box = "[" + ", ".join(f"{lo}:{hi}" for lo, hi in task.box) + "]"
            to = " -> ".join(map(str, self.chain(t)[1:])) if self.mode == "ring_broadcast" else list(t.receivers)
            lines.append(f"    {k:4d}. task {t.task:3d} {box:<32} {_size(task.nbytes):>10}  rank {t.sender:3d} "
                         f"(host {self.host(t.sender)}) -> {to}")
        if self.gather_groups:
            lines.append("  then all-gather within each destination host: "
                         + "; ".join(str(list(g)) for g in self.gather_groups))
        load = ", ".join(f"host {h}: {_size(b)}" for h, b in self.sent_per_host().items())
        lines.append(f"  bytes sent per source host: {load}")
        return "\n".join(lines)


def _span(mesh: Mesh) -> str:
    last = mesh.first_host + mesh.hosts - 1
    return str(mesh.first_host) if last == mesh.first_host else f"{mesh.first_host}-{last}"


def _tiles(boxes: Mapping[int, Box]) -> list[tuple[Box, tuple[int, ...]]]:
    """Distinct boxes in row-major tile order, each with the ranks holding it."""
    holders: dict[Box, list[int]] = {}
    for rank, box in boxes.items():
        holders.setdefault(box, []).append(rank)
    return [(box, tuple(holders[box])) for box in sorted(holders)]


def decompose(src_boxes: Mapping[int, Box], dst_boxes: Mapping[int, Box]) -> tuple[UnitTask, ...]:
    """Unit tasks, ordered by destination tile, then source tile."""
    tasks = []
    src_tiles = _tiles(src_boxes)
    for i, (dbox, receivers) in enumerate(_tiles(dst_boxes)):
        for sbox, senders in src_tiles:
            part = intersect(dbox, sbox)
            if part is not None:
                tasks.append(UnitTask(i, part, senders, receivers, numel(sbox)))
    return tuple(tasks)


def schedule(tasks: tuple[UnitTask, ...], mode: str, loadbalance: str, host_size: int, seed: int,
             order_algo: str) -> tuple[Transfer, ...]:
    """Choose the sender of every transfer and the order they are issued in."""
    if mode == "send_recv":
        # Alpa's naive send/recv order: dst tile -> receiver -> slice.
        units = []
        for i in dict.fromkeys(t.dst_tile for t in tasks):
            of_tile = [k for k, t in enumerate(tasks) if t.dst_tile == i]
            for r in tasks[of_tile[0]].receivers:
                units += [(k, (r,)) for k in of_tile]
    else:
        units: list[tuple[int, tuple[int, ...]]] = [(k, t.receivers) for k, t in enumerate(tasks)]
    if loadbalance in ("normal", "no_loadbalance"):
        sent: Counter[int] = Counter()
        out = []
        for k, receivers in units:
            task = tasks[k]
            sender = task.senders[0] if loadbalance == "no_loadbalance" else min(task.senders, key=lambda s: sent[s])
            sent[sender] += task.nbytes
            out.append(Transfer(k, sender, receivers))
        return tuple(out)
    # Hosts are the solver's workers. Alpa's duration is the whole source tile, not the slice.
    works = [balance.Work(tuple(sorted({s // host_size for s in tasks[k].senders})),
                          tuple(sorted({r // host_size for r in receivers})),
                          tasks[k].src_tile_elems * ITEMSIZE) for k, receivers in units]
    n_workers = 1 + max(h for w in works for h in (*w.senders, *w.receivers))
    if loadbalance == "loadbalance_size":
        hosts, order = balance.over_size(works, n_workers)
    elif order_algo == "search":
        hosts, order = balance.search_order(works, n_workers)
    else:
        hosts, order = balance.greedy_order(works, n_workers, seed)
    return tuple(
        Transfer(units[i][0], next(s for s in tasks[units[i][0]].senders if s // host_size == hosts[i]), units[i][1])
        for i in order
    )


def make_plan(params: Mapping[str, Any], host_size: int) -> Plan:
    """The plan for one point when each host runs `host_size` ranks; ParamError if it cannot be made."""
    p = problem(params)
    mode, lb = params["resharding_mode"], params["resharding_loadbalance_mode"]
    if p.devices > host_size:
        raise ParamError(f"case {p.name!r} needs {p.devices} ranks per host, the job has {host_size}.",
                         f"procs_per_node >= {p.devices}")
    src = parse_spec(p.src_spec, p.src_mesh, p.shape, "src_spec")
    dst = parse_spec(p.dst_spec, p.dst_mesh, p.shape, "dst_spec")
    recv, note = dst, "off"
    if params["use_local_allgather"]:
        if mode != "send_recv":
            raise ParamError("use_local_allgather applies to resharding_mode 'send_recv' only.",
                             "use_local_allgather = false with the broadcast modes")
        rewritten, why = allgather_rewrite(dst, p.dst_mesh, p.shape)
        recv, note = (rewritten, f"on, receive {rewritten.text(p.dst_mesh)} then all-gather") if rewritten \
            else (dst, f"requested, not applicable: {why}")
    src_ranks, dst_ranks = p.src_mesh.ranks(host_size), p.dst_mesh.ranks(host_size)
    src_boxes = dict(zip(src_ranks, device_boxes(src, p.src_mesh, p.shape), strict=True))
    dst_boxes = dict(zip(dst_ranks, device_boxes(dst, p.dst_mesh, p.shape), strict=True))
    recv_boxes = dict(zip(dst_ranks, device_boxes(recv, p.dst_mesh, p.shape), strict=True))
    tasks = decompose(src_boxes, recv_boxes)
    groups: tuple[tuple[int, ...], ...] = ()
    if recv != dst:
        groups = tuple(tuple(dst_ranks[h * p.dst_mesh.devices:(h + 1) * p.dst_mesh.devices])
                       for h in range(p.dst_mesh.hosts))
    transfers = schedule(tasks, mode, lb, host_size, params["seed"], params["order_algo"])
    return Plan(p, mode, lb, host_size, recv.text(p.dst_mesh), note, src_boxes, dst_boxes, recv_boxes, tasks,
                transfers, groups, params["chunk_bytes"])
