"""Run a resharding plan with torch.distributed and time it as the reference does.

Every rank walks the plan's transfers in issue order and does the ones it takes part in, one at a
time, as each Alpa host worker runs its compiled send/recv or broadcast list; the global order
makes this deadlock-free. Sub-groups for broadcasts and all-gathers are created on every rank
before timing (Alpa creates its communicators eagerly) and kept for the rest of the job. A ring
broadcast is built on point-to-point sends, so it runs the same way on gloo and on NCCL: the slice
goes down the plan's chain in chunks, each receiver forwarding chunk k while chunk k+1 arrives, as
NCCL's ring broadcast pipelines it.

Timing: `runs` repetitions (reference: 13), each from a barrier of all ranks to the moment the
slowest destination rank has its tile (Alpa syncs the destination mesh only); the first
`warmup_runs` (reference: 3) are dropped. Unlike Alpa, receive buffers are allocated and zeroed
before the timer starts and the sender's slices are packed beforehand, so only communication and
the copy into non-contiguous tile slices are timed. After the last run each destination rank
compares its tile with the expected part of the source arange.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from reproflow.families.resharding.layout import Box, numel, relative
from reproflow.families.resharding.plan import ITEMSIZE, Plan
from reproflow.rank.context import ALL_GATHER, RunContext

_GROUPS: dict[tuple[int, ...], object] = {}


def group(ranks: tuple[int, ...]) -> object:
    """The process group of `ranks`, created once per job. Every rank must ask for the same groups
    in the same order, because creating one is a collective of the whole job."""
    key = tuple(sorted(ranks))
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(key))
    return _GROUPS[key]



def box_values(shape: tuple[int, ...], box: Box, device: torch.device) -> torch.Tensor:
    """The part `box` of arange(prod(shape)).reshape(shape) as int32, without building the whole tensor."""
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    out = torch.zeros([hi - lo for lo, hi in box], dtype=torch.int64, device=device)
    for dim, ((lo, hi), stride) in enumerate(zip(box, strides, strict=True)):
        view = [1] * len(shape)
        view[dim] = hi - lo
        out += (torch.arange(lo, hi, dtype=torch.int64, device=device) * stride).view(view)
    return out.to(torch.int32)


@dataclass
class _Step:
    """One transfer as this rank sees it."""

    sender: int
    peers: tuple[int, ...]  # the receivers (a ring broadcast's in chain order); a broadcast's group is sender + them
    data: torch.Tensor  # what is sent, or the buffer received into
    target: torch.Tensor | None = None  # tile slice to copy a received buffer into (non-contiguous)


@dataclass
class _RankWork:
    steps: list[_Step] = field(default_factory=list)
    recv: torch.Tensor | None = None  # what arrives over the network
    final: torch.Tensor | None = None  # the tile this rank must hold at the end (recv unless all-gather)


def _prepare(ctx: RunContext, plan: Plan) -> _RankWork:
    me, dev, shape = ctx.rank, ctx.device, plan.problem.shape
    work = _RankWork()
    src_box = plan.src_boxes.get(me)
    src = box_values(shape, src_box, dev) if src_box is not None else None
    recv_box = plan.recv_boxes.get(me)
    if recv_box is not None:
        work.recv = torch.zeros([hi - lo for lo, hi in recv_box], dtype=torch.int32, device=dev)
        dst_box = plan.dst_boxes[me]
        work.final = work.recv if not plan.gather_groups else \
            torch.zeros([hi - lo for lo, hi in dst_box], dtype=torch.int32, device=dev)
    for t in plan.transfers:
        task = plan.tasks[t.task]
        peers = plan.chain(t)[1:] if plan.mode == "ring_broadcast" else t.receivers
        if t.sender == me:
            assert src is not None and src_box is not None
            work.steps.append(_Step(t.sender, peers, src[relative(task.box, src_box)].contiguous()))
        elif me in t.receivers:
            assert work.recv is not None and recv_box is not None
            view = work.recv[relative(task.box, recv_box)]
            if view.is_contiguous():
                work.steps.append(_Step(t.sender, peers, view))
            else:
                work.steps.append(_Step(t.sender, peers, torch.empty_like(view), view))
    return work


def _groups(plan: Plan) -> None:
    if plan.mode == "broadcast":
        for t in plan.transfers:
            group((t.sender, *t.receivers))
    for g in plan.gather_groups:
        group(g)


# Receives posted ahead of the chunk being forwarded: enough to keep the link busy while a chunk is
# copied on, few enough that a large slice does not hold a request per chunk.
_RING_WINDOW = 4


def ring_broadcast(data: torch.Tensor, chain: tuple[int, ...], rank: int, chunk_elems: int) -> None:
    """Broadcast contiguous `data` from chain[0] to the rest of `chain`, pipelined in chunks of
    `chunk_elems`: every rank receives each chunk from the one before it and sends it on to the
    one after it, so each link carries each byte once."""
    pos = chain.index(rank)
    prev = chain[pos - 1] if pos else None
    nxt = chain[pos + 1] if pos + 1 < len(chain) else None
    chunks = data.view(-1).split(chunk_elems)
    sends = []
    if prev is None:
        sends = [dist.isend(c, nxt) for c in chunks]
    else:
        recvs = [dist.irecv(c, prev) for c in chunks[:_RING_WINDOW]]
        for k, chunk in enumerate(chunks):
            recvs[k].wait()
            if k + _RING_WINDOW < len(chunks):
                recvs.append(dist.irecv(chunks[k + _RING_WINDOW], prev))
            if nxt is not None:
                sends.append(dist.isend(chunk, nxt))
    for s in sends:
        s.wait()


def _run_once(ctx: RunContext, plan: Plan, work: _RankWork) -> None:
    broadcast = plan.mode == "broadcast"
    ring = plan.mode == "ring_broadcast"
    chunk = max(1, plan.chunk_bytes // ITEMSIZE)
    for step in work.steps:
        if ring:
            ring_broadcast(step.data, (step.sender, *step.peers), ctx.rank, chunk)
        elif broadcast:
            dist.broadcast(step.data, src=step.sender, group=group((step.sender, *step.peers)))
        elif step.sender == ctx.rank:
            dist.send(step.data, dst=step.peers[0])
        else:
            dist.recv(step.data, src=step.sender)
        if step.target is not None:
            step.target.copy_(step.data)
    for members in plan.gather_groups:
        if ctx.rank in members:
            _all_gather_tile(ctx, plan, work, members)
    ctx.sync()


def _all_gather_tile(ctx: RunContext, plan: Plan, work: _RankWork, members: tuple[int, ...]) -> None:
    assert work.recv is not None and work.final is not None
    n = work.recv.numel()
    pieces = torch.empty(n * len(members), dtype=work.recv.dtype, device=work.recv.device)
    ALL_GATHER(pieces, work.recv.reshape(-1), group=group(members))
    dst_box = plan.dst_boxes[ctx.rank]
    for i, member in enumerate(members):
        box = plan.recv_boxes[member]
        work.final[relative(box, dst_box)] = pieces[i * n:(i + 1) * n].view([hi - lo for lo, hi in box])


def run_plan(ctx: RunContext, plan: Plan, runs: int) -> tuple[list[float], int]:
    """Time `runs` repetitions of the plan; return the seconds of each and the wrong elements found.

    Ranks outside both meshes only join the barriers and the gathers of per-rank times.
    """
    work = _prepare(ctx, plan)
    _groups(plan)
    dst = sorted(plan.dst_boxes)
    times = []
    for _ in range(runs):
        for t in (work.recv, work.final):
            if t is not None:
                t.zero_()
        ctx.barrier()
        start = time.perf_counter()
        _run_once(ctx, plan, work)
        elapsed = time.perf_counter() - start
        per_rank = ctx.gather_floats(elapsed)
        times.append(max(per_rank[r] for r in dst))
    wrong = 0
    if work.final is not None:
        expected = box_values(plan.problem.shape, plan.dst_boxes[ctx.rank], ctx.device)
        wrong = int((work.final != expected).sum().item())
    total = sum(int(x) for x in ctx.gather_floats(float(wrong)))
    return times, total


def expected_elements(plan: Plan) -> int:
    """Elements the destination ranks hold together (the check's denominator)."""
    return sum(numel(b) for b in plan.dst_boxes.values())
