"""Aceso's performance model: per-stage time and memory of a config from a profiled database.

Per stage and micro-batch (each op k runs micro_bs / dp_k samples at tp_k with algo_k):
time = sum fwd + sum bwd + fwd of recomputed ops + input and output P2P time (intra- or
inter-node bandwidth by where the stage boundary falls) + resharding between neighbouring ops
whose layouts differ (GPT and ResNet; T5 ops declare no layouts). A 1F1B pipeline of M = global /
micro batches takes max over stages of (M - 1) t_s + sum_j t_j. Memory per stage = weights (with
the fp32 master copy for fp16 models) + gradients + optimizer state + activations kept for the
stages behind + the peak of one micro-batch + reserved (allocator) memory, as the reference; a CPU
profile (float32) has no caching allocator, so nothing reserved, where the reference's floor of the
weights' size would count them a fifth time.

Two kinds (`kind`):
* "reference": the reference's predictions exactly, quirks included (the last op's output is looked up
  at the first op's TP size; messages under 1 MB index the P2P table from its end).
* "runtime": what reproflow's runtime does. The last op's output at its own TP size, messages under
  1 MB at the smallest P2P entry, every message's fixed cost (the profiled one-element latency of
  its link) beside its size over the bandwidth, and after the pipeline, per stage, the data-parallel gradient
  all-reduce of each (tp, dp) group of ops (the profiled all_reduce table) and the optimizer step (the
  profiled Adam step of each op): on the reference's V100s these were small beside the pipeline, on
  CPU ranks they are a third to a half of an iteration, and a model without them searches for the
  wrong thing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reproflow.families.aceso.database import FIELDS, P2P_LATENCY_FILE, Database, optimizer_file
from reproflow.families.aceso.models import Model, is_layer_start, op_spec, reshard
from reproflow.families.aceso.settings import KINDS
from reproflow.spec.errors import ReproflowError

F = {name: i for i, name in enumerate(FIELDS)}
# Bits of (op, tp, dp, algo) of producer and consumer, then the size in 1/1000 MB: 63 bits in all.
PAIR_BITS = (9, 5, 5, 1, 9, 5, 5, 1, 23)
SHARED_ZERO_OPS = ("enc-attention-softmax", "bn1")


def _flags(values: list[int] | np.ndarray) -> np.ndarray:
    """0/1 flags as a bool array (bytes() is the fast way in from a list thousands long)."""
    return values.astype(bool) if isinstance(values, np.ndarray) else np.frombuffer(bytes(values), dtype=bool)


@dataclass
class _Arrays:
    """A stage's per-op lists as integer arrays, with the lists and the op index they were made from,
    and the cost model's lookups of them (by micro-batch) and their digest."""

    lists: tuple[list, ...]  # ops, tp, dp, algo
    index: dict[str, int]
    ids: np.ndarray
    tp: np.ndarray
    dp: np.ndarray
    algo: np.ndarray
    looked: dict = field(default_factory=dict)

    def fits(self, stage: Stage, index: dict[str, int] | None = None) -> bool:
        """Made from these very lists (a search replaces a stage's lists, never changes them in place)."""
        ops, tp, dp, algo = self.lists
        return ((index is None or self.index is index) and ops is stage.ops and tp is stage.tp
                and dp is stage.dp and algo is stage.algo)


@dataclass
class Stage:
    """One pipeline stage: its ops and, per op, TP size, DP size, partition algorithm, recompute flag."""

    ops: list[str]
    tp: list[int]
    dp: list[int]
    algo: list[int]
    recompute: list[int]
    _cache: _Arrays | None = field(default=None, compare=False, repr=False)

    def _lists(self) -> tuple[list, ...]:
        return self.ops, self.tp, self.dp, self.algo

    def _valid(self, index: dict[str, int] | None = None) -> _Arrays | None:
        return self._cache if self._cache is not None and self._cache.fits(self, index) else None

    def arrays(self, index: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(database row, tp, dp, algo) per op as integer arrays, made once per set of lists."""
        c = self._valid(index)
        if c is None:
            c = self._cache = _Arrays(self._lists(), index,
                                      np.fromiter((index[o] for o in self.ops), dtype=np.intp, count=len(self.ops)),
                                      np.asarray(self.tp, dtype=np.intp), np.asarray(self.dp, dtype=np.intp),
                                      np.asarray(self.algo, dtype=np.intp))
        return c.ids, c.tp, c.dp, c.algo

    def looked_up(self, index: dict[str, int]) -> dict:
        """Where the cost model keeps its table lookups of these arrays (valid while the lists are)."""
        self.arrays(index)
        assert self._cache is not None
        return self._cache.looked

    def digest(self, index: dict[str, int]) -> bytes:
        """A short key of the ops and their tp, dp and algo (memo keys: the lists may be thousands long)."""
        looked = self.looked_up(index)
        key = looked.get("digest")
        if key is None:
            ids, tp, dp, algo = self.arrays(index)
            packed = (ids << 16 | tp << 8 | dp << 1 | algo).astype(np.int32)  # op < 2^15, tp and dp < 2^7
            key = looked["digest"] = hashlib.blake2b(packed.tobytes(), digest_size=16).digest()
        return key

    @staticmethod
    def joined(a: Stage, b: Stage, tp: list[int], dp: list[int], recompute: list[int]) -> Stage:
        """`a`'s ops then `b`'s, with these tp, dp and recompute lists (arrays joined when both have them)."""
        new = Stage(a.ops + b.ops, tp, dp, a.algo + b.algo, recompute)
        ca, cb = a._valid(), b._valid()
        if ca is not None and cb is not None and ca.index is cb.index:
            new._cache = _Arrays(new._lists(), ca.index, np.concatenate((ca.ids, cb.ids)),
                                 np.asarray(tp, dtype=np.intp), np.asarray(dp, dtype=np.intp),
                                 np.concatenate((ca.algo, cb.algo)))
        return new

    def part(self, sl: slice) -> Stage:
        """The ops of `sl` as a stage of their own (arrays and lookups sliced, not rebuilt)."""
        new = Stage(self.ops[sl], self.tp[sl], self.dp[sl], self.algo[sl], self.recompute[sl])
        c = self._valid()
        if c is not None:
            whole = sl.indices(len(self.ops)) == (0, len(self.ops), 1)  # a copy keeps the digest too
            looked = {k: v if k == "digest" else v[:, sl] for k, v in c.looked.items() if whole or k != "digest"}
            new._cache = _Arrays(new._lists(), c.index, c.ids[sl], c.tp[sl], c.dp[sl], c.algo[sl], looked)
        return new

    def scaled(self, dim: str, up: bool) -> Stage:
        """This stage with every op's tp (dim "tp") or dp (else) doubled (`up`) or halved (arrays kept)."""
        sizes = self.tp if dim == "tp" else self.dp
        changed = [x * 2 for x in sizes] if up else [x // 2 for x in sizes]
        tp, dp = (changed, self.dp) if dim == "tp" else (self.tp, changed)
        new = Stage(self.ops, tp, dp, self.algo, self.recompute)
        c = self._valid()
        if c is not None:
            old = c.tp if dim == "tp" else c.dp
            arr = old * 2 if up else old // 2
            new._cache = _Arrays(new._lists(), c.index, c.ids, *((arr, c.dp) if dim == "tp" else (c.tp, arr)),
                                 c.algo)
        return new

    @property
    def num_gpus(self) -> int:
        return self.tp[0] * self.dp[0]


@dataclass
class Config:
    """A parallel config: stages in pipeline order, the stage micro-batch (before DP splitting), global batch."""

    model: Model
    global_bs: int
    micro_bs: int
    stages: list[Stage]

    @property
    def num_gpus(self) -> int:
        return sum(s.num_gpus for s in self.stages)


@dataclass
class StageMemory:
    weights: float  # parameters plus the fp32 master copy
    gradients: float
    optimizer: float
    activations: float  # kept for the micro-batches of the stages behind
    peak: float  # one micro-batch in flight, plus the largest recomputed segment
    reserved: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.peak + self.reserved


@dataclass
class Prediction:
    """What the model says about a config: times in ms, memory in MB."""

    stage_ms: list[float]  # one micro-batch through the stage
    pipeline_ms: list[float]  # (M - 1) t_s + sum t_j per stage
    memory: list[StageMemory]
    compute_ms: list[float] = field(default_factory=list)  # fwd + bwd + recompute of one micro-batch
    ideal_ms: list[float] = field(default_factory=list)  # compute at tp = dp = 1, per GPU
    eff_loss_ms: list[float] = field(default_factory=list)
    recompute_ms: list[float] = field(default_factory=list)
    efficiency: list[float] = field(default_factory=list)
    outside_ms: list[float] = field(default_factory=list)  # after the pipeline: gradient all-reduce, optimizer

    @property
    def iteration_ms(self) -> float:
        return max(self.pipeline_ms)

    @property
    def max_memory(self) -> float:
        return max(m.total for m in self.memory)

    def throughput(self, global_bs: int) -> float:
        return global_bs / (self.iteration_ms / 1000)


class CostModel:
    """Predictions for one model and database on a cluster shape, with the reference's options."""

    def __init__(self, db: Database, gpus_per_node: int, memory_limit: float, *, kind: str = "reference",
                 shared_space: bool = True, reserved_space: bool = True, memory_pred: str = "MAX",
                 flex_recompute: bool = True, peak_mem_in_backward: float = 0.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"cost model {kind!r}: choose one of {', '.join(KINDS)}")
        self.db, self.model, self.kind = db, db.model, kind
        self.reference = kind == "reference"
        if not self.reference:
            missing = [tp for tp in db.tps if tp not in db.optimizer_us]
            if missing:
                f = db.path / optimizer_file(db.model, missing[0])
                raise ReproflowError(f"{f}: missing; the runtime model of {db.model.file_stem} needs the optimizer "
                                     f"step of every op at TP {', '.join(map(str, missing))}, which reproflow's "
                                     "profiler writes (profiles made before it: profile again into a new "
                                     "--results folder). Or use --model reference (Aceso's model, without the "
                                     "optimizer and gradient all-reduce).")
        if not self.reference and db.intra_band and not db.latency_us:
            raise ReproflowError(f"{db.path / P2P_LATENCY_FILE}: missing; the runtime model needs each link's message "
                                 "latency beside its P2P bandwidth, which reproflow's profiler writes (profiles made "
                                 "before it: profile again into a new --results folder). Or use --model reference.")
        self.gpus_per_node, self.memory_limit = gpus_per_node, memory_limit
        self.shared_space, self.reserved_space, self.memory_pred = shared_space, reserved_space, memory_pred
        self.flex_recompute = flex_recompute
        # MB the reference's --peak-mem-in-backward adds to a stage when deciding what to recompute
        self.peak_mem_in_backward = peak_mem_in_backward
        self.resharding = self.model.family != "t5"
        self.index = db.index()
        self.mbs_index = {m: i for i, m in enumerate(db.mbs)}
        self.no_recompute = self.model.no_recompute()
        # Activation weight per distinct op when tensors share storage (the reference's rules).
        self.share = np.array([self._share(op) for op in db.ops])
        self.starts = np.array([is_layer_start(op) for op in db.ops])
        self.recomputable = np.array([not is_layer_start(op) and "-relu" not in op and op not in self.no_recompute
                                      for op in db.ops])
        self._memo: dict[tuple, tuple] = {}
        self._pair_memo: dict[tuple, tuple[float, float]] = {}
        self._log2 = np.zeros(max(db.tps) + 1, dtype=np.intp)
        self._log2[db.tps] = np.arange(len(db.tps))
        self._mbs_lut = np.full(max(db.mbs) + 2, -1, dtype=np.intp)
        self._mbs_lut[db.mbs] = np.arange(len(db.mbs))

    def _share(self, op: str) -> float:
        if not self.shared_space:
            return 1.0
        if op == "enc-attention-dropout":
            return 1.5
        if op in SHARED_ZERO_OPS or "-bn3" in op or ("-downsample" in op and "0-0" not in op):
            return 0.0
        return 1.0

    def _lookup(self, ids: np.ndarray, tp: np.ndarray, mbs: np.ndarray, algo: np.ndarray) -> np.ndarray:
        """[field, op] values of the stage's ops."""
        m = self._mbs_lut[np.minimum(mbs, len(self._mbs_lut) - 1)]
        if (m < 0).any():
            bad = int(mbs[m < 0][0])
            raise ValueError(f"micro-batch {bad} per op is not in the profiled list {self.db.mbs}")
        return self.db.table[:, ids, m, self._log2[tp], algo]

    def _arrays(self, stage: Stage, micro_bs: int, flat: bool = False) -> tuple[np.ndarray, ...]:
        ids, tp, dp, algo = stage.arrays(self.index)
        if flat:
            tp = dp = np.ones(len(ids), dtype=np.intp)
        return ids, tp, dp, micro_bs // dp, algo

    def _values(self, stage: Stage, micro_bs: int, flat: bool = False) -> np.ndarray:
        """[field, op] values of a stage's ops, looked up once per stage and micro-batch."""
        looked = stage.looked_up(self.index)  # empty again if the stage's lists were replaced
        key = (micro_bs, flat)
        v = looked.get(key)
        if v is None:
            ids, tp, _, mbs, algo = self._arrays(stage, micro_bs, flat)
            v = looked[key] = self._lookup(ids, tp, mbs, algo)
        return v

    def op_us(self, stage: Stage, micro_bs: int) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) microseconds of each of the stage's ops on one micro-batch, at its TP and DP
        sizes: the terms `stage_time` sums."""
        v = self._values(stage, micro_bs)
        return v[F["forward-compute"]], v[F["backward-compute"]]

    def stage_time(self, stage: Stage, micro_bs: int, in_cross: bool, out_cross: bool,
                   flat: bool = False) -> tuple[float, float, float, float, float]:
        """(fwd, bwd, input comm, output comm, recompute) in microseconds for one micro-batch.

        `flat` evaluates the same ops at tp = dp = 1 on the whole micro-batch (the ideal compute)."""
        if not stage.ops:
            return 0.0, 0.0, 0.0, 0.0, 0.0
        key = ("time", stage.digest(self.index), bytes(stage.recompute), micro_bs, in_cross, out_cross, flat)
        hit = self._memo.get(key)
        return hit if hit is not None else self._remember(key, self._stage_time(stage, micro_bs, in_cross, out_cross,
                                                                                flat))

    def _stage_time(self, stage: Stage, micro_bs: int, in_cross: bool, out_cross: bool,
                    flat: bool) -> tuple[float, float, float, float, float]:
        ids, tp, dp, mbs, algo = self._arrays(stage, micro_bs, flat)
        v = self._values(stage, micro_bs, flat)
        fwd, bwd = float(v[F["forward-compute"]].sum()), float(v[F["backward-compute"]].sum())
        rc = _flags(stage.recompute)
        recomp = 0.0 if flat else float(v[F["forward-compute"]][rc].sum())
        size_in, size_out = float(v[F["input_size"], 0]), float(v[F["output_size"], -1])
        if self.reference:  # the reference looks the last op's output up at the first op's TP size
            size_out = float(self._lookup(ids[-1:], tp[:1], mbs[-1:], algo[-1:])[F["output_size"], 0])
        in_comm = size_in / self.db.bandwidth(size_in, in_cross, self.reference)
        out_comm = size_out / self.db.bandwidth(size_out, out_cross, self.reference)
        if not self.reference and not flat:  # every message also pays its link's fixed cost
            in_comm += self._latency(in_cross) if size_in > 0 else 0.0
            out_comm += self._latency(out_cross) if size_out > 0 else 0.0
        if self.resharding and not flat and len(ids) > 1:
            fwd_r, bwd_r = self._reshard_us(ids, tp, dp, algo, v[F["input_size"]])
            in_comm, out_comm = in_comm + fwd_r, out_comm + bwd_r
        return fwd, bwd, in_comm, out_comm, recomp

    def _latency(self, cross_node: bool) -> float:
        """Microseconds a message costs whatever its size (the intra-node figure where no inter-node one)."""
        lat = self.db.latency_us
        return lat.get("inter", lat.get("intra", 0.0)) if cross_node else lat.get("intra", 0.0)

    def _reshard_us(self, ids: np.ndarray, tp: np.ndarray, dp: np.ndarray, algo: np.ndarray,
                    sizes: np.ndarray) -> tuple[float, float]:
        """Forward and backward resharding time between neighbouring ops; each distinct
        (producer, consumer, layouts, size) pair is worked out once."""
        cols = [ids[:-1], tp[:-1], dp[:-1], algo[:-1], ids[1:], tp[1:], dp[1:], algo[1:],
                # sizes past 8 GB (the 1e6 of unprofiled entries) all cost a missing collective anyway
                np.minimum(np.round(sizes[1:] * 1000), 2**PAIR_BITS[-1] - 1).astype(np.int64)]
        # One int64 key per pair (sort of a 1-D array is far faster than unique rows).
        key = np.zeros(len(ids) - 1, dtype=np.int64)
        for col, bits in zip(cols, PAIR_BITS, strict=True):
            key = (key << bits) | col
        distinct, counts = np.unique(key, return_counts=True)
        fwd = bwd = 0.0
        for k, count in zip(distinct.tolist(), counts.tolist(), strict=True):
            f, b = self._pair_us(k)
            fwd, bwd = fwd + f * count, bwd + b * count
        return fwd, bwd

    def _pair_us(self, key: int) -> tuple[float, float]:
        hit = self._pair_memo.get(key)
        if hit is None:
            fields = []
            for bits in reversed(PAIR_BITS):
                fields.append(key & ((1 << bits) - 1))
                key >>= bits
            prev, tp0, dp0, a0, cur, tp1, dp1, a1, size = reversed(fields)
            fwd_prim, bwd_prim, group = reshard(op_spec(self.db.ops[prev], tp0, dp0, a0, False),
                                                op_spec(self.db.ops[cur], tp1, dp1, a1, True))
            mb = size / 1000
            hit = (self.db.collective_ms(fwd_prim, group, mb) * 1000 if fwd_prim else 0.0,
                   self.db.collective_ms(bwd_prim, group, mb) * 1000 if bwd_prim else 0.0)
            self._pair_memo[key] = hit
        return hit

    def stage_memory(self, stage: Stage, micro_bs: int, behind: int,
                     recompute: list[int] | np.ndarray | None = None) -> StageMemory:
        """Memory of one stage with `behind` stages after it (their micro-batches keep activations here)."""
        rc = stage.recompute if recompute is None else recompute
        ids = self._arrays(stage, micro_bs)[0]
        v = self._values(stage, micro_bs)
        act = v[F["activations"]]
        share = self.share[ids]
        weights = float(v[F["weights"]].sum())
        inputs = float(v[F["input_size"], 0])
        activations = float((act * share).sum())
        saved, peak = self._saved_and_peak(ids, rc, act, share)
        reserved = 0.0
        # The reference's floor of the weights' size is the CUDA allocator's: a CPU profile reserves nothing.
        if self.reserved_space and self.db.caching_allocator:
            fwd_r = float(v[F["fwd_reserved"], :-1].max(initial=0.0))
            bwd_r = float(v[F["bwd_reserved"], :-1].max(initial=0.0))
            reserved = max(fwd_r + bwd_r, weights) if self.memory_pred == "MAX" else max(fwd_r, bwd_r, weights)
        master, optim = self.db.memory_ratios
        kept = inputs + activations - saved
        return StageMemory(weights * (1 + master), weights, weights * optim, kept * behind, kept + peak, reserved)

    def _saved_and_peak(self, ids: np.ndarray, rc: list[int] | np.ndarray, act: np.ndarray,
                        share: np.ndarray) -> tuple[float, float]:
        """Activations not kept because they are recomputed, and the largest recomputed segment."""
        r = _flags(rc)
        if len(ids) <= 1 or not r.any():
            return 0.0, 0.0
        return self._walk(ids, act, share)(r)

    def _walk(self, ids: np.ndarray, act: np.ndarray, share: np.ndarray) -> Callable[[np.ndarray], tuple[float, float]]:
        """The reference's walk over a stage's ops, for any recompute flags of those ops.

        Where op i and op i + 1 are both recomputed, op i's (shared-weighted) activation joins the open
        segment and is not kept, unless op i + 1 starts a layer (its input is the checkpoint); a segment
        closes after such an op (and at the stage's last pair) or before a pair that is not recomputed;
        one still open at the end does not count. On arrays, with what does not depend on the flags
        worked out once: a stage of a 1000-layer model has thousands of ops."""
        a = act[:-1] * share[:-1]
        plain = share[:-1] == 1.0
        starts = self.starts[ids[1:]]
        not_kept = ~plain | ~starts
        ends = plain & starts
        ends[-1:] = plain[-1:]

        def walk(r: np.ndarray) -> tuple[float, float]:
            both = r[:-1] & r[1:]
            if not both.any():
                return 0.0, 0.0
            saved = float(a @ (both & not_kept))
            closes = np.flatnonzero(ends | ~both)
            if not len(closes):
                return saved, 0.0
            total = np.cumsum(a * both)[closes]
            return saved, float(max(total[0], np.diff(total).max(initial=0.0)))

        return walk

    def choose_recompute(self, stage: Stage, micro_bs: int, behind: int) -> list[int]:
        """The reference's flexible recompute: none if the stage fits, else the op groups (same op name
        across layers) with the most activation memory first, as many instances as the excess needs."""
        n = len(stage.ops)
        if not self.flex_recompute:
            return [1] * n
        key = ("recompute", stage.digest(self.index), micro_bs, behind)
        hit = self._memo.get(key)
        if hit is None:  # kept as bytes (0 or 1 an op): a list of ints costs 8 times the memory
            hit = self._remember(key, bytes(self._choose_recompute(stage, micro_bs, behind)))
        return list(hit)

    def _remember(self, key: tuple, value: Any) -> Any:
        """Memoise a stage-level result (a search evaluates the same stages in many configs)."""
        if len(self._memo) > 200000:
            self._memo.clear()
        self._memo[key] = value
        return value

    def _choose_recompute(self, stage: Stage, micro_bs: int, behind: int) -> list[int]:
        n = len(stage.ops)
        rc = np.zeros(n, dtype=np.int64)
        memory = self.stage_memory(stage, micro_bs, behind, rc).total + self.peak_mem_in_backward
        if memory <= self.memory_limit:
            return rc.tolist()
        ids = self._arrays(stage, micro_bs)[0]
        act, share = self._values(stage, micro_bs)[F["activations"]], self.share[ids]
        walk = self._walk(ids, act, share)
        # Groups are database ops (a stage has a few distinct ones, thousands of times over), kept in
        # order of first appearance: ties go to the earliest.
        first = np.full(len(self.recomputable), n)
        np.minimum.at(first, ids, np.arange(n))
        order = np.argsort(first, kind="stable")[:int((first < n).sum())]
        sizes = act * (behind + 1)
        totals = np.bincount(ids, weights=sizes, minlength=len(first))
        done = ~((totals > 0) & self.recomputable)
        saved, peak = 0.0, 0.0
        while memory > self.memory_limit:
            open_ = ~done[order]
            if not open_.any():
                break
            best = order[np.argmax(np.where(open_, totals[order], -np.inf))]
            done[best] = True
            members = np.flatnonzero(ids == best)
            nxt = members[0] + 1
            if nxt >= n:
                break
            done[ids[nxt]] = True
            excess = memory - self.memory_limit
            take = len(members)
            if totals[best] >= excess:
                take = min(int(np.searchsorted(np.cumsum(sizes[members]), excess, side="right")) + 1, take)
            chosen = members[:take]
            rc[chosen] = 1
            rc[chosen[chosen < n - 1] + 1] = 1
            new_saved, new_peak = walk(rc.astype(bool))
            memory += -(new_saved - saved) * (behind + 1) + (new_peak - peak)
            saved, peak = new_saved, new_peak
        return rc.tolist()

    def _stage(self, stage: Stage, micro_bs: int, behind: int, in_cross: bool,
               out_cross: bool) -> tuple[float, float, float, float, float, float, StageMemory, float]:
        """(time, compute, ideal, efficiency loss, recompute, efficiency) in ms, memory, and time outside the
        pipeline of one stage, memoised (a search evaluates the same stage in many configs)."""
        key = (stage.digest(self.index), bytes(stage.recompute), micro_bs, behind, in_cross, out_cross)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        fwd, bwd, cin, cout, rc = self.stage_time(stage, micro_bs, in_cross, out_cross)
        t = (fwd + bwd + cin + cout + rc) / 1000
        ffwd, fbwd, fin, fout, _ = self.stage_time(stage, micro_bs, in_cross, out_cross, flat=True)
        out = (t, (fwd + bwd + rc) / 1000, (ffwd + fbwd) / stage.num_gpus / 1000,
               ((fwd + bwd) - (ffwd + fbwd) / stage.num_gpus) / 1000, rc / 1000,
               (ffwd + fbwd + fin + fout) / 1000 / (t * stage.num_gpus), self.stage_memory(stage, micro_bs, behind),
               0.0 if self.reference else self.outside_ms(stage, micro_bs))
        return self._remember(key, out)

    def outside_ms(self, stage: Stage, micro_bs: int) -> float:
        """What the runtime does after the pipeline, per iteration: one all-reduce of the gradients of
        each (tp, dp) group of ops over its DP group (across nodes when the stage spans them), then an
        Adam step over the stage's weights (the profiled per-op steps)."""
        ids, tp, dp, _, _ = self._arrays(stage, micro_bs)
        weights = self._values(stage, micro_bs)[F["weights"]]
        buckets: dict[tuple[int, int], float] = {}
        for t, d, w in zip(tp.tolist(), dp.tolist(), weights.tolist(), strict=True):
            buckets[(t, d)] = buckets.get((t, d), 0.0) + w
        cross = stage.num_gpus > self.gpus_per_node
        reduce = sum(self.db.all_reduce_ms(d, mb, cross) for (_, d), mb in buckets.items() if d > 1)
        step = sum(float(self.db.optimizer_us[t][i]) for t, i in zip(tp.tolist(), ids.tolist(), strict=True)) / 1000
        return reduce + step

    def predict(self, config: Config) -> Prediction:
        """Every stage's time and memory, the pipeline time, and the policy's breakdowns."""
        m = config.global_bs // config.micro_bs
        rows = []
        before = 0
        n = len(config.stages)
        for i, stage in enumerate(config.stages):
            in_cross = before > 0 and before % self.gpus_per_node == 0
            before += stage.num_gpus
            rows.append(self._stage(stage, config.micro_bs, n - 1 - i, in_cross, before % self.gpus_per_node == 0))
        stage_ms = [r[0] for r in rows]
        total = sum(stage_ms)
        return Prediction(stage_ms, [t * (m - 1) + total + r[7] for t, r in zip(stage_ms, rows, strict=True)],
                          [r[6] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                          [r[4] for r in rows], [r[5] for r in rows], [r[7] for r in rows])
