"""Aceso's runtime, the layout: which ranks run which op, and the resharding between layouts.

As the reference's FlexPipe runtime: stages occupy contiguous rank ranges in order; inside a stage,
for each op, TP groups are consecutive blocks of `tp` ranks and DP groups the ranks strided by `tp`.
An op with DP size `dp` runs micro_bs / dp samples of the stage's micro-batch.

* Resharding inside a stage: where neighbouring ops' layouts differ, each tensor is all-gathered
  over the producer's TP group if split, its batch slices regrouped over the ranks that hold the
  same data (narrowed, or all-gathered), and split for the consumer's TP group.
* Between stages: the producer's tensors are gathered over its TP group; each consumer rank
  receives its batch range from producer replicas (spread over them) by point-to-point sends
  (`pieces`; the sends themselves are stage.py's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from reproflow.families.aceso import resnet_ops, transformer_ops
from reproflow.families.aceso.costmodel import Config
from reproflow.families.aceso.models import RESNET, model
from reproflow.families.aceso.plans import read_config, read_json
from reproflow.families.aceso.tp import Act, Group, OpDef, gather, split
from reproflow.spec.errors import ParamError

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


def narrow(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    """`length` slices of `x` from `start` along `dim`, as a tensor of its own (a send buffer)."""
    return x.narrow(dim, start, length).contiguous()
