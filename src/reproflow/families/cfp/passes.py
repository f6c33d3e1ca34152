"""CFP's three passes on the job's ranks: analysis, segment profiling, and the search that runs its plan.

The analysis captures the whole training step and finds ParallelBlocks and unique segments
(graph.py). The profile pass captures each unique segment alone (a half layer: x -> x + f(norm(x))
with its backward, or the output head with the loss), runs every combination of its blocks'
strategies on the mesh, once with its input replicated and once split by batch (what the previous
segment hands over), times the fastest combinations again lowered (as the search runs plans), and
caches step time, memory and the partition of the output on disk. The
search composes a plan by dynamic programming over the global segment sequence (the state is the
partition of the activation between segments; an output in another partition, e.g. partial sums,
pays the measured redistribution of the activation and of its gradient), keeps plans under the
memory limit, then runs the plan it found and the baselines for real.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from reproflow.families.cfp import alpa, execute, graph, models, torch_baselines
from reproflow.families.cfp.choices import TORCH_BASELINES, baseline_of, kind_of
from reproflow.families.cfp.graph import Analysis, R
from reproflow.rank.context import RunContext
from reproflow.rank.timing import interleaved_steps, places, slowest_steps
from reproflow.spec import documents
from reproflow.spec.documents import Count, Either, Index, MapOf
from reproflow.spec.errors import ParamError, PointFailed
from reproflow.spec.family import Measurement
from reproflow.store.files import atomic_write

P = -2  # partial sums (an output only)


def mesh_shape(text: str, world_size: int) -> tuple[int, ...]:
    """The `mesh` parameter as axis sizes: '' or a shape with a one-device axis (1x4, 4x1) is the 1-D mesh
    of all ranks (a strategy on a one-device axis moves nothing), 'AxB' a 2-D mesh of A*B ranks."""
    try:
        axes = tuple(int(x) for x in text.lower().split("x")) if text else (world_size,)
    except ValueError:
        axes = ()
    if not axes or len(axes) > 2 or min(axes) < 1 or math.prod(axes) != world_size:
        raise ParamError(f"mesh {text!r} is not a 1-D or 2-D mesh of the job's {world_size} ranks.",
                         f"'' (1-D) or AxB with A*B = {world_size}, e.g. 2x{world_size // 2}")
    big = tuple(x for x in axes if x > 1)
    return big if len(big) == 2 else (world_size,)


@dataclass(frozen=True)
class Setup:
    model: str
    size: str
    num_layer: int
    batch_size: int
    n: int
    work_dir: Path
    mesh: tuple[int, ...] = ()  # a 2-D mesh's axis sizes; () for 1-D
    hosts: int = 1  # the ranks' hosts: profiles across a network are not those of one host

    @classmethod
    def of(cls, params: Mapping[str, Any], n: int, hosts: int = 1) -> Setup:
        axes = mesh_shape(params.get("mesh", ""), n)
        return cls(params["model"], params["size"], params["num_layer"], params["batch_size"], n,
                   Path(params["work_dir"]), axes if len(axes) == 2 else (), hosts)

    @classmethod
    def on(cls, params: Mapping[str, Any], ctx: RunContext) -> Setup:
        """The setup of a job's ranks (their hosts counted)."""
        return cls.of(params, ctx.world_size, len(set(ctx.hosts())))

    @property
    def states(self) -> tuple[Any, ...]:
        """Partitions an activation enters a segment with: replicated, or split by batch (over all devices)."""
        return ((R, R), (0, 0)) if self.mesh else (R, 0)

    @property
    def config(self) -> models.ModelConfig:
        return models.config_of(self.model, self.size, self.num_layer)

    @property
    def dir(self) -> Path:
        c = self.config
        mesh = f"-m{'x'.join(map(str, self.mesh))}" if self.mesh else ""
        hosts = f"-h{self.hosts}" if self.hosts > 1 else ""
        return self.work_dir / f"{self.model}-{self.size}-L{c.num_layers}-B{self.batch_size}-n{self.n}{hosts}{mesh}"


def check(params: Mapping[str, Any], world_size: int) -> None:
    s = Setup.of(params, world_size)
    c = s.config
    if s.batch_size % world_size:
        raise ParamError(f"batch_size {s.batch_size} does not split over {world_size} ranks.",
                         f"a batch_size divisible by {world_size}")
    if c.hidden_size % c.num_heads:
        raise ParamError(f"hidden size {c.hidden_size} is not a multiple of {c.num_heads} heads.", "another size")
    if s.model == "moe" and s.batch_size * c.seq_len % min(c.expert_group_size, s.batch_size * c.seq_len):
        raise ParamError(f"batch_size x seq_len ({s.batch_size * c.seq_len}) is not a multiple of the expert group "
                         f"size {c.expert_group_size}.", "a batch_size that fills whole expert groups")


def global_step(s: Setup, meta: bool = False) -> tuple[models.LanguageModel, execute.Captured]:
    """The model and its whole training step, captured and analysed for the mesh. With `meta` the model
    holds no memory (the analysis alone, at the reference's sizes)."""
    if meta:
        with torch.device("meta"):
            model = models.LanguageModel(s.model, s.config)
            tokens = targets = torch.zeros(s.batch_size, s.config.seq_len, dtype=torch.long)
    else:
        model = models.build(s.model, s.config)
        tokens, targets = models.batch(s.config, s.batch_size)
    return model, execute.capture(model, [tokens, targets], s.n, "model", mesh=s.mesh)


def segment_step(model: models.LanguageModel, key: str, s: Setup) -> execute.Captured:
    """One segment alone: a half layer (input activation and the gradient of its output), or the head."""
    c = s.config
    g = torch.Generator().manual_seed(1)
    x = torch.randn(s.batch_size, c.seq_len, c.hidden_size, generator=g)
    if key == "out":
        return execute.capture(model.segments()[key], [x, models.batch(c, s.batch_size)[1]], s.n, "head",
                               mesh=s.mesh)
    dy = torch.randn(s.batch_size, c.seq_len, c.hidden_size, generator=g) / (s.batch_size * c.seq_len)
    return execute.capture(model.segments()[key], [x, dy], s.n, "layer", mesh=s.mesh)


def signature(a: Analysis, lo: int, hi: int) -> str:
    return hashlib.sha256(repr([b.signature() for b in a.blocks[lo:hi]]).encode()).hexdigest()[:16]


def _place(t: DTensor) -> Any:
    """The partition of a DTensor: an int on a 1-D mesh, a tuple on a 2-D one."""
    parts = tuple(R if isinstance(p, Replicate) else P if isinstance(p, Partial) else int(p.dim)  # type: ignore[attr-defined]
                  for p in t.placements)
    return parts if len(parts) > 1 else parts[0]


def _name(p: Any) -> str:
    if isinstance(p, tuple | list):
        return "".join(_name(q) for q in p)
    return {R: "R", P: "P"}.get(p, f"S({p})")


def _key(p: Any) -> Any:
    """A partition read back from JSON (a list on a 2-D mesh) as the tuple the search compares."""
    return tuple(p) if isinstance(p, list) else p


def analysis(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    s = Setup.on(params, ctx)
    _, cap = global_step(s, meta=True)
    a = cap.analysis
    if ctx.rank == 0:
        s.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(s.dir / "analysis.txt", graph.describe(a) + "\n")
        atomic_write(s.dir / "strategy_map.txt", graph.strategy_map(a))
    if params["verbose"]:
        ctx.log(graph.describe(a))
    else:
        for (lo, hi), k in zip(a.segments, a.mapped, strict=True):
            ctx.log(f"ParallelBlocks sequence: ({lo}, {hi}) mapped to  {a.segments[k]}")
        ctx.log(f"global analysis time: {a.seconds}")
    ctx.log(f"FLOP_COUNT: {a.flops() / 1e12}")
    unique = a.unique_segments()
    cfp_space = sum(math.prod(a.search_space(k)) for k in unique)
    op_space = sum(a.operator_space(k) for k in unique)
    ctx.log(f"{len(a.graph.graph.nodes)} operators, {len(a.contractions())} contractions, {len(a.blocks)} "
            f"ParallelBlocks, {len(a.segments)} segments, {len(unique)} unique; profiled combinations "
            f"{cfp_space} vs {op_space} with per-operator enumeration; written to {s.dir}")
    return [Measurement("analysis_time", a.seconds, "s"), Measurement("operators", len(a.graph.graph.nodes), "count"),
            Measurement("contractions", len(a.contractions()), "count"),
            Measurement("parallel_blocks", len(a.blocks), "count"), Measurement("segments", len(a.segments), "count"),
            Measurement("unique_segments", len(unique), "count"),
            Measurement("profiled_space", cfp_space, "count"), Measurement("operator_space", op_space, "count"),
            Measurement("flop_count", a.flops() / 1e12, "TFLOP")]


def _mesh(ctx: RunContext, s: Setup) -> DeviceMesh:
    return init_device_mesh(ctx.device.type, s.mesh or (ctx.world_size,))


def profile(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    s = Setup.on(params, ctx)
    model, cap = global_step(s)
    a = cap.analysis
    mesh = _mesh(ctx, s)
    prof = s.dir / "profile"
    rows: list[Measurement] = []
    unique = a.unique_segments()
    ctx.log(f"NUM SEGMENT is {len(unique)}")
    t_all = time.perf_counter()
    for k in unique:
        lo, hi = a.segments[k]
        key = a.blocks[lo].layer
        path = prof / f"segment_{k}.json"
        sig = signature(a, lo, hi)
        if not params["force"] and _profiled(path, sig, params["lower_top"], params["lower_repeats"]):
            ctx.log(f"segment {k} ({key}): profiled already, {path}")
            continue
        seg = segment_step(model, key, s)
        if [b.signature() for b in seg.analysis.blocks] != [b.signature() for b in a.blocks[lo:hi]]:
            raise PointFailed(f"segment {k} ({key}) captured alone has other ParallelBlocks than in the model")
        space = [len(seg.analysis.choices(b)) for b in seg.analysis.blocks]
        ctx.log(f"\nRUN AutoSharding FOR SEGMENT {k} segment_{k} ({key})\n\nsegment PB search space: {space}")
        entries = []
        t0 = time.perf_counter()
        for combo in itertools.product(*(range(x) for x in space)):
            for state in s.states:  # the partition the previous segment hands over
                seg.input_placements = [state, state]
                runner = execute.Runner(seg, mesh, execute.assignment(seg.analysis, combo))
                times = slowest_steps(ctx, runner.seconds, params["warmup"], params["repeats"])
                res = runner.last
                mem = max(ctx.gather_floats(float(res.peak_bytes)))
                cost = statistics.median(times)
                entries.append({"combo": list(combo), "time_s": cost, "times_s": times, "memory_bytes": mem,
                                "in": state, "out": _place(res.outputs[0]), "grad": _place(res.outputs[1])})
                ctx.log(f"SegmentIdx: {k} ParallelBlock Strategy: {list(combo)} input {_name(state)} avgcost: "
                        f"{cost} mem_cost(GB): {mem / 2**30:.6f}")
        _lower_fastest(ctx, seg, mesh, entries, params, s.states)
        seconds = time.perf_counter() - t0
        if ctx.rank == 0:
            prof.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps({"segment": k, "layer": key, "signature": sig, "space": space,
                                           "lower_top": params["lower_top"],
                                           "lower_repeats": params["lower_repeats"], "seconds": seconds,
                                           "entries": entries}, indent=1) + "\n")
        rows += [Measurement("segment_combinations", len(entries), "count", {"segment": k}),
                 Measurement("segment_profile_time", seconds, "s", {"segment": k})]
    path = prof / "boundary.json"
    if not path.exists() or params["force"]:
        table = boundary_costs(ctx, mesh, s, params["repeats"])
        if ctx.rank == 0:
            atomic_write(path, json.dumps(table, indent=1) + "\n")
    total = time.perf_counter() - t_all
    ctx.log(f"overlapped_profiling overall time {total}")
    return [*rows, Measurement("profile_time", total, "s")]


def _lower_fastest(ctx: RunContext, seg: execute.Captured, mesh: DeviceMesh, entries: list[dict],
                   params: Mapping[str, Any], states: tuple[Any, ...]) -> None:
    """Time the `lower_top` fastest combinations of each input partition again lowered, as the search
    runs its plan, in turns, `lower_repeats` steps each (a median of 2 steps let one spike rank GPT's
    head wrongly), and keep that time (the DTensor runner's as `eager_time_s`). Profiling every
    combination lowered would cost a trace each, several times a combination's DTensor steps; the
    fastest are the ones a plan picks, and lowering only removes per-op overhead, so a combination
    left out is not undercounted."""
    for state in states:
        mine = sorted((e for e in entries if e["in"] == state), key=lambda e: e["time_s"])[:params["lower_top"]]
        seg.input_placements = [state, state]
        lowered = [execute.Lowered(execute.Runner(seg, mesh, execute.assignment(seg.analysis, e["combo"])))
                   for e in mine]
        # In turns, so that the machine's drift does not rank the candidates the search chooses between.
        timed = interleaved_steps(ctx, {str(k): low.seconds for k, low in enumerate(lowered)}, params["warmup"],
                                  params["lower_repeats"])
        for k, (e, low) in enumerate(zip(mine, lowered, strict=True)):
            times = timed[str(k)]
            e.update(eager_time_s=e["time_s"], time_s=statistics.median(times), times_s=times,
                     lower_s=max(ctx.gather_floats(low.trace_s)))
            ctx.log(f"lowered: {e['combo']} input {_name(state)}: {e['time_s']} s (DTensor runner {e['eager_time_s']} "
                    f"s; trace {e['lower_s']:.2f} s)")


def boundary_costs(ctx: RunContext, mesh: DeviceMesh, s: Setup, repeats: int) -> dict[str, float]:
    """Measured seconds to redistribute the activation between segments, per (from, to) partition (on a
    2-D mesh, every combination of the axes' partitions to each input partition): the median of `repeats`
    after one untimed, each the slowest rank's."""
    c = s.config
    full = torch.randn(s.batch_size, c.seq_len, c.hidden_size)
    parts = (R, P, 0, 1, 2)
    out: dict[str, float] = {}
    for src in (itertools.product(parts, repeat=len(s.mesh)) if s.mesh else parts):
        axes = src if isinstance(src, tuple) else (src,)
        split = [R if q == P else q for q in axes]
        partial = [k for k, q in enumerate(axes) if q == P]
        local = distribute_tensor(full, mesh, execute.placements(tuple(split) if s.mesh else split[0], mesh))
        local = local.to_local() / math.prod(mesh.size(k) for k in partial)
        want = [Partial() if q == P else execute.placement(q, mesh.size(k))[0] for k, q in enumerate(axes)]
        for dst in s.states:
            step = functools.partial(_redistribute_s, local, mesh, want, execute.placements(dst, mesh))
            out[f"{src},{dst}"] = statistics.median(slowest_steps(ctx, step, 1, repeats))
    return out


# Timed all-gathers a size for the link's fit, at least: the fastest of a few is the link's cost, where one
# or two meet a core another process holds (a loaded 2-core machine timed 16 KB slower than 4 MB).
LINK_REPEATS = 5


def all_gathers(ctx: RunContext, mesh: DeviceMesh, repeats: int,
                sizes: tuple[int, ...] = (2**14, 2**16, 2**18, 2**20, 2**22)) -> list[tuple[float, float]]:
    """(bytes, seconds) of all-gathers of a float tensor of each size (the whole, gathered), as the runtime
    moves activations (DTensor from a split to replicated): the fastest of `repeats` (at least
    LINK_REPEATS) after one untimed, each the slowest rank's, so that every rank has the same."""
    out = []
    for nbytes in sizes:
        local = torch.zeros(nbytes // 4 // mesh.size(), device=mesh.device_type)
        times = slowest_steps(ctx, functools.partial(_redistribute_s, local, mesh, [Shard(0)], [Replicate()]), 1,
                              max(repeats, LINK_REPEATS))
        out.append((float(nbytes), min(times)))
    return out


def _redistribute_s(local: torch.Tensor, mesh: DeviceMesh, source: Sequence[Any], target: Sequence[Any]) -> float:
    """Seconds of one redistribution of this rank's `local` shard, placed as `source`, to `target` (its
    result used), from a barrier, on this rank."""
    t = DTensor.from_local(local, mesh, source, run_check=False)
    torch.distributed.barrier()
    t0 = time.perf_counter()
    t.redistribute(mesh, target).to_local().sum().item()
    return time.perf_counter() - t0


@dataclass
class Found:
    choice: list[int]  # a strategy per global ParallelBlock
    predicted_s: float
    memory_bytes: float
    search_s: float


def dynamic_program(a: Analysis, profiles: dict[int, dict[str, Any]], boundary: dict[str, float],
                    memory_limit: float, states: tuple[Any, ...] = (R, 0)) -> Found:
    """The fastest plan under the memory limit: segments in order, state = (the activation's partition, the
    partition the last segment was profiled with: `states`, the replicated one first). Each step pays what
    its segment's profile left out: the activation brought to the partition the segment was profiled with
    (where the last one left partial sums or another split), and the gradient it hands back brought to the
    partition the last segment was profiled with (its output's gradient came in as its input came in: a
    head that splits the hidden dim leaves a split gradient to every layer before it, gathered there)."""
    t0 = time.perf_counter()
    # (state, last segment's input partition) -> Pareto list of (time, memory, choice)
    frontier: dict[Any, list[tuple[float, float, list[int]]]] = {(states[0], states[0]): [(0.0, 0.0, [])]}
    for k in range(len(a.segments)):
        nxt: dict[Any, list[tuple[float, float, list[int]]]] = {}
        for (prev, before), paths in frontier.items():
            for e in profiles[a.mapped[k]]["entries"]:
                enter, leave, grad = _key(e["in"]), _key(e["out"]), _key(e["grad"])
                if prev in states and enter != prev:
                    continue  # profiled with exactly this input partition
                move = 0.0 if prev in states else boundary[f"{prev},{enter}"]
                back = 0.0 if k == 0 or grad == before else boundary[f"{grad},{before}"]
                for t, m, ch in paths:
                    cand = (t + move + back + e["time_s"], m + e["memory_bytes"], ch + e["combo"])
                    if cand[1] <= memory_limit:
                        nxt.setdefault((leave, enter), []).append(cand)
        frontier = {st: _pareto(v) for st, v in nxt.items()}
    best = min((p for v in frontier.values() for p in v), default=None)
    if best is None:
        raise PointFailed(f"no plan fits the memory limit of {memory_limit / 2**30:.3f} GB per device; raise "
                          "memory_limit_gb")
    return Found(best[2], best[0], best[1], time.perf_counter() - t0)


def _pareto(paths: list[tuple[float, float, list[int]]], keep: int = 64) -> list[tuple[float, float, list[int]]]:
    out: list[tuple[float, float, list[int]]] = []
    for p in sorted(paths, key=lambda p: (p[0], p[1])):
        if not out or p[1] < out[-1][1]:
            out.append(p)
    return out[:keep]


def _weighted(a: Analysis, c: Any) -> bool:
    """Whether a contraction multiplies by a parameter (possibly through a transpose or view)."""
    return any(graph.layout_chain(x, a.param_names.__contains__)[-1] in a.param_names for x in graph.operands(c))


def _feeding(a: Analysis, c: Any, layer: str, owner: dict[Any, Any]) -> set[Any]:
    """The weight contractions of `layer` whose outputs reach c's left operand: through any operator and
    through the layer's weightless contractions (attention scores), not through weight GEMMs."""
    def mine(x: Any) -> bool:
        return x in owner and owner[x].layer == layer and _weighted(a, x)

    return graph.upstream(graph.operands(c)[0], mine,
                          lambda x: x in owner and (owner[x].layer != layer or _weighted(a, x)))


def baseline(a: Analysis, name: str) -> list[int]:
    """Data parallel: every block splits rows (the batch), over all devices. Tensor parallel (Megatron):
    a weight GEMM that reads the output of a column-split GEMM of its layer splits its contraction, any
    other weight GEMM splits its columns; blocks without weights (attention scores, expert dispatch)
    split the batch; on a 2-D mesh that on axis 1, with data parallelism on axis 0."""
    if name == "data-parallel":
        return [0] * len(a.blocks)
    owner = {c: b for b in a.blocks for c in b.plans}
    choice: dict[int, int] = {}
    for b in a.blocks:
        if not _weighted(a, b.entry):
            choice[b.index] = 0
            continue
        col = next(i for i, s in enumerate(b.strategies) if s.lhs == R and s.rhs >= 0)
        contr = next((i for i, s in enumerate(b.strategies) if s.allreduce), col)
        fed_by_col = any(owner[c].plans[c][choice[owner[c].index]].out >= 0 and
                         owner[c].plans[c][choice[owner[c].index]].lhs == R
                         for c in _feeding(a, b.entry, b.layer, owner) if owner[c].index in choice)
        choice[b.index] = contr if fed_by_col else col
    return [_beside_data(a, b, choice[b.index]) for b in a.blocks]


def _beside_data(a: Analysis, b: graph.Block, t: int) -> int:
    """The index among a block's mesh strategies of 1-D strategy t: alone on a 1-D mesh, on axis 1 beside
    data parallelism on axis 0 of a 2-D one (on both axes when t is the data-parallel strategy)."""
    ch = a.choices(b)
    return next((i for i, c in enumerate(ch) if c[0] != c[-1] and c[-1] == t), ch.index((t,) * len(ch[0])))


def _profiled(path: Path, sig: str, lower_top: int, lower_repeats: int) -> bool:
    """Whether `path` holds a readable profile of the segment with signature `sig`, its `lower_top`
    fastest combinations timed lowered `lower_repeats` times, each with the partition of the gradient it
    hands back (profiles before that are redone)."""
    try:
        d = json.loads(path.read_text())
        return (d.get("signature") == sig and d.get("lower_top") == lower_top
                and d.get("lower_repeats") == lower_repeats and all("grad" in e for e in d.get("entries", [])))
    except (OSError, ValueError, AttributeError):
        return False


SEGMENT_SHAPE = {"segment": Index, "layer": str, "signature": str, "space": [Count], "seconds": float,
                 "entries": [{"combo": [Index], "time_s": float, "memory_bytes": float, "in": Either(int, [int]),
                             "out": Either(int, [int]), "grad": Either(int, [int])}]}


def _segment_profile(path: Path, sig: str, space: list[int], again: str) -> dict:
    """A segment's profile, checked: of this segment (signature), one strategy index per block in range."""
    d = documents.read(path, again, SEGMENT_SHAPE)
    if d["signature"] != sig or d["space"] != space:
        raise ParamError(f"{path} profiles another segment than this model's (signature or search space differ).",
                         again)
    for i, entry in enumerate(d["entries"]):
        if len(entry["combo"]) != len(space) or any(c >= n for c, n in zip(entry["combo"], space, strict=True)):
            raise ParamError(f"{path}: entries[{i}].combo {entry['combo']} does not pick one of {space} strategies "
                             "per block.", again)
    if not d["entries"]:
        raise ParamError(f"{path} has no entries.", again)
    return d


def search(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    s = Setup.on(params, ctx)
    _, cap = global_step(s)
    a = cap.analysis
    prof = s.dir / "profile"
    profiles = {}
    again = "run the profile pass again (reproflow cfp profile with the same options and --force)"
    for k in a.unique_segments():
        path = prof / f"segment_{k}.json"
        lo, hi = a.segments[k]
        if not path.exists():
            raise ParamError(f"no profile of segment {k} for this model and mesh in {prof}.",
                             "run the profile pass first (reproflow cfp profile with the same options)")
        profiles[k] = _segment_profile(path, signature(a, lo, hi), a.search_space(k), again)
    boundary = documents.read(prof / "boundary.json", again, MapOf(float))
    limit = params["memory_limit_gb"] * 2**30 if params["memory_limit_gb"] > 0 else float("inf")
    try:
        found = dynamic_program(a, profiles, boundary, limit, s.states)
    except KeyError as exc:
        raise ParamError(f"{prof / 'boundary.json'} has no time for the boundary {exc}.", again) from None
    profile_s = sum(p["seconds"] for p in profiles.values())
    ctx.log(f"searched ParallelBlock Strategies solution: {found.choice}")
    flops = a.flops()
    mesh = _mesh(ctx, s)
    rows = [Measurement("tokens", float(s.batch_size * s.config.seq_len), "count", {"plan": "cfp"}),
            Measurement("predicted_time", found.predicted_s, "s", {"plan": "cfp"}),
            Measurement("predicted_memory", found.memory_bytes / 2**30, "GB", {"plan": "cfp"})]
    choices = {"cfp": list(found.choice)}
    plans: dict[str, tuple[dict, str, float]] = {
        "cfp": (execute.assignment(a, found.choice), str(found.choice), found.search_s + profile_s + a.seconds)}
    for b in (b for b in params["baselines"].split(",") if b):
        if s.mesh and (b == "alpa" or b in TORCH_BASELINES):
            ctx.log(f"{b}: not run on the {params['mesh']} mesh (" + ("its integer program is over 1-D strategies"
                    if b == "alpa" else "it does not depend on the mesh") + "); the 1-D mesh's search runs it")
            continue
        if b == "alpa":
            link = alpa.fit_link(all_gathers(ctx, mesh, params["repeats"]), s.n)  # the same on every rank
            sol = alpa.solve(a, link)
            # The ranks must run one assignment: rank 0's (a tie may be broken differently elsewhere).
            cons = a.contractions()
            picks = ctx.gather_objects([graph.strategies(c, a.n).index(sol.assign[c]) for c in cons])[0]
            sol.assign = {c: graph.strategies(c, a.n)[i] for c, i in zip(cons, picks, strict=True)}
            # The uniform plans are points of the program's space: their modelled cost beside its optimum.
            candidates = {b: sol.assign, **{u: execute.assignment(a, baseline(a, u))
                                            for u in ("data-parallel", "tensor-parallel")}}
            modelled = {u: sol.terms.cost(asg) for u, asg in candidates.items()}
            # Alpa prices a plan by the collectives its compiler emits for it; this model of the runtime misses
            # some (operators it has no rule for), so the optimum and the uniform plans are each traced and
            # priced by the collectives their lowered steps run, at the same link: the cheapest is the plan.
            t0 = time.perf_counter()
            traced = {u: alpa.traced_s(execute.Lowered(execute.Runner(cap, mesh, asg)).collectives(), s.n, link)
                      for u, asg in candidates.items()}
            pick = min(traced, key=traced.__getitem__)
            ctx.log(f"alpa: integer program over {len(cons)} contractions ({sol.variables} variables; link fitted "
                    f"to all-gathers: alpha {link.alpha * 1e6:.1f} us a ring step, {link.bandwidth / 1e9:.3f} GB/s) "
                    f"solved in {sol.seconds:.3f} s; modelled communication " + ", ".join(
                        f"{u} {v:.4g} s" for u, v in modelled.items()) + "; traced " + ", ".join(
                        f"{u} {v:.4g} s" for u, v in traced.items()) + "; the Alpa-style plan: "
                    + ("the program's optimum" if pick == b else f"{pick}'s strategies"))
            rows += [Measurement("alpa_alpha", link.alpha, "s", {"plan": b}),
                     Measurement("alpa_bandwidth", link.bandwidth / 1e9, "GB/s", {"plan": b}),
                     *(Measurement("modelled_communication", v, "s", {"plan": u}) for u, v in modelled.items()),
                     *(Measurement("traced_communication", v, "s", {"plan": u}) for u, v in traced.items())]
            plans[b] = (candidates[pick], "per-contraction" if pick == b else f"= {pick}",
                        sol.seconds + a.seconds + time.perf_counter() - t0)
            # Where the plan is one of block strategies (CFP's, or a uniform plan's), it is named in the seed's
            # notation, so that a plan that is CFP's own is known as the same plan.
            same = [c for c in (list(found.choice), *(baseline(a, u) for u in ("data-parallel", "tensor-parallel")))
                    if execute.assignment(a, c) == candidates[pick]]
            if same:
                choices[b] = same[0]
        elif b in ("megatron", "deepspeed-megatron"):
            tps = torch_baselines.tp_degrees(s.model, s.config, s.n)
            if not tps:
                ctx.log(f"{b}: not run: no tensor-parallel degree above 1 divides the {s.n} ranks, the heads, the "
                        "vocabulary and the feed-forward width")
            plans |= {f"{b}-tp{t}": ({}, "", 0.0) for t in tps}
        elif b in TORCH_BASELINES:
            plans[b] = ({}, "", 0.0)
        else:
            choices[b] = baseline(a, b)
            plans[b] = (execute.assignment(a, choices[b]), str(choices[b]), 0.0)
    # Each block-strategy plan in the seed's notation, and how many blocks leave data parallelism
    # (every block's strategy 0): a plan with none is data parallelism, whatever found it.
    rows += [Measurement("model_parallel_blocks", float(sum(1 for c in choice if c)), "count",
                         {"plan": name, "strategy": str(choice)}) for name, choice in choices.items()]
    # Every plan built and checked first, then timed in rounds of one step each: on a machine whose
    # speed drifts, plans timed one after another would differ by the drift (10-20 % here).
    steppers: dict[str, Callable[[], float]] = {}
    lowered: dict[str, execute.Lowered] = {}
    for name, (assign, _, search_s) in plans.items():
        coords = {"plan": name}
        rows.append(Measurement("search_time", search_s, "s", coords))
        if baseline_of(name) in TORCH_BASELINES:
            module, checked = _module_baseline(ctx, params, s, name, mesh)
            rows += checked
            steppers[name] = lambda m=module: m.step()[0]
            continue
        # Each plan runs lowered: one traced SPMD graph of local ops and collectives (see execute.Lowered).
        runner = execute.Lowered(execute.Runner(cap, mesh, assign))
        collectives = runner.collectives()
        count, nbytes = len(collectives), sum(b for _, b in collectives)
        rows += [Measurement("lower_time", runner.trace_s, "s", coords),
                 Measurement("collectives", float(count), "count", coords),
                 Measurement("collective_bytes", nbytes / 1e6, "MB", coords)]
        if params["verify"]:
            got = [o.full_tensor() for o in runner.step(update=False).outputs]
            loss_err, grad_err = execute.errors(s.model, s.config, s.batch_size, float(got[0].detach()), got[1:])
            ctx.log(f"{name}: loss differs from the unsharded model's by {loss_err:.3g}, gradients by at most "
                    f"{grad_err:.3g} (relative)")
            rows += [Measurement("loss_error", loss_err, "abs", coords),
                     Measurement("grad_error", grad_err, "rel", coords)]
        steppers[name], lowered[name] = runner.seconds, runner
    screened = interleaved_steps(ctx, steppers, params["warmup"], params["screen"]) if params["screen"] else {}
    # A baseline whose strategies are CFP's plan's is the same plan: screened, never timed on.
    itself = {name for name, choice in choices.items() if name != "cfp" and choice == choices["cfp"]}
    kept = fastest_of_kinds(screened, itself) if screened else list(steppers)
    if screened:
        rows += [Measurement("screen_time", statistics.median(t), "s", {"plan": name}) for name, t in screened.items()]
        ctx.log(f"screen ({params['screen']} steps each, in turns): " + ", ".join(
            f"{name} {statistics.median(t):.4g} s" for name, t in screened.items()) + f"; timed on: {', '.join(kept)}")
    order = places(kept, params["runs"]) if len(kept) > 1 else {}
    timed = interleaved_steps(ctx, {name: steppers[name] for name in kept}, params["warmup"], params["runs"])
    for name in steppers:
        # A plan the screen left out keeps its screen steps as its step time, and no samples for a claim.
        times = timed.get(name) or screened[name]
        coords = {"plan": name}
        tflops = [flops / t / 1e12 for t in times]
        if name not in timed:
            ctx.log(f"{name}: " + ("CFP's own plan, screened only" if name in itself else "left out by the screen"))
        if name in lowered:
            mem = max(ctx.gather_floats(float(lowered[name].last.peak_bytes)))
            rows.append(Measurement("memory", mem / 2**30, "GB", coords))
            if name == "cfp":
                ctx.log(f"searched training cost: {times}, memory_cost: {mem / 2**30:.6f}\nTFLOP_COUNT: "
                        f"{flops / 1e12}\ntflops: {tflops}")
            else:
                ctx.log(f"{name} plan {plans[name][1]}: training cost {times}, memory {mem / 2**30:.6f} GB, "
                        f"tflops {tflops}")
        else:
            ctx.log(f"{name}: training cost {times}, tflops {tflops}")
        rows += [Measurement("step_time", statistics.median(times), "s", coords),
                 Measurement("tflops", statistics.median(tflops), "TFLOP/s", coords),
                 *(step_samples(times, coords, order.get(name)) if name in timed else [])]
    ctx.log(f"profile {profile_s:.1f} s + analysis {a.seconds:.3f} s + dynamic program {found.search_s:.3f} s; "
            f"predicted {found.predicted_s:.4f} s per step")
    return rows


def _module_baseline(ctx: RunContext, params: Mapping[str, Any], s: Setup, kind: str,
                     mesh: DeviceMesh) -> tuple[torch_baselines.ModuleRunner, list[Measurement]]:
    """DDP, FSDP2, Megatron-LM, ZeRO or DeepSpeed-Megatron on the nn.Module, and its rows: the TP degree, and its
    check's (timed with the graph plans; no memory figure: the module's activations are not tracked the way
    the graph runner tracks them)."""
    runner = torch_baselines.ModuleRunner(kind, s.model, s.config, s.batch_size, mesh)
    coords = {"plan": kind}
    rows = []
    if runner.mpu or runner.deepspeed:
        tp = runner.mpu.get_model_parallel_world_size() if runner.mpu else 1
        ctx.log(f"{kind}: tensor parallel {tp} x data parallel {s.n // tp}" + (
            f", DeepSpeed config {json.dumps(runner.config)}" if runner.deepspeed else ""))
        rows.append(Measurement("tensor_parallel", float(tp), "count", coords))
    if not params["verify"]:
        return runner, rows
    loss_err, grad_err = torch_baselines.check(runner, s.model, s.config, s.batch_size)
    ctx.log(f"{kind}: loss differs from the unsharded model's by {loss_err:.3g}, gradients by at most "
            f"{grad_err:.3g} (relative)")
    return runner, [*rows, Measurement("loss_error", loss_err, "abs", coords),
                    Measurement("grad_error", grad_err, "rel", coords)]


def fastest_of_kinds(screened: Mapping[str, list[float]], itself: Collection[str] = ()) -> list[str]:
    """The plans a screen keeps, in their order: every plan of no kind (CFP's), and of each kind of
    baseline (choices.KINDS) the one whose screen steps have the lowest median, leaving out `itself`
    (baselines that are CFP's plan)."""
    kind = {name: k for name in screened if name not in itself and (k := kind_of(name)) is not None}
    best = {k: min((n for n in kind if kind[n] == k), key=lambda n: statistics.median(screened[n]))
            for k in set(kind.values())}
    return [n for n in screened if n not in itself and (n not in kind or best[kind[n]] == n)]


def step_samples(times: list[float], coords: Mapping[str, Any], place: list[int] | None = None) -> list[Measurement]:
    """Each timed step (the slowest rank's): the samples a claim's confidence interval comes from, with its
    place in its round where plans took turns (timing.places)."""
    return [Measurement("step_s", t, "s", {**coords, "step": i, **({"place": place[i]} if place else {})})
            for i, t in enumerate(times)]


def variations(a: Analysis) -> list[list[int]]:
    """The plans the communication enumeration runs: every block at its first strategy, then, for each
    block of each unique segment and each other strategy, that strategy in every copy of the segment."""
    base = [0] * len(a.blocks)
    plans = [base]
    for k in a.unique_segments():
        lo, hi = a.segments[k]
        for j in range(hi - lo):
            for v in range(1, len(a.blocks[lo + j].strategies)):
                plan = list(base)
                for (lo2, _), m in zip(a.segments, a.mapped, strict=True):
                    if m == k:
                        plan[lo2 + j] = v
                plans.append(plan)
    return plans


def communication_time(runner: execute.Runner) -> tuple[float, float]:
    """One step under the profiler: (seconds in collectives and waits for them, the step's seconds)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        res = runner.step()
    comm = sum(e.self_cpu_time_total for e in prof.key_averages()
               if "c10d" in e.key or "wait_tensor" in e.key) / 1e6
    return comm, res.seconds


def enum(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """The reference's enum_and_benchmark: per plan, the cost model's communication volume against the
    measured communication and computation time."""
    s = Setup.on(params, ctx)
    _, cap = global_step(s)
    a = cap.analysis
    mesh = _mesh(ctx, s)
    volume = alpa.terms(a, alpa.Link(1.0))  # bandwidth 1, no latency: costs in bytes
    ctx.log(f"generated_search_space: {[len(b.strategies) for b in a.blocks]}")
    rows = []
    for plan in variations(a):
        assign = execute.assignment(a, plan)
        runner = execute.Runner(cap, mesh, assign)
        times = slowest_steps(ctx, runner.seconds, params["warmup"], params["runs"])
        res = runner.last
        comm, step = communication_time(runner)
        slowest = max(ctx.gather_floats(comm))
        mem = max(ctx.gather_floats(float(res.peak_bytes)))
        bytes_moved = volume.cost(assign)
        ctx.log(f"Comm Volume: {bytes_moved:g}\nComm Overhead: {slowest:g}\nComp Overhead: {step - slowest:g}\n"
                f"sval {plan} {times} {int(mem)}")
        coords = {"plan": " ".join(map(str, plan))}
        rows += [Measurement("comm_volume", bytes_moved, "B", coords), Measurement("comm_time", slowest, "s", coords),
                 Measurement("comp_time", step - slowest, "s", coords),
                 Measurement("step_time", statistics.median(times), "s", coords),
                 Measurement("memory", mem / 2**30, "GB", coords)]
    return rows
