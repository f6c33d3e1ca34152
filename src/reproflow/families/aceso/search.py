"""Aceso's search: iterative bottleneck alleviation, one independent search per pipeline depth.

Per depth: start from the balanced config (GPUs doubled round-robin, ops split evenly, every op
tp = stage GPUs, algo 0, recompute chosen to fit memory). Each trial targets the slowest stage
(the fullest one while any stage is out of memory) and runs a multi-hop search: the policy orders
the actions by the bottleneck's share of ideal compute, efficiency loss and recompute time; the
first action result that beats the trial's start time and fits is taken, else each result is
expanded one more hop (up to `max_hops`). Failed trials restart from the best config not yet
explored (within 1.2x of the best time), then revisit explored ones a few times (adaptive mode).

Actions, with the sign of their effect on (time, memory, devices, workload, efficiency, comm):
dec_op moves boundary ops from the bottleneck towards the stage with the most usable idle time;
inc_/dec_ tp/dp double or halve the bottleneck's GPUs along one dimension and take or give them
from the stages that lose least or gain most; inc_/dec_mbs change the micro-batch and re-pick
every stage's uniform (tp, dp). Every change keeps stage GPU counts in {1, 2, 4, 8}, their sum,
node boundaries on stage boundaries, and op micro-batches in the profiled list.

Differences from the reference: the search is deterministic (no randomness is used), and the best
config of each depth gets a last local polish (boundary ops moved one stage over while that helps),
and an op migration finds how many ops to move by bisection instead of trying 0, 1, 2, ... in turn.
The ops a migration moves take the receiving stage's boundary tp/dp and keep their algo, as there.

Near ties: each depth keeps its fastest config per micro-batch; with a tie resolution (the tiny
models' profiles on a shared machine), configs predicted within it of the fastest, first within each
depth and then among the depths' configs, are a near tie, and the one with the smallest micro-batch,
then the fewest stages, is kept (`settle`): where the profile cannot tell two configs apart, a rule no
timing enters picks, not the machine's state during the profile.

The budget: by default a count of explored cases per depth (the count the reference prints), so one
database, one set of options, one config on any machine, however fast or loaded; the reference's clock
(`budget_s`, seconds per depth, as its per-process budget) is kept as an option, and with it the config
depends on the machine's speed and on what else runs on it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from reproflow.families.aceso.costmodel import Config, CostModel, Prediction, Stage
from reproflow.families.aceso.settings import CASES

INF = float("inf")
clock = time.monotonic  # the clock of the trend and of the artifact's budget (a test sets it)
POLISH_AT = 0.9  # share of the budget after which the search stops and the polish may run


def budget_text(cases: int, seconds: float | None) -> str:
    """A search's budget in words: the count, or the clock where `seconds` is given."""
    if seconds is not None:
        return f"{seconds:g} s per depth (the clock: the config depends on the machine and its load)"
    return f"{cases} explored cases per depth"


@dataclass(frozen=True)
class Options:
    """The reference's search settings."""

    global_bs: int
    mbs_list: tuple[int, ...]
    num_nodes: int
    gpus_per_node: int
    memory_limit: float
    max_tp: int
    max_hops: int = 7
    budget_cases: int = CASES
    budget_s: float | None = None  # the reference's clock instead of the count: machine-dependent
    max_trials: int = 100
    op_group_size: int = 1
    max_op_move_steps: int = 5
    adaptive_times: int = 5
    finetune_after_trial: int = 0
    sort_metric: str = "max_stage_time"

    @property
    def budget(self) -> str:
        """The budget that runs, in words."""
        return budget_text(self.budget_cases, self.budget_s)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(eq=False)
class Point:
    """A config with its prediction and the per-stage values the policy uses."""

    config: Config
    pred: Prediction
    efficient: list[float]
    adaptive: int = 0
    _key: tuple | None = field(default=None, repr=False)

    @property
    def time(self) -> float:
        return max(self.pred.pipeline_ms)

    @property
    def memory(self) -> float:
        return self.pred.max_memory

    def key(self) -> tuple:
        """The config as a hashable key, made once (a point's config is never changed in place): bytes of
        the per-op lists (small non-negative ints), which are thousands long at depth and cache their hash."""
        if self._key is None:
            c = self.config
            self._key = (c.micro_bs, tuple((len(s.ops), bytes(s.tp), bytes(s.dp), bytes(s.recompute), bytes(s.algo))
                                           for s in c.stages))
        return self._key


@dataclass(frozen=True)
class Action:
    name: str
    time: str
    memory: str
    devices: str
    workload: str
    efficiency: str
    comm: str


ACTIONS = (
    Action("dec_op", "-", "-", "0", "-", "0", "0"),
    Action("inc_dp", "-", "-", "+", "0", "-", "+"),
    Action("dec_dp", "+", "+", "-", "0", "+", "-"),
    Action("inc_tp", "-", "-", "+", "0", "-", "+"),
    Action("dec_tp", "+", "+", "-", "0", "+", "-"),
    Action("inc_mbs", "-", "+", "0", "0", "+", "0"),
    Action("dec_mbs", "+", "-", "0", "0", "-", "0"),
)
ANY = ("+", "-", "0")


def _filter(exclude: list[Action], time_: tuple = ANY, memory: tuple = ANY, comm: tuple = ANY) -> list[Action]:
    return [a for a in ACTIONS if a not in exclude and a.time in time_ and a.memory in memory and a.comm in comm]


def clone(config: Config) -> Config:
    return Config(config.model, config.global_bs, config.micro_bs, [s.part(slice(None)) for s in config.stages])


@dataclass
class Result:
    num_stages: int
    best: Point | None
    explored: int
    seconds: float
    trials: int
    trend: list[tuple[float, float]] = field(default_factory=list)  # (search seconds, best ms)
    by_mbs: dict[int, Point] = field(default_factory=dict)  # the fastest fitting config per micro-batch

    @property
    def seconds_to_best(self) -> float:
        """Search time until the final best config was found."""
        return self.trend[-1][0] if self.trend else 0.0


class DepthSearch:
    """The search for one pipeline depth."""

    def __init__(self, cost: CostModel, ops: list[str], opts: Options, num_stages: int) -> None:
        self.cost, self.ops, self.opts, self.n = cost, ops, opts, num_stages
        self.explored = 0
        self.visited: set[tuple] = set()
        self.targets: dict[tuple, set[int]] = {}
        self.partners: dict[tuple, set[int]] = {}
        self.unexplored: list[Point] = []
        self.explored_points: list[Point] = []
        self.best_time = INF
        self.start = 0.0
        self.trial_start = 0.0
        self.by_mbs: dict[int, Point] = {}

    # --- evaluation -------------------------------------------------------------------------
    def evaluate(self, config: Config) -> Point:
        pred = self.cost.predict(config)
        p = Point(config, pred, self._efficient_idle(config, pred))
        kept = self.by_mbs.get(config.micro_bs)
        if self.fits(p) and (kept is None or p.time < kept.time):
            self.by_mbs[config.micro_bs] = p
        return p

    def _efficient_idle(self, config: Config, pred: Prediction) -> list[float]:
        """Idle time a stage could absorb, weighted by its GPUs and efficiency (partner choice)."""
        top, limit, out = max(pred.pipeline_ms), self.opts.memory_limit, []
        for s, used, mem, eff in zip(config.stages, pred.pipeline_ms, pred.memory, pred.efficiency, strict=True):
            gap = top - used
            if any(s.recompute):
                idle = gap / 2
            else:
                by_memory = (limit - mem.total) / mem.total * used
                idle = gap if by_memory > gap else by_memory + (gap - by_memory) / 2
            out.append(idle * s.num_gpus * eff)
        return out

    def fits(self, p: Point) -> bool:
        return p.memory <= self.opts.memory_limit

    def time_up(self, share: float = POLISH_AT) -> bool:
        """Past `share` of the budget (the search stops at POLISH_AT, the polish at the full budget)."""
        if self.opts.budget_s is not None:
            return clock() - self.start >= self.opts.budget_s * share
        return self.explored >= self.opts.budget_cases * share

    def alone_ms(self, stage: Stage, micro_bs: int) -> float:
        """One micro-batch through a stage, intra-node links (the reference's partner estimate)."""
        return sum(self.cost.stage_time(stage, micro_bs, False, False)) / 1000

    def recompute(self, config: Config, i: int) -> None:
        s = config.stages[i]
        s.recompute = self.cost.choose_recompute(s, config.micro_bs, len(config.stages) - 1 - i)

    def legal(self, config: Config) -> bool:
        total, bounds = 0, set()
        for s in config.stages:
            if s.num_gpus not in (1, 2, 4, 8):
                return False
            total += s.num_gpus
            bounds.add(total)
        g = self.opts.gpus_per_node
        return total == self.opts.num_gpus and all(g * k in bounds for k in range(1, self.opts.num_nodes + 1))

    # --- initial config ---------------------------------------------------------------------
    def initial(self) -> Config | None:
        gpus = [1] * self.n
        grew = True
        while sum(gpus) < self.opts.num_gpus and grew:
            grew = False
            for i in range(self.n):
                left = self.opts.num_gpus - sum(gpus)
                if left > 0 and gpus[i] < self.opts.max_tp and gpus[i] <= left:
                    gpus[i] *= 2
                    grew = True
        if sum(gpus) != self.opts.num_gpus:
            return None
        total = len(self.ops)
        counts = [total // self.n] * self.n
        counts[-1] += total - sum(counts)
        stages, start = [], 0
        for g, c in zip(gpus, counts, strict=True):
            stages.append(Stage(self.ops[start:start + c], [g] * c, [1] * c, [0] * c, [0] * c))
            start += c
        config = Config(self.cost.model, self.opts.global_bs, self.opts.mbs_list[0], stages)
        for i in range(self.n):
            self.recompute(config, i)
        return config

    # --- targets and partners ---------------------------------------------------------------
    def target(self, p: Point, values: list[float] | None = None, tag: str = "", adaptive: bool = False) -> int | None:
        key = (p.key(), tag)
        seen = self.targets.setdefault(key, set())
        if not adaptive and len(seen) >= self.n:
            return None
        if values is None:
            values = [m.total for m in p.pred.memory] if not self.fits(p) else p.pred.pipeline_ms
        best, top = None, 0.0
        for i, v in enumerate(values):
            if v > top and (adaptive or i not in seen):
                best, top = i, v
        if best is not None:
            seen.add(best)
        return best

    def partner(self, p: Point, target: int, by_memory: bool, tag: str = "") -> int | None:
        key = (p.key(), target, tag)
        seen = self.partners.setdefault(key, set())
        if len(seen) >= self.n - 1:
            return None
        candidates = [i for i in range(self.n) if i != target and i not in seen]
        if by_memory:
            mem = [m.total for m in p.pred.memory]
            best = min(candidates, key=lambda i: mem[i], default=None)
        else:
            best = max((i for i in candidates if p.efficient[i] > 0), key=lambda i: p.efficient[i], default=None)
        if best is not None:
            seen.add(best)
        return best

    # --- actions ----------------------------------------------------------------------------
    def apply(self, p: Point, b: int, action: str) -> Point | None:
        if action == "dec_op":
            return self.migrate(p, b)
        if action.endswith("_mbs"):
            config = self.change_mbs(p.config, action == "inc_mbs")
        else:
            config = self.move_gpus(p.config, b, action)
        return None if config is None else self.evaluate(config)

    def value_after(self, config: Config, b: int, partner: int | None, moved: int, metric: str,
                    scale: str = "", dim: str = "") -> float:
        """Time or memory of stage `b` after moving `moved` boundary ops out, or scaling tp/dp."""
        s = config.stages[b]
        sl = slice(0, len(s.ops) - moved) if partner is not None and b < partner else slice(moved, None)
        st = s.part(sl)
        if scale:
            st = st.scaled(dim, up=scale == "inc")
        behind = len(config.stages) - 1 - b
        if moved or scale:
            st.recompute = self.cost.choose_recompute(st, config.micro_bs, behind)
        if metric == "memory":
            return self.cost.stage_memory(st, config.micro_bs, behind).total
        return self.alone_ms(st, config.micro_bs)

    def move_once(self, config: Config, b: int, toward: int, step: int) -> Config:
        """Move `step` boundary ops from stage `b` to its neighbour on the side of `toward`; the moved
        ops take the receiving stage's boundary tp and dp and keep their algo."""
        if step == 0 or len(config.stages[b].ops) <= step or b == toward:
            return config
        new = clone(config)
        s = new.stages[b]
        if b < toward:
            r = new.stages[b + 1]
            moved = s.part(slice(len(s.ops) - step, None))
            new.stages[b + 1] = Stage.joined(moved, r, [r.tp[0]] * step + r.tp, [r.dp[0]] * step + r.dp,
                                             [0] * step + r.recompute)
            new.stages[b] = s.part(slice(0, len(s.ops) - step))
            self.recompute(new, b + 1)
        else:
            left = new.stages[b - 1]
            moved = s.part(slice(0, step))
            new.stages[b - 1] = Stage.joined(left, moved, left.tp + [left.tp[-1]] * step,
                                             left.dp + [left.dp[-1]] * step, left.recompute + [0] * step)
            new.stages[b] = s.part(slice(step, None))
            self.recompute(new, b - 1)
        self.recompute(new, b)
        return new

    def migrate(self, p: Point, b: int) -> Point | None:
        """dec_op: shift ops from the bottleneck towards a partner, hop by hop, to reach a goal."""
        by_memory = not self.fits(p)
        metric = "memory" if by_memory else "time"
        partner = self.partner(p, b, by_memory)
        result = None
        for step in range(self.opts.max_op_move_steps):
            if b is None or partner is None:
                break
            config = p.config
            if by_memory:
                goals = [self.opts.memory_limit]
            else:
                gap = p.pred.compute_ms[b] - p.pred.compute_ms[partner]
                goals = [p.pred.compute_ms[b] - gap * r for r in (0.4, 0.2, 0.0)]
            moved = None
            for goal in goals:
                cur, new = b, config
                while cur != partner:
                    k = self._fewest_ops(new, cur, partner, goal, metric)
                    if k is None:
                        break
                    new = self.move_once(new, cur, partner, k)
                    cur += 1 if cur < partner else -1
                self.explored += 1
                if self.value_after(new, cur, cur, 0, metric) < goal:
                    moved = new
                    break
                if self.time_up():
                    break
            if moved is None:
                break
            p = result = self.evaluate(moved)
            b = self.target(p, tag=f"mig{step}")
            if b is not None:
                partner = self.partner(p, b, not self.fits(p), tag=f"mig{step}")
        return result

    def _fewest_ops(self, config: Config, b: int, partner: int, goal: float, metric: str) -> int | None:
        """The fewest boundary ops (in steps of op_group_size) whose move brings stage `b` under `goal`.

        Where the reference scans 0, 1, 2, ..., this brackets the answer: moving more ops out never makes
        a stage slower or fuller, and time and memory grow nearly linearly with a stage's ops, so a
        secant guess through the bracket's ends lands near the answer (a bisection step after two
        guesses that did not halve the bracket). On a 1000-layer model a scan costs thousands of stage
        evaluations, a bisection a dozen, this about half as many."""
        counts = range(0, len(config.stages[b].ops), self.opts.op_group_size)

        def under(j: int) -> tuple[bool, float]:
            v = self.value_after(config, b, partner, counts[j], metric)
            return v < goal, v

        ok, v_lo = under(0)
        if ok:
            return counts[0]
        last = len(counts) - 1
        if last == 0:
            return None
        # Bracket (lo over the goal, hi under it), hi first presumed: a stage left with its last
        # op is all but empty; checked only if the answer comes down to it.
        lo, hi, v_hi, stalled = 0, last, 0.0, 0
        while hi - lo > 1:
            width = hi - lo
            j = (lo + hi) // 2  # a bisection step after two guesses that did not halve the bracket
            if stalled < 2 and v_lo > v_hi:
                j = min(max(lo + math.ceil((v_lo - goal) / (v_lo - v_hi) * width), lo + 1), hi - 1)
            ok, v = under(j)
            if ok:
                hi, v_hi = j, v
            else:
                lo, v_lo = j, v
            stalled = stalled + 1 if hi - lo > width // 2 else 0
        if hi == last and not under(last)[0]:
            return None
        return counts[hi]

    def _legal_producer(self, config: Config, i: int, dim: str) -> bool:
        s = config.stages[i]
        if s.num_gpus == 1 or (dim == "tp" and min(s.tp) == 1):
            return False
        if dim == "dp":
            return min(s.dp) > 1 and all(d > 1 and config.micro_bs // (d // 2) in self.opts.mbs_list for d in set(s.dp))
        return True

    def _legal_consumer(self, config: Config, i: int, dim: str) -> bool:
        s = config.stages[i]
        if s.num_gpus * 2 > self.opts.num_gpus - (self.n - 1):
            return False
        if dim == "tp":
            return max(s.tp) * 2 <= self.opts.max_tp
        return all(config.micro_bs // (d * 2) in self.opts.mbs_list for d in set(s.dp))

    def _next(self, config: Config, skip: list[int], inc: bool, limit: float = INF) -> tuple[int | None, str]:
        """The stage (and dimension) that loses least time giving up half its GPUs (or gains most doubling)."""
        best, best_dim, best_t = None, "", INF
        for i, s in enumerate(config.stages):
            size = s.num_gpus if inc else s.num_gpus // 2
            if i in skip or size > limit:
                continue
            for dim in ("tp", "dp"):
                ok = self._legal_consumer(config, i, dim) if inc else self._legal_producer(config, i, dim)
                if ok:
                    t = self.value_after(config, i, None, 0, "time", "inc" if inc else "dec", dim)
                    if t < best_t:
                        best, best_dim, best_t = i, dim, t
        return best, best_dim

    @staticmethod
    def _scale(config: Config, i: int, dim: str, up: bool) -> None:
        config.stages[i] = config.stages[i].scaled(dim, up)

    def move_gpus(self, config: Config, b: int, action: str) -> Config | None:
        """inc_/dec_ tp/dp: the bottleneck doubles (halves) one dimension; partners balance the GPUs."""
        if self.n <= 1:
            return None
        inc, dim = action.startswith("inc"), action.split("_")[1]
        ok = self._legal_consumer(config, b, dim) if inc else self._legal_producer(config, b, dim)
        if not ok:
            return None
        tried: list[int] = []
        for _ in range(self.n - 1):
            self.explored += 1
            other, other_dim = self._next(config, [*tried, b], inc=not inc)
            tried.append(other if other is not None else -1)
            if other is None:
                break
            producer, pdim, consumer, cdim = (other, other_dim, b, dim) if inc else (b, dim, other, other_dim)
            give, need = config.stages[producer].num_gpus // 2, config.stages[consumer].num_gpus
            new = clone(config)
            partners = [b]
            if give >= need:
                self._scale(new, producer, pdim, up=False)
                partners.append(producer)
                cur, cdim_ = consumer, cdim
                while give > 0 and cur is not None:
                    take = config.stages[cur].num_gpus
                    self._scale(new, cur, cdim_, up=True)
                    partners.append(cur)
                    give -= take
                    if give > 0:
                        cur, cdim_ = self._next(config, partners, inc=True, limit=give)
            else:
                self._scale(new, consumer, cdim, up=True)
                partners.append(consumer)
                cur, pdim_ = producer, pdim
                while need > 0 and cur is not None:
                    take = config.stages[cur].num_gpus // 2
                    self._scale(new, cur, pdim_, up=False)
                    partners.append(cur)
                    need -= take
                    if need > 0:
                        cur, pdim_ = self._next(config, partners, inc=False, limit=need)
            if self.legal(new):
                for i in range(self.n):
                    self.recompute(new, i)
                return new
        return None

    def change_mbs(self, config: Config, inc: bool) -> Config | None:
        """inc_/dec_mbs: the next micro-batch size; every stage re-picks its best uniform (tp, dp)."""
        self.explored += 1
        lst = list(self.opts.mbs_list)
        i = lst.index(config.micro_bs) + (1 if inc else -1)
        if i < 0 or i >= len(lst):
            return None
        new = Config(config.model, config.global_bs, lst[i], [])
        for k, s in enumerate(config.stages):
            stage = self._best_uniform(s, lst[i], self.n - 1 - k)
            if stage is None:
                return None
            new.stages.append(stage)
        return new

    def _best_uniform(self, s: Stage, micro_bs: int, behind: int) -> Stage | None:
        best, best_cost = None, INF
        tp = 1
        while tp <= self.opts.max_tp:
            dp = s.num_gpus // tp
            if dp >= 1 and tp * dp == s.num_gpus and micro_bs // dp in self.opts.mbs_list:
                st = Stage(s.ops, [tp] * len(s.ops), [dp] * len(s.ops), s.algo, [0] * len(s.ops))
                st.recompute = self.cost.choose_recompute(st, micro_bs, behind)
                cost = self.alone_ms(st, micro_bs) * s.num_gpus
                mem = self.cost.stage_memory(st, micro_bs, behind).total
                if mem > self.opts.memory_limit:
                    cost += mem * 10  # the reference's memory penalty
                if cost < best_cost:
                    best, best_cost = st, cost
            tp *= 2
        return best

    # --- policy -----------------------------------------------------------------------------
    def ordered_actions(self, p: Point, b: int) -> list[list[Action]]:
        """The reference's ordering: memory first; else by the bottleneck's share of ideal compute,
        efficiency loss and recompute time."""
        if not self.fits(p):
            return [_filter([], memory=("-",))]
        pred = p.pred
        shares = []
        for values in (pred.ideal_ms, pred.eff_loss_ms, pred.recompute_ms):
            total = sum(values)
            shares.append(values[b] / total if values[b] > 0 and total else 0.0)
        comp, loss, rec = pred.ideal_ms[b], pred.eff_loss_ms[b], pred.recompute_ms[b]
        avg_comp, avg_loss = sum(pred.ideal_ms) / self.n, sum(pred.eff_loss_ms) / self.n
        groups: list[list[Action]] = []
        used: list[Action] = []
        remaining = [0, 1, 2]
        while remaining:
            kind = max(remaining, key=lambda k: (shares[k], -k))
            remaining.remove(kind)
            less_comm = ("-", "0") if loss > avg_loss else ANY
            less_mem = ("-", "0") if rec > 0 else ANY
            less_time = ("-", "0") if comp > avg_comp else ANY
            if kind == 0:
                first = _filter(used, time_=("-",), comm=less_comm, memory=less_mem)
                second = _filter(used + first, time_=("-",))
            elif kind == 1:
                first = _filter(used, time_=less_time, comm=("-",), memory=less_mem)
                second = _filter(used + first, comm=("-",))
            else:
                first = _filter(used, time_=less_time, comm=less_comm, memory=("-",))
                second = _filter(used + first, memory=("-",))
            groups += [first, second]
            used += first + second
        groups.append(_filter(used))
        return groups

    # --- search -----------------------------------------------------------------------------
    def hop(self, p: Point, depth: int, start_time: float, adaptive: bool) -> Point | None:
        if depth == self.opts.max_hops or self.time_up():
            return None
        self.visited.add(p.key())
        if not adaptive:
            self.explored_points.append(p)
            if p in self.unexplored:
                self.unexplored.remove(p)
        b = self.target(p, adaptive=adaptive)
        if b is None:
            return None
        seen = [p]
        for group in self.ordered_actions(p, b):
            results = []
            for action in group:
                if self.time_up():
                    break
                q = self.apply(p, b, action.name)
                if q is not None and q.key() not in self.visited:
                    results.append(q)
            better = [q for q in results if q.time < start_time and self.fits(q)]
            for q in results:
                if q.time < self.best_time * 1.2:
                    self.unexplored.append(q)
            if better:
                return min(better, key=lambda q: q.time)
            for q in sorted(results, key=self._sort_key):
                seen.append(q)
                nxt = self.hop(q, depth + 1, start_time, adaptive=False)
                if nxt is not None:
                    if nxt.time < start_time and self.fits(nxt):
                        return nxt
                    seen.append(nxt)
        return self._best_of(seen)

    def _sort_key(self, q: Point) -> float:
        """Order of a hop's results: the slowest stage, or the GPU time of all stages (--sort-metric)."""
        if self.opts.sort_metric == "total_gpu_time":
            return sum(t * s.num_gpus for t, s in zip(q.pred.stage_ms, q.config.stages, strict=True))
        return q.time

    def _best_of(self, points: list[Point]) -> Point | None:
        ok = [q for q in points if self.fits(q)]
        if ok:
            return min(ok, key=lambda q: q.time)
        return min(points, key=lambda q: q.memory, default=None)

    def trial(self, p: Point, start_time: float, adaptive: bool) -> Point | None:
        self.partners.clear()
        seen = [p]
        for _ in range(self.n):
            q = self.hop(p, 0, start_time, adaptive)
            if q is not None:
                seen.append(q)
                if q.time < start_time and self.fits(q):
                    return q
        return self._best_of(seen)

    def run(self) -> Result:
        self.start = clock()
        config = self.initial()
        if config is None:
            return Result(self.n, None, 0, 0.0, 0)
        p = self.evaluate(config)
        best = p if self.fits(p) else None
        self.best_time = p.time if self.fits(p) else INF
        memory = p.memory
        trend = [(0.0, self.best_time)]
        trials = 0
        adaptive = False
        while trials < self.opts.max_trials and not self.time_up():
            q = self.trial(p, self.best_time, adaptive) or p
            for _ in range(self.opts.finetune_after_trial):
                q = self.finetune(q)
            trials += 1
            adaptive = False
            if (q.time < self.best_time and self.fits(q)) or (memory > self.opts.memory_limit and q.memory < memory):
                memory, p = q.memory, q
                best = q if self.fits(q) else best
                if self.fits(q):
                    self.best_time = q.time
                trend.append((clock() - self.start, self.best_time))
                continue
            p = self._pop_candidate()
            if p is None:
                adaptive = True
                p = self._adaptive_candidate()
                if p is None:
                    break
        if best is not None:
            polished = self.polish(best)
            if polished is not best:
                best = polished
                trend.append((clock() - self.start, best.time))
        return Result(self.n, best, self.explored, clock() - self.start, trials, trend, self.by_mbs)

    def polish(self, p: Point, max_ops: int = 16) -> Point:
        """Move 1..max_ops ops across each stage boundary while that shortens the iteration and fits,
        within the last tenth of the budget.

        Not in the reference: a last local step that picks up boundary shifts its randomised order
        may leave (a few ms on the miniset); it never makes the config slower."""
        improved = True
        while improved:
            improved = False
            for b in range(self.n - 1):
                for src, dst in ((b, b + 1), (b + 1, b)):
                    for k in range(1, max_ops + 1):
                        if self.time_up(1.0):
                            return p
                        config = self.move_once(p.config, src, dst, k)
                        if config is p.config:
                            break
                        self.explored += 1
                        q = self.evaluate(config)
                        if self.fits(q) and q.time < p.time:
                            p, improved = q, True
                            break
        return p

    # --- op-level tuning (--finetune-after-trial) ----------------------------------------------
    def finetune(self, p: Point) -> Point:
        """Per stage: the best change of tp/dp over a run of consecutive ops, then the best algo per
        tunable op; each kept when the stage gets faster and fits, as the reference's `finetune`."""
        config, changed = p.config, False
        for i in range(self.n):
            for tune in (self._tune_dims, self._tune_algos):
                s = config.stages[i]
                if s.num_gpus == 1 or self.time_up():
                    continue
                behind = self.n - 1 - i
                t0 = self.alone_ms(s, config.micro_bs)
                new = tune(s, config.micro_bs, behind)
                if new is not None and self.alone_ms(new, config.micro_bs) < t0 and self._fits_stage(
                        new, config.micro_bs, behind):
                    if not changed:
                        config, changed = clone(config), True
                    config.stages[i] = new
        return self.evaluate(config) if changed else p

    def _fits_stage(self, s: Stage, micro_bs: int, behind: int) -> bool:
        return self.cost.stage_memory(s, micro_bs, behind).total <= self.opts.memory_limit

    def _tune_dims(self, s: Stage, micro_bs: int, behind: int) -> Stage | None:
        """From each tunable op, forwards and backwards, trade a factor 2 between tp and dp op by op
        while the sizes allow; the fastest variant that fits (the least memory when none fits)."""
        mbs, n = self.opts.mbs_list, len(s.ops)
        variants = []
        for start in range(n):
            if not self.cost.model.tunable(s.ops[start]):
                continue
            for to_dp in (False, True):
                for span in (range(start, n), range(start, -1, -1)):
                    tp, dp = list(s.tp), list(s.dp)
                    for k in span:
                        if to_dp and tp[k] > 1 and micro_bs // (dp[k] * 2) in mbs:
                            tp[k], dp[k] = tp[k] // 2, dp[k] * 2
                        elif not to_dp and tp[k] < self.opts.max_tp and dp[k] > 1 and micro_bs // (dp[k] // 2) in mbs:
                            tp[k], dp[k] = tp[k] * 2, dp[k] // 2
                        else:
                            break
                    if tp == s.tp:
                        continue
                    self.explored += 1
                    st = Stage(s.ops, tp, dp, s.algo, [0] * n)
                    st.recompute = self.cost.choose_recompute(st, micro_bs, behind)
                    variants.append((self.alone_ms(st, micro_bs), self.cost.stage_memory(st, micro_bs, behind).total,
                                     st))
        if not variants:
            return None
        fitting = [v for v in variants if v[1] < self.opts.memory_limit]
        return min(fitting, key=lambda v: v[0])[2] if fitting else min(variants, key=lambda v: v[1])[2]

    def _tune_algos(self, s: Stage, micro_bs: int, behind: int) -> Stage | None:
        """Op by op, the other partition algorithm where it makes the stage faster (and fits)."""
        algos = list(s.algo)
        best_t = self.alone_ms(s, micro_bs)
        over = self.cost.stage_memory(s, micro_bs, behind).total > self.opts.memory_limit
        for k, op in enumerate(s.ops):
            if not self.cost.model.tunable(op):
                continue
            for a in self.cost.model.algos:
                if a == algos[k]:
                    continue
                self.explored += 1
                trial = Stage(s.ops, s.tp, s.dp, [*algos[:k], a, *algos[k + 1:]], s.recompute)
                t = self.alone_ms(trial, micro_bs)
                if t < best_t and (over or self._fits_stage(trial, micro_bs, behind)):
                    algos, best_t = trial.algo, t
        return None if algos == s.algo else Stage(s.ops, s.tp, s.dp, algos, s.recompute)

    def _pop_candidate(self) -> Point | None:
        if not self.unexplored:
            return None
        p = self._best_of(self.unexplored)
        self.unexplored.remove(p)
        return p

    def _adaptive_candidate(self) -> Point | None:
        pool = [q for q in self.explored_points if q.adaptive < self.opts.adaptive_times]
        p = self._best_of(pool)
        if p is not None:
            p.adaptive += 1
        return p


def _search_depth(args: tuple[CostModel, list[str], Options, int]) -> Result:
    cost, ops, opts, n = args
    return DepthSearch(cost, ops, opts, n).run()


def parallel(opts: Options, depths: int) -> int:
    """How many depths search at once by default. On the clock every depth runs at once, as the reference
    runs them, since each depth's budget starts with the search. On the count, one depth a core: more
    add no speed and the same config, and each holds what it explored (several GB at a thousand layers)."""
    return depths if opts.budget_s is not None else max(1, min(depths, len(os.sched_getaffinity(0))))


def search(cost: CostModel, ops: list[str], opts: Options, depths: range, processes: int = 0) -> list[Result]:
    """One search per pipeline depth, in parallel processes (`processes` = 0: `parallel`'s default)."""
    jobs = [(cost, ops, opts, n) for n in depths]
    workers = processes or parallel(opts, len(jobs))
    if workers == 1 or len(jobs) == 1:
        return [_search_depth(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_search_depth, jobs))


TIE_RULE = "the rule keeps the smallest micro-batch, then the fewest stages"


def settle(times: Sequence[float], order: Sequence[tuple], resolution: float) -> tuple[int, list[int]]:
    """The candidate kept and those in a near tie with the fastest, by index, from each candidate's
    predicted time (`times`) and a key no timing enters (`order`): a candidate predicted within
    `resolution` of the fastest (0.01: 1 %) is in a near tie, and of those the first by `order` is kept.
    With no resolution the fastest is kept, as the reference keeps it."""
    fastest = min(range(len(times)), key=lambda i: (times[i], order[i]))
    tied = [i for i in range(len(times)) if times[i] <= times[fastest] * (1 + resolution)]
    return min(tied, key=lambda i: order[i]), tied


def settle_points(points: list[Point], resolution: float) -> tuple[Point, list[Point]]:
    """`settle` over search configs (their max stage time); the kept one and those in the near tie."""
    kept, tied = settle([p.time for p in points], [(p.config.micro_bs, len(p.config.stages)) for p in points],
                        resolution)
    return points[kept], [points[i] for i in tied]


def describe(p: Point) -> str:
    """A config in a few words: depth, micro-batch and predicted time."""
    return f"{len(p.config.stages)} stages, micro-batch {p.config.micro_bs}: {p.time:.2f} ms"
