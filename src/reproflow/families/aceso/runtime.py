"""Aceso's runtime: train any config JSON (the reference's format) with real torch.distributed.

Layout, as the reference's FlexPipe runtime: stages occupy contiguous rank ranges in order; inside
a stage, for each op, TP groups are consecutive blocks of `tp` ranks and DP groups the ranks
strided by `tp`. An op with DP size `dp` runs micro_bs / dp samples of the stage's micro-batch.

* Resharding inside a stage: where neighbouring ops' layouts differ, each tensor is all-gathered
  over the producer's TP group if split, its batch slices regrouped over the ranks that hold the
  same data (narrowed, or all-gathered), and split for the consumer's TP group.
* Between stages: the producer's tensors are gathered over its TP group; each consumer rank
  receives its batch range from producer replicas (spread over them) by point-to-point sends. The
  gradients go back from one replica of each consumer slice and are summed over the producer's TP
  group, so every replica holds the full gradient.
* Recompute: consecutive ops with recompute = 1 form checkpointed segments, broken where a layer
  starts, as the reference.
* Schedule: non-interleaved 1F1B (warm-up = stages - stage - 1 micro-batches), sends asynchronous.
* Gradients: all-reduced per (tp, dp) bucket over each op's DP group; then Adam.

Every rank writes the reference's per-stage CSV,
`{log_path}/{plan}/runtime/{model}/{size}/csv/{config}_stage{s}_rank{r}.csv` (plan `megatron-mcore`
for a run on megatron-core's layers):
global batch, iteration time (ms, the median of the timed iterations), stage timers (ms), per-op
forward timers (us per micro-batch, from one extra instrumented iteration), memory (MB). On GPUs
memory is the CUDA allocator's; on CPU, which has no caching allocator to ask, it is accounted:
weights, gradients and optimizer state plus the peak of the activations autograd keeps for in-flight
micro-batches (`reserved` = `max_allocated`).
Dropout masks depend on the partition (as Megatron's): compare partitions with dropout 0.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import hashlib
import io
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from reproflow.families.aceso import mcore, resnet_ops, transformer_ops
from reproflow.families.aceso.costmodel import Config
from reproflow.families.aceso.models import RESNET, is_layer_start, model
from reproflow.families.aceso.plans import read_config, read_json
from reproflow.families.aceso.tp import Act, Env, Group, OpDef, gather, split, weight_seed
from reproflow.rank.context import RunContext
from reproflow.rank.memory import keep_freed_memory
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.family import Measurement
from reproflow.spec.paths import project_root
from reproflow.store.results import atomic_write

MB = 2**20
IMAGE = 224


@dataclass(frozen=True)
class Placed:
    """One op of the model with its partition."""

    index: int
    op: OpDef
    tp: int
    dp: int
    algo: int
    recompute: bool


@dataclass(frozen=True)
class StagePlan:
    index: int
    first: int
    size: int
    ops: tuple[Placed, ...]


def model_ops(name: str, size: str, num_layers: int | None, mbs: int, algos: Sequence[int],
              seq_len: int) -> list[OpDef]:
    """Every op of the model in order, for a stage micro-batch of `mbs`, op i with algorithm algos[i]."""
    m = model(name, size, num_layers)
    if m.family == "resnet":
        blocks, base, width = RESNET[size]
        ops = resnet_ops.op_list(resnet_ops.Dims(blocks, base, width, seq_len or IMAGE))
        return [resnet_ops.build(op, mbs, a) for op, a in zip(ops, algos, strict=True)]
    d = transformer_ops.dims(name, size, seq_len)
    names = m.full_op_list(list(transformer_ops.T5_OPS if d.t5 else transformer_ops.GPT_OPS))
    return [transformer_ops.build(op, d, mbs, a) for op, a in zip(names, algos, strict=True)]


def newest_manifest(folder: Path) -> Path | None:
    """The newest search manifest (search-*.json) of a --config-save-path, or None."""
    found = sorted(folder.glob("search-*.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def resolve_config(path: Path, plan: str) -> Path:
    """`path` itself (a .json file), or for a search folder (--config-save-path) the config its newest
    search ranked first (`plan` aceso) or that search's Megatron-LM uniform plan (`plan` megatron).
    A relative path that is not under the working directory is looked up in the checkout, as suites
    are (the committed configs of workflows/configs/ from any working directory, or in an image)."""
    if not path.is_absolute() and not path.exists():
        try:
            committed = project_root() / path
        except ReproflowError:
            committed = path
        path = committed if committed.exists() else path
    if path.suffix == ".json":
        return path
    manifest = newest_manifest(path)
    if manifest is None:
        raise ParamError(f"'config' = {str(path)!r} is a folder without a search manifest (search-*.json).",
                         "a config JSON, or the --config-save-path of a finished `reproflow aceso search`")
    done = json.loads(manifest.read_text())
    name = done.get("megatron") if plan == "megatron" else (done.get("configs") or [None])[0]
    if not name:
        raise ParamError(f"the search in {manifest} found no {plan} config.", "a search that found one")
    return path / name


def load_config(path: Path, seq_len: int) -> tuple[Config, list[StagePlan]]:
    """The config JSON and its stages with built ops; errors name the field."""
    d = read_config(path)
    name = d["model_name"]
    num_layers = None if name == "resnet" else d.get("num_layers")
    if d["model_size"] == "scale-layer":
        name = "scale-layer"
    try:
        m = model(name, d["model_size"], num_layers)
    except ValueError as exc:
        raise ParamError(f"config {path}: {exc}.", "model_name / model_size of the zoo") from None
    algos = [a for stage in d["algo_of_each_op"] for a in stage]
    try:
        ops = model_ops(name, d["model_size"], num_layers, d["micro_batch_size"], algos, seq_len)
    except ValueError as exc:
        raise ParamError(f"config {path}: algo_of_each_op has {len(algos)} entries: {exc}.",
                         "one per op of the model") from None
    if sum(d["num_ops_in_each_stage"]) != len(ops):
        raise ParamError(f"config {path}: num_ops_in_each_stage sums to {sum(d['num_ops_in_each_stage'])}, "
                         f"the model has {len(ops)} ops.", "one op count per stage summing to the model's ops")
    config = read_json(path, m, [o.name for o in ops])
    stages, first, start = [], 0, 0
    for s, stage in enumerate(config.stages):
        gpus = stage.num_gpus
        if gpus != d["num_gpus"][s]:
            raise ParamError(f"config {path}: stage {s} has num_gpus {d['num_gpus'][s]} but tp x dp = {gpus}.",
                             "num_gpus = tp x dp of the stage's ops")
        placed = []
        for k, op in enumerate(stage.ops):
            tp, dp = stage.tp[k], stage.dp[k]
            if tp * dp != gpus:
                raise ParamError(f"config {path}: model_parallel_size_of_each_op[{s}][{k}] x "
                                 f"data_parallel_size_of_each_op[{s}][{k}] ({op}) = {tp} x {dp}, not the stage's "
                                 f"{gpus} GPUs.", "tp x dp equal to the stage's GPUs for every op")
            if config.micro_bs % dp:
                raise ParamError(f"config {path}: micro_batch_size {config.micro_bs} does not split over dp {dp} "
                                 f"(stage {s}, {op}).", "a micro-batch divisible by every op's dp")
            placed.append(Placed(start + k, ops[start + k], tp, dp, stage.algo[k], bool(stage.recompute[k])))
        stages.append(StagePlan(s, first, gpus, tuple(placed)))
        first += gpus
        start += len(stage.ops)
    if config.global_bs % config.micro_bs:
        raise ParamError(f"config {path}: global_batch_size {config.global_bs} is not a multiple of "
                         f"micro_batch_size {config.micro_bs}.", "a global batch of whole micro-batches")
    return config, stages


def check_shapes(stages: list[StagePlan]) -> None:
    """Every split dimension divides over its TP size, every tensor passes to an op that takes it."""
    prev: Placed | None = None
    for st in stages:
        for p in st.ops:
            for what, acts in (("input", p.op.ins), ("output", p.op.outs)):
                for a in acts:
                    if a.split is not None and a.shape[a.split] % p.tp:
                        raise ParamError(f"{p.op.name} (op {p.index}): {what} dimension {a.shape[a.split]} does not "
                                         f"split over tp {p.tp}.", "a TP size dividing heads, hidden and vocabulary")
            for w in p.op.weights.values():
                if w.split is not None and w.shape[w.split] % p.tp:
                    raise ParamError(f"{p.op.name} (op {p.index}): weight dimension {w.shape[w.split]} does not "
                                     f"split over tp {p.tp}.", "a TP size dividing the op's weights")
            if prev is not None and [a.shape for a in prev.op.outs] != [a.shape for a in p.op.ins]:
                raise ParamError(f"{prev.op.name} -> {p.op.name}: the ops' tensors do not match.",
                                 "an op list in model order")
            prev = p


class Groups:
    """Every process group the config needs, created on all ranks in one order (a collective)."""

    def __init__(self, stages: list[StagePlan], rank: int, singletons: bool = False) -> None:
        self.rank = rank
        needed: set[tuple[int, ...]] = set()
        if singletons:  # megatron-core's layers want a process group even at TP size 1
            needed.update((r,) for st in stages for r in range(st.first, st.first + st.size))
        for st in stages:
            tps = sorted({p.tp for p in st.ops})
            for tp in tps:
                needed.update(self._tp(st, tp, i) for i in range(st.size))
                needed.update(self._dp(st, tp, i) for i in range(st.size))
            for small in tps:
                for big in tps:
                    if small < big:
                        needed.update(self._between(st, small, big, i) for i in range(st.size))
        self.pgs: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in sorted(needed, key=lambda r: (len(r), r)):
            if len(ranks) > 1 or singletons:
                pg = dist.new_group(list(ranks))
                if rank in ranks:
                    self.pgs[ranks] = pg

    @staticmethod
    def _tp(st: StagePlan, tp: int, i: int) -> tuple[int, ...]:
        return tuple(st.first + i // tp * tp + t for t in range(tp))

    @staticmethod
    def _dp(st: StagePlan, tp: int, i: int) -> tuple[int, ...]:
        return tuple(st.first + j * tp + i % tp for j in range(st.size // tp))

    @staticmethod
    def _between(st: StagePlan, small: int, big: int, i: int) -> tuple[int, ...]:
        """Ranks with the same slice of a `big`-TP layout and the same TP rank of a `small`-TP one:
        the holders of one batch slice at the larger DP size, in batch order."""
        return tuple(st.first + i // big * big + u * small + i % small for u in range(big // small))

    def group(self, ranks: tuple[int, ...]) -> Group:
        return Group(len(ranks), ranks.index(self.rank), self.pgs.get(ranks))

    def tp(self, st: StagePlan, tp: int) -> Group:
        return self.group(self._tp(st, tp, self.rank - st.first))

    def dp(self, st: StagePlan, tp: int) -> Group:
        return self.group(self._dp(st, tp, self.rank - st.first))

    def between(self, st: StagePlan, small: int, big: int) -> Group:
        return self.group(self._between(st, small, big, self.rank - st.first))


def reshard(x: torch.Tensor, a: Act, b: Act, pa: Placed, pb: Placed, st: StagePlan, groups: Groups) -> torch.Tensor:
    """Tensor `x` as produced by op `pa` (layout `a`) in the layout op `pb` takes (`b`)."""
    if (pa.tp, a.split) == (pb.tp, b.split) or a.batch is None:
        return x
    if a.split is not None:
        x = gather(x, groups.tp(st, pa.tp), a.split)
    if pa.dp > pb.dp:  # larger slices: gather the holders of the pieces
        g = groups.between(st, pa.tp, pb.tp)
        x = gather(x, g, a.batch)
    elif pa.dp < pb.dp:  # smaller slices: each keeps its piece
        x = split(x, groups.between(st, pb.tp, pa.tp), a.batch)
    if b.split is not None:
        x = split(x, groups.tp(st, pb.tp), b.split)
    return x


@dataclass(frozen=True)
class Piece:
    """A batch range [start, start + length) of the micro-batch sent from `src` to `dst`; the
    gradient goes back when `primary` (one replica of each consumer slice)."""

    src: int
    dst: int
    start: int
    length: int
    primary: bool


def pieces(mbs: int, a: StagePlan, pa: Placed, b: StagePlan, pb: Placed) -> list[Piece]:
    """Who sends what between the last op of stage `a` and the first op of stage `b`."""
    n_a, n_b = mbs // pa.dp, mbs // pb.dp
    out = []
    for i in range(b.size):
        lo = i // pb.tp * n_b
        for c in range(pa.dp):
            s, e = max(lo, c * n_a), min(lo + n_b, (c + 1) * n_a)
            if s < e:
                out.append(Piece(a.first + c * pa.tp + i % pa.tp, b.first + i, s, e - s, i % pb.tp == 0))
    return out


def _narrow(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return x.narrow(dim, start, length).contiguous()


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
                    buf = _narrow(x.detach(), a.batch, pc.start - off, pc.length)
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
                    buf = _narrow(grad, a.batch, pc.start - off, pc.length)
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


def flops_per_micro_batch(ops: list[OpDef]) -> float:
    """Forward FLOPs of one micro-batch through the whole, unpartitioned model: matmuls and
    convolutions counted by torch's FlopCounterMode on meta tensors."""
    meta = torch.device("meta")
    tp = Group()
    total = 0.0
    for op in ops:
        weights = {k: torch.empty(w.shape, device=meta) for k, w in op.weights.items()}
        xs = [torch.empty(a.shape, device=meta) for a in op.ins]
        data = {k: torch.zeros(a.shape, dtype=torch.long if a.high else torch.float32, device=meta)
                for k, a in op.data.items()}
        with FlopCounterMode(display=False) as counter:
            op.forward(Env(tp, data.__getitem__, 0.0), weights, *xs)
        total += counter.get_total_flops()
    return float(total)


def _memory_mb(ctx: RunContext, stage: Stage) -> dict[str, float]:
    if ctx.device.type == "cuda":
        return {"allocated": torch.cuda.memory_allocated(ctx.device) / MB,
                "max_allocated": torch.cuda.max_memory_allocated(ctx.device) / MB,
                "reserved": torch.cuda.memory_reserved(ctx.device) / MB,
                "max_reserved": torch.cuda.max_memory_reserved(ctx.device) / MB}
    fixed = sum(w.numel() * w.element_size() for ws in stage.weights.values() for w in ws.values())
    fixed *= 4  # weights, gradients, Adam's two moments (all the weights' dtype on CPU)
    peak = (fixed + stage.peak_saved) / MB
    return {"allocated": (fixed + stage.live_saved) / MB, "max_allocated": peak, "reserved": peak, "max_reserved": peak}


def check(params: Mapping[str, Any], world_size: int, *, at_run_time: bool = False) -> None:
    """The config fits the job: its GPUs are the job's ranks, its shapes split. A search folder is
    only checked when the job runs (a chained job is submitted before its search has run)."""
    if not params["config"]:
        raise ParamError("'config' is empty.", "the path of a config JSON (reproflow aceso search or megatron)")
    if Path(params["config"]).suffix != ".json" and not at_run_time:
        return
    _, stages = load_config(resolve_config(Path(params["config"]), params["plan"]), params["seq_len"])
    gpus = sum(s.size for s in stages)
    if gpus != world_size:
        raise ParamError(f"the config uses {gpus} GPUs (sum of num_gpus) but the job has {world_size} ranks.",
                         f"launch {gpus} ranks, e.g. procs_per_node = {gpus}")
    check_shapes(stages)
    if params["tp_impl"] == "megatron-core":
        mcore.available()


def _iterate(ctx: RunContext, stage: Stage, optimizer: torch.optim.Optimizer, iterations: int, seconds: float,
             warmup: int, loss_scale: float, report_loss: bool, global_bs: int
             ) -> tuple[list[float], list[float], list[float], dict[str, float]]:
    """The training loop: (this rank's iteration seconds, the slowest rank's, losses, the last timed
    iteration's stage timers). At least `iterations` timed iterations, and more until the slowest rank's
    add up to `seconds` (every rank sees the same sums, so all stop together); then one with op timers,
    not timed."""
    times: list[float] = []
    steps: list[float] = []
    losses: list[float] = []
    timers: dict[str, float] = {}
    it, instrumented = 0, False
    while not instrumented:
        stage.iteration = it
        instrumented = len(steps) >= iterations and sum(steps) >= seconds
        stage.op_us = {} if instrumented else None
        stage.timers = Timers()
        optimizer.zero_grad(set_to_none=False)
        ctx.barrier()
        begin = time.perf_counter()
        loss_sum = stage.step(warmup, loss_scale)
        t0 = time.perf_counter()
        stage.wait_sends()
        t1 = time.perf_counter()
        stage.all_reduce_grads()
        t2 = time.perf_counter()
        optimizer.step()
        ctx.sync()
        end = time.perf_counter()
        stage.timers.add("send-wait", t1 - t0)
        stage.timers.add("grads-all-reduce", t2 - t1)
        stage.timers.add("optimizer", end - t2)
        if not report_loss:
            loss_sum.zero_()
        dist.all_reduce(loss_sum)
        losses.append(float(loss_sum.item()))
        slowest = max(ctx.gather_floats(end - begin))
        if not instrumented:
            times.append(end - begin)
            steps.append(slowest)
            timers = dict(stage.timers.ms)
        ctx.log(f" iteration {it + 1:3d}/{iterations + 1 if not seconds else '-'} | elapsed time per iteration (ms): "
                f"{slowest * 1000:.1f} | global batch size: {global_bs} | loss: {losses[-1]:.6E} |"
                + (" (instrumented: op timers, not timed)" if instrumented else ""))
        it += 1
    return times, steps, losses, timers


def train(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Train the config for `train_iters` iterations or more (`train_seconds`), then one instrumented;
    measurements of rank 0."""
    path = resolve_config(Path(params["config"]), params["plan"])
    config, stages = load_config(path, params["seq_len"])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[
        params["dtype"] if params["dtype"] != "auto" else ("bfloat16" if ctx.device.type == "cuda" else "float32")]
    groups = Groups(stages, ctx.rank, singletons=params["tp_impl"] == "megatron-core")
    keep_freed_memory()  # from the first iteration on, as the profiler: no process times a cold heap
    stage = Stage(ctx, config, stages, groups, params, dtype)
    optimizer = torch.optim.Adam([w for ws in stage.weights.values() for w in ws.values()], lr=params["lr"])
    n_stages, s = len(stages), stage.index
    last = stage.plan.ops[-1]
    loss_scale = 1.0 / (stage.num_micro * last.dp)
    report_loss = stage.last and (ctx.rank - stage.plan.first) % last.tp == 0
    warmup = min(n_stages - s - 1, stage.num_micro)
    iterations, seconds = params["train_iters"], params["train_seconds"]
    ctx.log(f"aceso train: {path.name}: {n_stages} stages, GPUs {[st.size for st in stages]}, micro-batch "
            f"{config.micro_bs}, {stage.num_micro} micro-batches, {iterations} iterations"
            + (f" (or more, until they take {seconds:g} s)" if seconds else "") + " + 1 with op timers")
    # Megatron-LM's --manual-gc: Python's collector off while training (one collection first), so a
    # threshold-triggered collection does not land in one rank's iteration and stall the others.
    gc.collect()
    gc.disable()
    try:
        times, steps, losses, timers = _iterate(ctx, stage, optimizer, iterations, seconds, warmup, loss_scale,
                                                report_loss, config.global_bs)
    finally:
        gc.enable()
    # The median, where the reference takes the mean of its 3 GPU iterations: on a shared CPU one
    # preempted iteration (3x the others) moves a mean of 18 by 10 %, and the profile's op times are
    # medians of their passes too.
    my_ms = statistics.median(times[params["warmup_iters"]:] or times[-1:]) * 1000
    memory = _memory_mb(ctx, stage)
    op_us = stage.op_us or {}
    row = {"global_batch_size": config.global_bs, "time": round(my_ms, 2),
           **{k: round(v, 2) for k, v in timers.items()},
           **{f"{p.op.name}#{p.index}": round(op_us.get(p.index, 0.0) / stage.num_micro, 2) for p in stage.plan.ops},
           **{k: round(v, 2) for k, v in memory.items()}}
    column = params["plan"] + ("-mcore" if params["tp_impl"] == "megatron-core" else "")
    logs = Path(params["log_path"]) / column / "runtime" / config.model.name / config.model.size
    _write_csv(logs, path.stem, s, ctx.rank, row)
    every = ctx.gather_objects({"stage": s, "time": my_ms, **memory})
    iteration_ms = max(float(r["time"]) for r in every)  # type: ignore[index]
    world = ctx.world_size
    model_flops = 3 * flops_per_micro_batch([p.op for st in stages for p in st.ops]) * stage.num_micro
    tflops = model_flops / (iteration_ms / 1000) / world / 1e12
    samples = config.global_bs / (iteration_ms / 1000)
    ctx.log(f"aceso train: {iteration_ms:.2f} ms per iteration, {samples:.2f} samples/s, "
            f"{tflops:.4f} TFLOP/s per rank (model FLOPs), losses {losses[0]:.4f} -> {losses[-1]:.4f}")
    who = {"config_name": path.stem, "model_name": config.model.name, "model_size": config.model.size}
    out = [Measurement("iteration_ms", iteration_ms, "ms", who),
           Measurement("samples_per_s", samples, "samples/s", who),
           Measurement("tflops_per_gpu", tflops, "TFLOP/s", who), Measurement("model_flops", model_flops, "FLOP", who)]
    out += [Measurement("loss", v, "", {**who, "iteration": i + 1}) for i, v in enumerate(losses)]
    # Each timed iteration's slowest rank: the samples a claim's confidence interval comes from.
    kept = steps[params["warmup_iters"]:] or steps[-1:]
    out += [Measurement("step_ms", v * 1000, "ms", {**who, "iteration": len(steps) - len(kept) + i + 1})
            for i, v in enumerate(kept)]
    for r, info in enumerate(every):
        assert isinstance(info, dict)
        at = {**who, "stage": info["stage"]}
        out += [Measurement("rank_time", info["time"], "ms", at, rank=r),
                Measurement("rank_max_allocated", info["max_allocated"], "MB", at, rank=r),
                Measurement("rank_max_reserved", info["max_reserved"], "MB", at, rank=r)]
    return out


def _write_csv(log_path: Path, name: str, stage: int, rank: int, row: dict[str, float]) -> None:
    """The reference's `{log_path}/csv/{name}_stage{s}_rank{r}.csv`: a header and one row."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(row.keys())
    writer.writerow(row.values())
    atomic_write(log_path / "csv" / f"{name}_stage{stage}_rank{rank}.csv", buf.getvalue())
