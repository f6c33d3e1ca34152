"""Aceso's performance model: per-stage time and memory of a config from a profiled database.

Per stage and micro-batch (each op k runs micro_bs / dp_k samples at tp_k with algo_k):
time = sum fwd + sum bwd + fwd of recomputed ops + input and output P2P time (intra- or
inter-node bandwidth by where the stage boundary falls) + resharding between neighbouring ops
whose layouts differ (GPT and ResNet; T5 ops declare no layouts). A 1F1B pipeline of M = global /
micro batches takes max over stages of (M - 1) t_s + sum_j t_j. Memory per stage = weights (with
the fp32 master copy for fp16 models) + gradients + optimizer state + activations kept for the
stages behind + the peak of one micro-batch + reserved (allocator) memory, as the reference.

Where this model differs from the reference on purpose:
* the output P2P time looks up the last op at its own TP size (the reference uses the first op's);
* stage time inside the search uses the true cross-node flags (the reference assumes intra-node
  there and only in its final report uses them).
Like the reference, it does not model the data-parallel gradient all-reduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from reproflow.families.aceso.database import FIELDS, Database
from reproflow.families.aceso.models import Model, is_layer_start, op_spec, reshard

F = {name: i for i, name in enumerate(FIELDS)}
SHARED_ZERO_OPS = ("enc-attention-softmax", "bn1")


@dataclass
class Stage:
    """One pipeline stage: its ops and, per op, TP size, DP size, partition algorithm, recompute flag."""

    ops: list[str]
    tp: list[int]
    dp: list[int]
    algo: list[int]
    recompute: list[int]

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

    def __init__(self, db: Database, gpus_per_node: int, memory_limit: float, *, shared_space: bool = True,
                 reserved_space: bool = True, memory_pred: str = "MAX", flex_recompute: bool = True) -> None:
        self.db, self.model = db, db.model
        self.gpus_per_node, self.memory_limit = gpus_per_node, memory_limit
        self.shared_space, self.reserved_space, self.memory_pred = shared_space, reserved_space, memory_pred
        self.flex_recompute = flex_recompute
        self.resharding = self.model.family != "t5"
        self.index = db.index()
        self.mbs_index = {m: i for i, m in enumerate(db.mbs)}
        self.no_recompute = self.model.no_recompute()
        # Activation weight per distinct op when tensors share storage (the reference's rules).
        self.share = np.array([self._share(op) for op in db.ops])
        self._memo: dict[tuple, tuple] = {}

    def _share(self, op: str) -> float:
        if not self.shared_space:
            return 1.0
        if op == "enc-attention-dropout":
            return 1.5
        if op in SHARED_ZERO_OPS or "-bn3" in op or ("-downsample" in op and "0-0" not in op):
            return 0.0
        return 1.0

    def _lookup(self, ops: list[str], tp: list[int], mbs: list[int], algo: list[int]) -> np.ndarray:
        """[field, op] values of the stage's ops."""
        try:
            m = [self.mbs_index[b] for b in mbs]
        except KeyError as exc:
            raise ValueError(f"micro-batch {exc.args[0]} per op is not in the profiled list {self.db.mbs}") from None
        ids = [self.index[o] for o in ops]
        t = [int(math.log2(x)) for x in tp]
        return self.db.table[:, ids, m, t, algo]

    def stage_time(self, stage: Stage, micro_bs: int, in_cross: bool, out_cross: bool,
                   flat: bool = False) -> tuple[float, float, float, float, float]:
        """(fwd, bwd, input comm, output comm, recompute) in microseconds for one micro-batch.

        `flat` evaluates the same ops at tp = dp = 1 on the whole micro-batch (the ideal compute)."""
        n = len(stage.ops)
        if n == 0:
            return 0.0, 0.0, 0.0, 0.0, 0.0
        tp = [1] * n if flat else stage.tp
        dp = [1] * n if flat else stage.dp
        mbs = [micro_bs // d for d in dp]
        v = self._lookup(stage.ops, tp, mbs, stage.algo)
        fwd, bwd = float(v[F["forward-compute"]].sum()), float(v[F["backward-compute"]].sum())
        rc = np.asarray(stage.recompute, dtype=bool)
        recomp = 0.0 if flat else float(v[F["forward-compute"]][rc].sum())
        size_in, size_out = float(v[F["input_size"], 0]), float(v[F["output_size"], -1])
        in_comm = size_in / self.db.bandwidth(size_in, in_cross)
        out_comm = size_out / self.db.bandwidth(size_out, out_cross)
        if self.resharding and not flat:
            for k in range(1, n):
                fwd_prim, bwd_prim, group = reshard(
                    op_spec(stage.ops[k - 1], tp[k - 1], dp[k - 1], stage.algo[k - 1], False),
                    op_spec(stage.ops[k], tp[k], dp[k], stage.algo[k], True))
                size = float(v[F["input_size"], k])
                if fwd_prim is not None:
                    in_comm += self.db.collective_ms(fwd_prim, group, size) * 1000
                if bwd_prim is not None:
                    out_comm += self.db.collective_ms(bwd_prim, group, size) * 1000
        return fwd, bwd, in_comm, out_comm, recomp

    def stage_memory(self, stage: Stage, micro_bs: int, behind: int, recompute: list[int] | None = None) -> StageMemory:
        """Memory of one stage with `behind` stages after it (their micro-batches keep activations here)."""
        ops, rc = stage.ops, stage.recompute if recompute is None else recompute
        v = self._lookup(ops, stage.tp, [micro_bs // d for d in stage.dp], stage.algo)
        act = v[F["activations"]]
        share = self.share[[self.index[o] for o in ops]]
        weights = float(v[F["weights"]].sum())
        inputs = float(v[F["input_size"], 0])
        activations = float((act * share).sum())
        saved, peak = self._saved_and_peak(ops, rc, act, share)
        reserved = 0.0
        if self.reserved_space:
            fwd_r = float(v[F["fwd_reserved"], :-1].max(initial=0.0))
            bwd_r = float(v[F["bwd_reserved"], :-1].max(initial=0.0))
            reserved = max(fwd_r + bwd_r, weights) if self.memory_pred == "MAX" else max(fwd_r, bwd_r, weights)
        master, optim = self.model.memory_ratios
        kept = inputs + activations - saved
        return StageMemory(weights * (1 + master), weights, weights * optim, kept * behind, kept + peak, reserved)

    @staticmethod
    def _saved_and_peak(ops: list[str], rc: list[int], act: np.ndarray, share: np.ndarray) -> tuple[float, float]:
        """Activations not kept because they are recomputed, and the largest recomputed segment."""
        saved, segment, peak = 0.0, 0.0, 0.0
        n = len(ops)
        if n <= 1 or not any(rc):
            return 0.0, 0.0
        for i in range(n - 1):
            if rc[i] and rc[i + 1]:
                a = float(act[i]) * float(share[i])
                starts = is_layer_start(ops[i + 1])
                if share[i] != 1.0:
                    saved += a
                    segment += a
                    continue
                saved += 0.0 if starts else a
                segment += a
                if starts or i + 1 == n - 1:
                    peak, segment = max(peak, segment), 0.0
            elif segment > 0:
                peak, segment = max(peak, segment), 0.0
        return saved, peak

    def choose_recompute(self, stage: Stage, micro_bs: int, behind: int) -> list[int]:
        """The reference's flexible recompute: none if the stage fits, else the op groups (same op name
        across layers) with the most activation memory first, as many instances as the excess needs."""
        n = len(stage.ops)
        if not self.flex_recompute:
            return [1] * n
        rc = [0] * n
        memory = self.stage_memory(stage, micro_bs, behind, rc).total
        if memory <= self.memory_limit:
            return rc
        v = self._lookup(stage.ops, stage.tp, [micro_bs // d for d in stage.dp], stage.algo)
        act, share = v[F["activations"]], self.share[[self.index[o] for o in stage.ops]]
        groups: dict[str, list[int]] = {}
        for i, op in enumerate(stage.ops):
            groups.setdefault(op, []).append(i)
        sizes = {op: [float(act[i]) * (behind + 1) for i in idx] for op, idx in groups.items()}
        done: set[str] = set()
        saved, peak = 0.0, 0.0
        while memory > self.memory_limit:
            candidates = [op for op in groups if op not in done and sum(sizes[op]) > 0 and not is_layer_start(op)
                          and "-relu" not in op and op not in self.no_recompute]
            if not candidates:
                break
            best = max(candidates, key=lambda op: sum(sizes[op]))
            done.add(best)
            nxt = groups[best][0] + 1
            if nxt >= n:
                break
            done.add(stage.ops[nxt])
            excess, take, got = memory - self.memory_limit, 0, 0.0
            if sum(sizes[best]) < excess:
                take = len(groups[best])
            else:
                while got <= excess and take < len(groups[best]):
                    got += sizes[best][take]
                    take += 1
            for i in groups[best][:take]:
                rc[i] = 1
                if i < n - 1:
                    rc[i + 1] = 1
            new_saved, new_peak = self._saved_and_peak(stage.ops, rc, act, share)
            memory += -(new_saved - saved) * (behind + 1) + (new_peak - peak)
            saved, peak = new_saved, new_peak
        return rc

    def _stage(self, stage: Stage, micro_bs: int, behind: int, in_cross: bool,
               out_cross: bool) -> tuple[float, float, float, float, float, float, StageMemory]:
        """(time, compute, ideal, efficiency loss, recompute, efficiency) in ms and memory of one stage, memoised
        (a search evaluates the same stage in many configs)."""
        key = (tuple(stage.ops), tuple(stage.tp), tuple(stage.dp), tuple(stage.algo), tuple(stage.recompute),
               micro_bs, behind, in_cross, out_cross)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        fwd, bwd, cin, cout, rc = self.stage_time(stage, micro_bs, in_cross, out_cross)
        t = (fwd + bwd + cin + cout + rc) / 1000
        ffwd, fbwd, fin, fout, _ = self.stage_time(stage, micro_bs, in_cross, out_cross, flat=True)
        out = (t, (fwd + bwd + rc) / 1000, (ffwd + fbwd) / stage.num_gpus / 1000,
               ((fwd + bwd) - (ffwd + fbwd) / stage.num_gpus) / 1000, rc / 1000,
               (ffwd + fbwd + fin + fout) / 1000 / (t * stage.num_gpus), self.stage_memory(stage, micro_bs, behind))
        if len(self._memo) > 200000:
            self._memo.clear()
        self._memo[key] = out
        return out

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
        return Prediction(stage_ms, [t * (m - 1) + total for t in stage_ms], [r[6] for r in rows],
                          [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows],
                          [r[5] for r in rows])
