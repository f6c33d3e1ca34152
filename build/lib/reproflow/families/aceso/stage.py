"""Aceso's runtime, one pipeline stage on one rank: its ops, the 1F1B schedule and the sends.

* Between stages: each consumer rank receives its batch range from producer replicas by
  point-to-point sends; the gradients go back from one replica of each consumer slice and are
  summed over the producer's TP group, so every replica holds the full gradient.
* Recompute: consecutive ops with recompute = 1 form checkpointed segments, broken where a layer
  starts, as the reference.
* Schedule: non-interleaved 1F1B (warm-up = stages - stage - 1 micro-batches), sends asynchronous.
* Gradients: all-reduced per (tp, dp) bucket over each op's DP group; then Adam.
Dropout masks depend on the partition (as Megatron's): compare partitions with dropout 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from reproflow.families.aceso import mcore
from reproflow.families.aceso.costmodel import Config
from reproflow.families.aceso.layout import Groups, Placed, StagePlan, narrow, pieces, reshard
from reproflow.families.aceso.models import is_layer_start
from reproflow.families.aceso.tp import Act, Env, gather, split, weight_seed
from reproflow.rank.context import RunContext


@dataclass
class Timers:
    """Milliseconds per named stage phase in one iteration."""

    ms: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.ms[name] = self.ms.get(name, 0.0) + seconds * 1000


class Stage:
    """This rank's stage: its ops and weights, forward and backward of one micro-batch, P2P with the
    neighbouring stages."""

    def __init__(self, ctx: RunContext, config: Config, stages: list[StagePlan], groups: Groups,
                 params: Mapping[str, Any], dtype: torch.dtype) -> None:
        self.ctx, self.config, self.groups, self.dtype = ctx, config, groups, dtype
        self.index = next(s.index for s in stages if s.first <= ctx.rank < s.first + s.size)
        self.plan = stages[self.index]
        self.prev = stages[self.index - 1] if self.index > 0 else None
        self.next = stages[self.index + 1] if self.index + 1 < len(stages) else None
        self.last = self.next is None
        self.seed, self.dropout = params["seed"], params["dropout"]
        self.mbs = config.micro_bs
        self.num_micro = config.global_bs // config.micro_bs
        self.weights: dict[int, dict[str, torch.nn.Parameter]] = {}
        self.buckets: dict[tuple[int, int], list[torch.nn.Parameter]] = {}
        self.ops = {p.index: p.op for p in self.plan.ops}  # megatron-core replaces the linear ones
        for p in self.plan.ops:
            tp = groups.tp(self.plan, p.tp)
            on_mcore = None
            if params["tp_impl"] == "megatron-core":
                on_mcore = mcore.linear(p.op, tp, weight_seed(self.seed, p.index, "weight"), ctx.device, dtype)
            if on_mcore is not None:
                self.ops[p.index], ws = on_mcore
            else:
                ws = {k: w.make(tp, weight_seed(self.seed, p.index, k), ctx.device, dtype)
                      for k, w in p.op.weights.items()}
            self.weights[p.index] = ws
            self.buckets.setdefault((p.tp, p.dp), []).extend(ws.values())
        self.param_ptrs = {w.untyped_storage().data_ptr() for ws in self.weights.values() for w in ws.values()}
        first, last = self.plan.ops[0], self.plan.ops[-1]
        self.in_pieces = pieces(self.mbs, self.prev, self.prev.ops[-1], self.plan, first) if self.prev else []
        self.out_pieces = pieces(self.mbs, self.plan, last, self.next, self.next.ops[0]) if self.next else []
        self.segments = self._segments()
        self.timers = Timers()
        self.op_us: dict[int, float] | None = None  # filled in the instrumented iteration
        self.forwarding = False  # op timers time the forward pass, not a recomputation
        self.iteration = 0
        self.sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._data: dict[tuple[str, int, int], torch.Tensor] = {}
        self.in_flight: dict[int, tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], int]] = {}
        self.loss_sum = torch.zeros(())
        self.live_saved = self.peak_saved = 0  # activation bytes autograd keeps (CPU memory accounting)

    def _segments(self) -> list[tuple[int, int, bool]]:
        """(start, end, recomputed) runs of the stage's ops: recompute segments break at layer starts."""
        out: list[tuple[int, int, bool]] = []
        for k, p in enumerate(self.plan.ops):
            if out and p.recompute and out[-1][2] and not is_layer_start(p.op.name):
                out[-1] = (out[-1][0], k + 1, True)
            else:
                out.append((k, k + 1, p.recompute))
        return out

    # -- data -------------------------------------------------------------------------------------
    def _sample(self, name: str, act: Act, index: int) -> torch.Tensor:
        """Sample `index` of the fixed synthetic dataset (the same in every partition)."""
        key = f"{self.seed}/{name}/{index}"
        gen = torch.Generator().manual_seed(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(),
                                                           "little") >> 1)
        assert act.batch is not None
        shape = tuple(n for d, n in enumerate(act.shape) if d != act.batch)
        if act.high:
            return torch.randint(0, act.high, shape, generator=gen)
        return torch.randn(shape, generator=gen)

    def data(self, p: Placed, micro: int) -> Any:
        """data(name) for op `p`: its DP slice of micro-batch `micro`."""
        dp_rank = (self.ctx.rank - self.plan.first) // p.tp

        def get(name: str) -> torch.Tensor:
            act = p.op.data[name]
            assert act.batch is not None
            n = self.mbs // p.dp
            key = (name, micro * self.mbs + dp_rank * n, n)
            if key not in self._data:
                start = key[1]
                t = torch.stack([self._sample(name, act, i) for i in range(start, start + n)], dim=act.batch)
                self._data[key] = t.to(self.ctx.device, dtype=None if act.high else self.dtype)
            return self._data[key]
        return get

    def env(self, p: Placed, micro: int) -> Env:
        dp_rank = (self.ctx.rank - self.plan.first) // p.tp
        return Env(self.groups.tp(self.plan, p.tp), self.data(p, micro), self.dropout,
                   (self.seed, self.iteration, micro, p.index, dp_rank))

    # -- forward and backward of one micro-batch --------------------------------------------------
    def _run(self, start: int, end: int, micro: int, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ops = self.plan.ops
        for k in range(start, end):
            p = ops[k]
            if k > 0:
                q = ops[k - 1]
                xs = tuple(reshard(x, a, b, q, p, self.plan, self.groups)
                           for x, a, b in zip(xs, q.op.outs, p.op.ins, strict=True))
            timed = self.op_us is not None and self.forwarding
            begin = time.perf_counter()
            xs = self.ops[p.index].forward(self.env(p, micro), self.weights[p.index], *xs)
            if timed:
                assert self.op_us is not None
                self.ctx.sync()
                self.op_us[p.index] = self.op_us.get(p.index, 0.0) + (time.perf_counter() - begin) * 1e6
        return xs

    def forward(self, micro: int, inputs: tuple[torch.Tensor, ...], saved: list[int]) -> tuple[torch.Tensor, ...]:
        """The stage's ops on one micro-batch; in the instrumented iteration `saved` gets the bytes autograd
        keeps for it (a Python hook per saved tensor costs time on small ops, so timed iterations go
        without it; every iteration keeps the same tensors)."""
        seen: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self.param_ptrs and ptr not in seen:
                seen.add(ptr)
                saved[0] += t.untyped_storage().nbytes()
            return t

        first = self.plan.ops[0]
        xs = tuple(split(x, self.groups.tp(self.plan, first.tp), a.split) if a.split is not None else x
                   for x, a in zip(inputs, first.op.ins, strict=True))
        self.forwarding = True
        counted = self.op_us is not None
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if counted else contextlib.nullcontext():
            for start, end, recomputed in self.segments:
                if recomputed:
                    for x in xs if counted else ():  # a checkpoint keeps its inputs
                        pack(x)
                    xs = checkpoint(self._run, start, end, micro, *xs, use_reentrant=False)
                else:
                    xs = self._run(start, end, micro, *xs)
        self.forwarding = False
        return xs

    def to_send(self, outs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The outputs replicated over the last op's TP group, as they are sent."""
        last = self.plan.ops[-1]
        return tuple(gather(x, self.groups.tp(self.plan, last.tp), a.split) if a.split is not None else x
                     for x, a in zip(outs, last.op.outs, strict=True))

    # -- point-to-point ---------------------------------------------------------------------------
    def _offset(self, st: StagePlan, p: Placed, rank: int) -> int:
        return (rank - st.first) // p.tp * (self.mbs // p.dp)

    def send_forward(self, outs: tuple[torch.Tensor, ...]) -> None:
        assert self.next is not None
        last = self.plan.ops[-1]
        off = self._offset(self.plan, last, self.ctx.rank)
        for x, a in zip(outs, last.op.outs, strict=True):
            assert a.batch is not None
            for pc in self.out_pieces:
                if pc.src == self.ctx.rank:
                    buf = narrow(x.detach(), a.batch, pc.start - off, pc.length)
                    self.sends.append((dist.isend(buf, pc.dst), buf))

    def recv_forward(self) -> tuple[torch.Tensor, ...]:
        assert self.prev is not None
        first = self.plan.ops[0]
        out = []
        for a in first.op.ins:
            assert a.batch is not None
            parts = []
            for pc in self.in_pieces:
                if pc.dst == self.ctx.rank:
                    shape = list(a.local(1, first.dp))
                    shape[a.batch] = pc.length
                    buf = torch.empty(shape, device=self.ctx.device, dtype=self.dtype)
                    parts.append((dist.irecv(buf, pc.src), buf))
            for work, _ in parts:
                work.wait()
            out.append(torch.cat([b for _, b in parts], dim=a.batch).requires_grad_())
        return tuple(out)

    def send_backward(self, inputs: tuple[torch.Tensor, ...]) -> None:
        first = self.plan.ops[0]
        off = self._offset(self.plan, first, self.ctx.rank)
        for x, a in zip(inputs, first.op.ins, strict=True):
            assert a.batch is not None
            grad = x.grad if x.grad is not None else torch.zeros_like(x)
            for pc in self.in_pieces:
                if pc.dst == self.ctx.rank and pc.primary:
                    buf = narrow(grad, a.batch, pc.start - off, pc.length)
                    self.sends.append((dist.isend(buf, pc.src), buf))

    def recv_backward(self, sent: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        last = self.plan.ops[-1]
        off = self._offset(self.plan, last, self.ctx.rank)
        tp = self.groups.tp(self.plan, last.tp)
        grads = []
        for x, a in zip(sent, last.op.outs, strict=True):
            assert a.batch is not None
            grad = torch.zeros_like(x)
            parts = []
            for pc in self.out_pieces:
                if pc.src == self.ctx.rank and pc.primary:
                    view = grad.narrow(a.batch, pc.start - off, pc.length)
                    buf = torch.empty_like(view)
                    parts.append((dist.irecv(buf, pc.dst), view, buf))
            for work, view, buf in parts:
                work.wait()
                view.copy_(buf)
            if tp.size > 1:  # each piece came back to one replica: sum them so all hold the full gradient
                dist.all_reduce(grad, group=tp.pg)
            grads.append(grad)
        return tuple(grads)

    # -- one iteration ----------------------------------------------------------------------------
    def _forward(self, micro: int, loss_scale: float) -> None:
        t0 = time.perf_counter()
        inputs = self.recv_forward() if self.prev else ()
        t1 = time.perf_counter()
        saved = [0]
        outs = self.forward(micro, inputs, saved)
        if self.last:
            loss = outs[0].float()
            self.loss_sum += loss.detach().double() * loss_scale
            sent: tuple[torch.Tensor, ...] = (loss * loss_scale,)
        else:
            sent = self.to_send(outs)
            self.send_forward(sent)
        self.ctx.sync()
        t2 = time.perf_counter()
        self.timers.add("forward-recv", t1 - t0)
        self.timers.add("forward-compute", t2 - t1)
        self.in_flight[micro] = (inputs, sent, saved[0])
        self.live_saved += saved[0]
        self.peak_saved = max(self.peak_saved, self.live_saved)

    def _backward(self, micro: int) -> None:
        inputs, sent, saved = self.in_flight.pop(micro)
        t0 = time.perf_counter()
        grads = self.recv_backward(sent) if not self.last else (None,)
        t1 = time.perf_counter()
        torch.autograd.backward(sent, grads)
        if self.prev:
            self.send_backward(inputs)
        self.ctx.sync()
        self.timers.add("backward-recv", t1 - t0)
        self.timers.add("backward-compute", time.perf_counter() - t1)
        self.live_saved -= saved

    def step(self, warmup: int, loss_scale: float) -> torch.Tensor:
        """Forward and backward of every micro-batch in 1F1B order; the stage's share of the loss."""
        self.loss_sum = torch.zeros((), device=self.ctx.device, dtype=torch.float64)
        for micro in range(warmup):
            self._forward(micro, loss_scale)
        for k in range(self.num_micro - warmup):
            self._forward(warmup + k, loss_scale)
            self._backward(k)
        for micro in range(self.num_micro - warmup, self.num_micro):
            self._backward(micro)
        return self.loss_sum

    def all_reduce_grads(self) -> None:
        """Sum each (tp, dp) bucket's gradients over its DP group, one flat all-reduce per bucket."""
        for (tp, dp), ws in self.buckets.items():
            if dp == 1:
                continue
            grads = [w.grad for w in ws if w.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.groups.dp(self.plan, tp).pg)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        self.ctx.sync()

    def wait_sends(self) -> None:
        for work, _ in self.sends:
            work.wait()
        self.sends.clear()
