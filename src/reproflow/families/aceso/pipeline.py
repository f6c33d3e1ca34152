"""Aceso's pipeline, profile -> search -> train: each step a typed request in and a result out.

`reproflow aceso ...` (cli.py) only parses its options into these requests. Profiles and trainings
are suites the engine runs or submits (reproflow.api.run_generated_suite); a submitted search is a
one-task job through the engine's submission too (reproflow.api.submit_call). artifact.py chains
the steps for each row of the artifact's settings.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from reproflow import api
from reproflow.api import Placement
from reproflow.families.aceso.costmodel import Config, CostModel, Prediction
from reproflow.families.aceso.database import optimizer_file, read_database, write_from_rows
from reproflow.families.aceso.models import Model, model
from reproflow.families.aceso.plans import (
    Plan,
    best_feasible,
    megatron_plans,
    plan_name,
    pressure_limit,
    read_config,
    read_json,
    shapes,
    to_train,
    write_json,
)
from reproflow.families.aceso.search import TIE_RULE, Options, Point, Result, describe, settle, settle_points
from reproflow.families.aceso.search import search as search_depths
from reproflow.families.aceso.settings import CASES, GPT_MBS, RESNET_MBS
from reproflow.spec.errors import ReproflowError
from reproflow.spec.suite import suite_toml
from reproflow.store.files import atomic_write


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """A model on a cluster shape, its profiled database and the search's settings (`aceso search`;
    `megatron` and `predict` use the model, cluster and database part)."""

    model_name: str
    model_size: str = ""
    num_layers: int | None = None
    global_batch_size: int
    micro_batch_size: tuple[int, ...] | None = None
    num_nodes: int
    num_gpus_per_node: int
    memory_limit: float = 28000
    max_tp: int | None = None
    start_num_stages: int = 1
    end_num_stages: int | None = None
    profiled_time_path: Path
    config_save_path: Path
    cost_model: str | None = None  # None: runtime where the database has its tables, else reference (with_model)
    max_num_hops: int = 7
    budget_cases: int = CASES  # explored cases per depth: the same config on any machine
    time_budget_total: float | None = None  # the reference's seconds per depth instead: machine-dependent
    num_of_saved_configs: int = 1
    op_group_size: int = 1
    peak_mem_in_backward: float = 0.0
    finetune_after_trial: int = 0
    sort_metric: str = "max_stage_time"
    log_path: Path | None = None
    config_suffix: str = ""
    processes: int = 0
    from_results: Path | None = None
    megatron_memory_limit: float | None = None
    megatron_micro_batch_size: tuple[int, ...] | None = None
    # Write every Megatron-LM plan worth training (plans.to_train, first and last stages of their own
    # depth included) beside the configs, for the baseline measured (baseline.py).
    megatron_grid: bool = False
    # Both memory limits become plans.pressure_limit's, computed from the database: where recomputation is needed.
    memory_pressure: bool = False
    # Configs predicted within this share of the fastest are a near tie, kept by a fixed order (search.settle).
    tie_resolution: float = 0.0
    force: bool = False


# A submitted search's time limit where the budget is a count: GPT-13B on the artifact's 32 GPUs, the
# largest search here, takes minutes on a core per depth (docs/aceso-search.md).
SEARCH_JOB_MINUTES = 60
# What keys a search (with the database's hash): the same database searched with these again is reused.
SEARCH_KEYS = ("model_name", "model_size", "num_layers", "global_batch_size", "micro_batch_size", "num_nodes",
               "num_gpus_per_node", "memory_limit", "max_tp", "start_num_stages", "end_num_stages", "max_num_hops",
               "budget_cases", "time_budget_total", "cost_model", "megatron_memory_limit", "megatron_micro_batch_size",
               "op_group_size", "peak_mem_in_backward", "finetune_after_trial", "sort_metric", "megatron_grid",
               "memory_pressure", "tie_resolution")


@dataclass(frozen=True)
class SearchOutcome:
    """A search's manifest (None when submitted: then its job id), and whether it found a config."""

    manifest: Path | None
    found: bool
    job_id: str = ""


@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    """What `aceso profile` measures: a model's ops per TP size and micro-batch, collectives, P2P."""

    prof_model_name: str
    prof_model_size: str
    prof_tp_size: tuple[int, ...] = (1, 2)
    prof_mbs_list: tuple[int, ...] = (1, 2, 4, 8)
    prof_seq_len: int = 0
    prof_warmup_times: int = 3
    prof_repeat_times: int = 10
    prof_repeat_seconds: float = 0.0
    # Rounds over every micro-batch and algo in turn, the repeats and seconds shared among them; the
    # database takes each op's median over the rounds, so a slow spell of the machine hits all alike.
    prof_rounds: int = 1
    prof_comm_sizes: str = "0-64"
    prof_path: Path
    # Hosts the ops are timed on (each with max(prof_tp_size) ranks), and P2P between two of them;
    # run here, `network` shapes each emulated host's link (launch.network).
    prof_num_nodes: int = 1
    network: str = ""
    # P2P across the link too (False: the database keeps the newest P2P rows the results hold).
    prof_p2p: bool = True


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    """Config JSONs, or search folders (their best config and/or Megatron-LM plan), to train."""

    config: tuple[Path, ...]
    plan: tuple[str, ...] = ("aceso",)
    num_nodes: int = 1
    num_gpus_per_node: int = 0
    train_iters: int = 5
    train_seconds: float = 0.0
    seq_len: int = 0
    dropout: float = 0.1
    log_path: Path = Path("aceso-logs")
    tp_impl: tuple[str, ...] = ("reproflow",)
    network: str = ""  # run here: each emulated host's link (launch.network)


class Setup:
    """Model, database and cost model of a request, with errors that name the option."""

    def __init__(self, req: SearchRequest) -> None:
        try:
            self.model: Model = model(req.model_name, req.model_size, req.num_layers)
        except ValueError as exc:
            raise ReproflowError(f"--model-name/--model-size/--num-layers: {exc}") from None
        self.req = req = with_model(req)
        self.mbs = list(req.micro_batch_size or (RESNET_MBS if req.model_name == "resnet" else GPT_MBS))
        self.gpus = req.num_nodes * req.num_gpus_per_node
        self.max_tp = req.max_tp or self.model.max_tp(req.num_gpus_per_node)
        self.cost = self.cost_model(self.mbs, req.memory_limit)
        self.db = self.cost.db
        self.ops = self.model.full_op_list(self.db.ops)
        self.depths = range(req.start_num_stages, (req.end_num_stages or min(self.gpus, 16)) + 1)
        self.name = f"{self.model.name}_{self.model.size}"
        req.config_save_path.mkdir(parents=True, exist_ok=True)

    def cost_model(self, mbs: list[int], memory_limit: float) -> CostModel:
        """The chosen performance model on the database's tables for these micro-batch sizes."""
        r = self.req
        db = read_database(r.profiled_time_path, self.model, mbs, self.max_tp)
        return CostModel(db, r.num_gpus_per_node, memory_limit, kind=r.cost_model,
                         peak_mem_in_backward=r.peak_mem_in_backward)

    def megatron_cost(self) -> tuple[CostModel, float]:
        """The model and memory limit of the Megatron-LM plan (the artifact gives some baselines their own)."""
        r = self.req
        if not r.megatron_micro_batch_size and r.megatron_memory_limit is None:
            return self.cost, r.memory_limit
        limit = r.memory_limit if r.megatron_memory_limit is None else r.megatron_memory_limit
        return self.cost_model(list(r.megatron_micro_batch_size or self.mbs), limit), limit

    def megatron_grid(self) -> tuple[list[Plan], float]:
        """Every Megatron-LM plan for these GPUs, predicted (first and last stages of their own depth too
        with `megatron_grid`), and the memory limit they must fit."""
        cost, limit = self.megatron_cost()
        return megatron_plans(cost, self.ops, self.req.global_batch_size, self.gpus, self.max_tp, self.depths,
                              uneven=self.req.megatron_grid), limit

    def megatron_plan(self) -> tuple[str, Plan | None]:
        """The predicted-fastest feasible uniform plan, the artifact's baseline (a grid's uneven first and
        last stages are for the screen, never this pick), and a line saying it."""
        cost, limit = self.megatron_cost()
        plans = megatron_plans(cost, self.ops, self.req.global_batch_size, self.gpus, self.max_tp, self.depths)
        best, fastest = settled_plan(plans, limit, self.req.tie_resolution), best_feasible(plans, limit)
        kind = "uniform plans"
        if best is None:
            return f"Megatron-LM {kind}: none fits {limit:.0f} MB", None
        gbs = self.req.global_batch_size
        tie = "" if best is fastest else (
            f" (a near tie with {fastest.describe()}, {fastest.prediction.iteration_ms / 1000:.2f} s, within the "  # type: ignore[union-attr]
            f"tie resolution of {self.req.tie_resolution:.0%}: the rule keeps the smallest micro-batch, then the "
            "fewest stages, the smallest TP size, no recomputation)")
        return (f"Megatron-LM {kind}, the predicted fastest: {best.describe()}: "
                f"{best.prediction.iteration_ms / 1000:.2f} s, {best.prediction.throughput(gbs):.2f} samples/s, "
                f"{best.prediction.max_memory:.0f} MB{tie}", best)

    def write_megatron(self, config: Config, ms: float) -> Path:
        path = self.req.config_save_path / f"{self.name}_{self.model.num_layers}layers_megatron_est_{int(ms)}.json"
        write_json(config, path)
        return path


def with_model(req: SearchRequest) -> SearchRequest:
    """The request with its performance model: the one asked for, else runtime where the database has the
    optimizer tables reproflow's profiler writes, else reference (the artifact's databases), said in a line."""
    if req.cost_model is not None:
        return req
    try:
        stem = optimizer_file(model(req.model_name, req.model_size, req.num_layers), 1)
    except ValueError:
        return replace(req, cost_model="runtime")  # Setup names the bad option
    if (Path(req.profiled_time_path) / stem).is_file():
        return replace(req, cost_model="runtime")
    print(f"performance model: reference (Aceso's own), as {req.profiled_time_path} has no optimizer tables "
          f"({stem}), which the runtime model needs and the artifact's databases lack; profile with reproflow "
          "for the runtime model (docs/aceso-search.md)")
    return replace(req, cost_model="reference")


def megatron(req: SearchRequest) -> Path | None:
    """The fastest feasible uniform (pp, tp, dp, micro-batch, recompute) plan as Aceso's JSON, or None."""
    setup = Setup(req)
    line, best = setup.megatron_plan()
    print(line)
    if best is None:
        return None
    path = setup.write_megatron(best.config, best.prediction.iteration_ms)
    print(f"config: {path}")
    return path


def database_sha256(path: Path) -> str:
    """Content hash of a database folder: every CSV's name and bytes, in name order."""
    digest = hashlib.sha256()
    for f in sorted(Path(path).glob("*.csv")):
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def search(req: SearchRequest, where: Placement | None = None) -> SearchOutcome:
    """One search per pipeline depth in parallel; write the reference's outputs and compare with
    Megatron-LM. With `where.submit`, submit it as a CPU-only job (after `where.job.after`) instead.

    A search is keyed by the database's content hash and its options: a second search of the same
    database with the same options reuses the first one's configs (unless `force`)."""
    if where is not None and where.submit:
        return _submit_search(req, where)
    if req.from_results:
        from reproflow.reporting.report import load_results

        written = write_from_rows(load_results(req.from_results), req.profiled_time_path)
        print(f"database: {len(written)} files from the profiler rows in {req.from_results}")
    req = with_model(req)
    options = {k: getattr(req, k) for k in SEARCH_KEYS}
    if req.memory_pressure:
        limit = memory_pressure_limit(req)
        print(f"memory pressure: {limit:.1f} MB per rank, the least any Megatron-LM plan needs without "
              "recomputation")
        req = replace(req, memory_limit=limit, megatron_memory_limit=limit)
    setup = Setup(req)
    db_hash = database_sha256(req.profiled_time_path)
    key = hashlib.sha256(json.dumps([db_hash, options], sort_keys=True, default=str).encode()).hexdigest()[:12]
    manifest = req.config_save_path / f"search-{key}.json"
    if manifest.exists() and not req.force:
        done = json.loads(manifest.read_text())
        print(f"reused: this database (sha256 {db_hash[:12]}) was searched with these options before; "
              f"configs: {', '.join(done['configs'])} (--force searches again)")
        return SearchOutcome(manifest, True)
    suffix = req.config_suffix or f"{_dt.datetime.now():%Y-%m-%d-%H-%M-%S}"
    gbs = req.global_batch_size
    opts = search_options(req, setup)
    print(f"searching {setup.name} ({len(setup.ops)} ops) on {req.num_nodes} x {req.num_gpus_per_node} GPUs, "
          f"depths {setup.depths.start}-{setup.depths.stop - 1}, budget {opts.budget}", flush=True)
    start = time.monotonic()
    by_depth = search_depths(setup.cost, setup.ops, opts, setup.depths, req.processes)
    wall = time.monotonic() - start
    by_depth, found, ties = settle_depths(by_depth, req.tie_resolution)
    save, csv_dir = req.config_save_path, req.config_save_path / "csv"
    names = [f"{setup.name}_{r.num_stages}stages_{suffix}.json" for r in found]
    for r, name in zip(found, names, strict=True):
        assert r.best is not None
        write_json(r.best.config, save / name)
        stage_info(r.best.pred, csv_dir / f"info_{setup.name}_{r.num_stages}stages_{suffix}.csv")
    (save / "top_configs").mkdir(exist_ok=True)
    for name in names[:req.num_of_saved_configs]:
        shutil.copy(save / name, save / "top_configs" / name)
    print("# of stages\test_iteration_time(s)\test_thpt(samples/s)\test_mem(MB)\t# of explored cases\t"
          "search(s)\tto best(s)")
    for r in found:
        assert r.best is not None
        print(f"{r.num_stages}\t{r.best.time / 1000:.2f}\t{gbs / (r.best.time / 1000):.2f}\t"
              f"{r.best.memory:.0f}\t{r.explored}\t{r.seconds:.2f}\t{r.seconds_to_best:.2f}")
    for r in by_depth:
        if r.best is None:
            print(f"{r.num_stages}\tno feasible config")
    log = req.log_path or save
    log.mkdir(parents=True, exist_ok=True)
    atomic_write(log / f"{setup.name}_summary_{suffix}.csv", f"search_cost\n{wall:.2f}\n")
    print(f"\noverall search time: {wall:.2f} s")
    for tie in ties:
        print(f"near tie ({tie['among']}): kept {tie['kept']} over {tie['fastest']} (the fastest), within the "
              f"tie resolution of {req.tie_resolution:.0%}; {TIE_RULE}")
    if found and len(found[0].by_mbs) > 1:
        print(margins(found[0]))
    line, plan = setup.megatron_plan()
    print(line)
    grid = _write_grid(setup, save) if req.megatron_grid else []
    mega, mega_ms = None, 0.0
    if plan is not None:
        mega_ms = plan.prediction.iteration_ms
        mega = plan.name if req.megatron_grid else setup.write_megatron(plan.config, mega_ms).name
        if not (save / mega).exists():  # the grid's only when it is one worth training
            write_json(plan.config, save / mega)
        # the plan's per-stage prediction too, for its prediction error
        stage_info(plan.prediction, csv_dir / f"info_{Path(mega).stem}.csv")
    same = bool(found and mega and read_config(save / mega) == read_config(save / names[0]))
    if same:
        print("Aceso's search returned the Megatron-LM plan itself (the same config)")
    depths = [{"num_stages": r.num_stages, "ms": round(r.best.time, 2) if r.best else None, "explored": r.explored,
               "seconds": round(r.seconds, 2), "to_best_s": round(r.seconds_to_best, 2),
               "by_micro_batch": {m: round(p.time, 2) for m, p in sorted(r.by_mbs.items())}} for r in by_depth]
    best = found[0].best if found else None
    atomic_write(manifest, json.dumps({"database_sha256": db_hash, "options": options, "budget": opts.budget,
                                       "search_s": round(wall, 2),
                                       "configs": names, "megatron": mega,
                                       "best_ms": round(best.time, 2) if best else None,
                                       "megatron_ms": round(mega_ms, 2) if mega else None, "depths": depths,
                                       "ties": ties,
                                       "megatron_grid": grid, "memory_limit": req.memory_limit,
                                       "megatron_memory_limit": setup.megatron_cost()[1],
                                       "same_as_megatron": same,
                                       "written": time.time()}, indent=2, default=str) + "\n")
    if best is not None:
        verdict = "at least as fast as" if mega_ms == 0 or best.time <= mega_ms else "SLOWER than"
        print(f"Aceso search: {best.time / 1000:.2f} s, {gbs / (best.time / 1000):.2f} samples/s, "
              f"{best.memory:.0f} MB: {verdict} the uniform plan")
    return SearchOutcome(manifest, best is not None)


def margins(kept: Result) -> str:
    """The kept depth's fastest config of each micro-batch against the kept one, in words: how far the
    profile must move for another micro-batch to be found (the profile is a measurement; the search is not)."""
    assert kept.best is not None
    ms = kept.best.time
    mbs = kept.best.config.micro_bs
    each = ", ".join(f"{m}: {p.time:.1f} ms" + (" (kept)" if m == mbs else f" ({p.time / ms - 1:+.1%})")
                     for m, p in sorted(kept.by_mbs.items()))
    return f"each micro-batch's fastest config at {kept.num_stages} stages, against the kept one: {each}"


def settled_plan(plans: list[Plan], limit: float, resolution: float) -> Plan | None:
    """The predicted-fastest plan that fits, or with a tie resolution the one the near-tie rule keeps
    (`settle`; after the micro-batch and the stages: the smaller TP size, then no recomputation)."""
    ok = [p for p in plans if p.prediction.max_memory < limit]
    if not ok or not resolution:
        return best_feasible(plans, limit)
    kept, _ = settle([p.prediction.iteration_ms for p in ok], [(p.micro_bs, p.pp, p.tp, p.recompute) for p in ok],
                     resolution)
    return ok[kept]


def settle_depths(by_depth: list[Result], resolution: float) -> tuple[list[Result], list[Result],
                                                                    list[dict[str, object]]]:
    """Each depth's config and the order of the depths' configs by the near-tie rule (`settle`) where a
    tie resolution is set, else by the predicted time alone; with the ties that changed a pick, in words."""
    found = sorted((r for r in by_depth if r.best is not None), key=lambda r: r.best.time)  # type: ignore[union-attr]
    if not resolution or not found:
        return by_depth, found, []
    ties: list[dict[str, object]] = []

    def keep(points: list[Point], among: str) -> Point:
        kept, tied = settle_points(points, resolution)
        fastest = min(points, key=lambda p: p.time)
        if kept is not fastest:
            ties.append({"among": among, "kept": describe(kept), "fastest": describe(fastest),
                         "tied": [describe(p) for p in tied]})
        return kept

    settled = {}
    for r in found:
        assert r.best is not None
        others = [p for m, p in sorted(r.by_mbs.items()) if m != r.best.config.micro_bs]
        settled[r.num_stages] = replace(r, best=keep([r.best, *others], f"{r.num_stages} stages"))
    first = keep([r.best for r in settled.values() if r.best is not None], "the depths")
    order = sorted(settled.values(), key=lambda r: (r.best is not first, r.best.time))  # type: ignore[union-attr]
    return [settled.get(r.num_stages, r) for r in by_depth], order, ties


def _write_grid(setup: Setup, folder: Path) -> list[dict[str, object]]:
    """Every plan worth training (plans.to_train) as a config JSON in `folder`, with its predicted
    per-stage info CSV: what the baseline's screen trains (baseline.py)."""
    plans, limit = setup.megatron_grid()
    chosen = to_train(plans, limit)
    print(f"Megatron-LM grid: {len(plans)} plans, {len(chosen)} to train (predicted to fit {limit:.0f} MB; full "
          "recomputation only where the plan does not fit without it)")
    out = []
    for p in chosen:
        write_json(p.config, folder / p.name)
        stage_info(p.prediction, folder / "csv" / f"info_{Path(p.name).stem}.csv")
        out.append({"name": p.name, "plan": p.describe(), "pp": p.pp, "tp": p.tp, "dp": p.dp,
                    "micro_bs": p.micro_bs, "recompute": p.recompute, "layers": list(p.layers),
                    "predicted_ms": round(p.prediction.iteration_ms, 2),
                    "predicted_mb": round(p.prediction.max_memory, 2)})
    return out


def grid_names(req: SearchRequest) -> list[str]:
    """The config names of every plan of the Megatron-LM grid, before any profile (a submitted screen
    names them before its search has run; those the search does not write are not applicable)."""
    m = model(req.model_name, req.model_size, req.num_layers)
    gpus = req.num_nodes * req.num_gpus_per_node
    mbs = list(req.megatron_micro_batch_size or req.micro_batch_size or (RESNET_MBS if m.family == "resnet"
                                                                         else GPT_MBS))
    return [plan_name(pp, tp, dp, b, layers, rc) for pp, tp, dp, b, rc, layers, _ in
            shapes(m, mbs, gpus, req.max_tp or m.max_tp(req.num_gpus_per_node), depths_of(req), uneven=True)]


def depths_of(req: SearchRequest) -> range:
    """The pipeline depths the search tries, before any profile (a submitted screen names Aceso's config of
    each; those the search does not find are not applicable)."""
    return range(req.start_num_stages, (req.end_num_stages or min(req.num_nodes * req.num_gpus_per_node, 16)) + 1)


def memory_pressure_limit(req: SearchRequest) -> float:
    """plans.pressure_limit of the request's Megatron-LM grid: the per-rank memory where recomputation is
    needed."""
    setup = Setup(req)
    plans, _ = setup.megatron_grid()
    limit = pressure_limit(plans)
    if limit is None:
        raise ReproflowError(f"{setup.name}: no Megatron-LM plan with recomputation needs less memory than every "
                             "plan without it: recomputation saves nothing here.")
    return limit


def search_options(req: SearchRequest, setup: Setup) -> Options:
    """The search's options from the request: its budget the count of explored cases, or the clock where
    `time_budget_total` is given."""
    return Options(req.global_batch_size, tuple(setup.mbs), req.num_nodes, req.num_gpus_per_node, req.memory_limit,
                   setup.max_tp, req.max_num_hops, budget_cases=req.budget_cases, budget_s=req.time_budget_total,
                   op_group_size=req.op_group_size, finetune_after_trial=req.finetune_after_trial,
                   sort_metric=req.sort_metric)


def search_job(req: SearchRequest) -> str:
    """Body of a submitted search: the search, failing the job when it found no config."""
    outcome = search(req)
    if not outcome.found:
        raise RuntimeError(f"the search of {req.config_save_path} found no feasible config")
    return str(outcome.manifest)


def _submit_search(req: SearchRequest, where: Placement) -> SearchOutcome:
    """The search as a CPU-only Slurm job (one task), after `where.job.after`, with its paths made absolute."""
    absolute = replace(req, profiled_time_path=req.profiled_time_path.resolve(),
                       config_save_path=req.config_save_path.resolve(),
                       log_path=req.log_path.resolve() if req.log_path else None,
                       from_results=req.from_results.resolve() if req.from_results else None)
    job_id = api.submit_call("aceso-search", search_job, absolute, folder=absolute.config_save_path / "submitit",
                             minutes=SEARCH_JOB_MINUTES if req.time_budget_total is None else
                             max(5, int(req.time_budget_total * 2 / 60) + 10), where=where)
    after = where.job.after
    print(f"submitted the search as Slurm job {job_id}" + (f", after {', '.join(after)}" if after else ""))
    print(f"job ids: {job_id}")
    return SearchOutcome(None, True, job_id)


def stage_info(pred: Prediction, path: Path) -> None:
    """The reference's per-stage info CSV of a prediction."""
    lines = ["stage-index,time,memory(total),memory(normal),memory(reserved)"]
    for i, (t, m) in enumerate(zip(pred.pipeline_ms, pred.memory, strict=True)):
        lines.append(f"stage-{i},{t:.2f},{m.total:.2f},{m.total - m.reserved:.2f},{m.reserved:.2f}")
    atomic_write(path, "\n".join(lines) + "\n")


def op_info(config: Config, costs: dict[str, CostModel], path: Path) -> None:
    """Each op of a config with its predicted forward and backward microseconds on one micro-batch from
    each of `costs` (a label each): the per-op side of a prediction, which the report sets beside the
    ops' times measured in training. `index` numbers the ops over the whole model, as the runtime's
    per-op columns (`<op>#<index>`) do."""
    lines = ["index,stage,op,tp,dp,recompute," + ",".join(f"{label}_{what}_us" for label in costs
                                                           for what in ("forward", "backward"))]
    index = 0
    for s, stage in enumerate(config.stages):
        times = [cost.op_us(stage, config.micro_bs) for cost in costs.values()]
        for k, op in enumerate(stage.ops):
            values = ",".join(f"{float(t[k]):.2f}" for pair in times for t in pair)
            lines.append(f"{index},{s},{op},{stage.tp[k]},{stage.dp[k]},{int(stage.recompute[k])},{values}")
            index += 1
    atomic_write(path, "\n".join(lines) + "\n")


def megatron_lm(config: Path, megatron_dir: Path, num_nodes: int, train_iters: int, log_path: Path,
                run: bool) -> None:
    """Megatron-LM itself on a uniform GPT plan: print the torchrun command of its pretrain_gpt.py; with
    `run`, run it and write the reference's runtime CSV of its iteration time."""
    import shlex
    import subprocess

    from reproflow.families.aceso.plans import megatron_lm_args, parse_megatron_log

    d = _config_fields(config)
    try:
        plan_args = megatron_lm_args(d, train_iters)
    except (ValueError, KeyError) as exc:
        raise ReproflowError(f"--config {config}: {exc}") from None
    per_node = int(sum(d["num_gpus"])) // num_nodes
    launch = ["torchrun", f"--nproc-per-node={per_node}"]
    if num_nodes > 1:
        launch += [f"--nnodes={num_nodes}", "--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT"]
    command = [*launch, str(megatron_dir / "pretrain_gpt.py"), *plan_args]
    print(" ".join(shlex.quote(c) if "$" not in c else c for c in command))
    if not run:
        return
    if not (megatron_dir / "pretrain_gpt.py").is_file():
        raise ReproflowError(f"no {megatron_dir}/pretrain_gpt.py: give --megatron-dir of a Megatron-LM checkout "
                             "(the megatron container has one at /opt/Megatron-LM); Megatron-LM needs CUDA GPUs.")
    done = subprocess.run(command, capture_output=True, text=True)
    print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
    times = parse_megatron_log(done.stdout + done.stderr)
    if done.returncode or not times:
        raise ReproflowError(f"Megatron-LM exited with {done.returncode} and logged {len(times)} iterations.")
    timed = times[2:] or times
    ms = sum(timed) / len(timed)
    out = log_path / "megatron-lm" / "runtime" / "gpt" / str(d["model_size"]) / "csv"
    gbs = d["global_batch_size"]
    atomic_write(out / f"{config.stem}_stage0_rank0.csv", f"global_batch_size,time\n{gbs},{ms:.2f}\n")
    print(f"Megatron-LM: {ms:.2f} ms per iteration, {float(gbs) / (ms / 1000):.2f} samples/s -> {out}")


def predict(req: SearchRequest, config: Path) -> Prediction:
    """Per-stage time and memory of a config JSON (Aceso's or reproflow's), printed."""
    setup = Setup(req)
    parsed = read_json(config, setup.model, setup.ops)
    pred = setup.cost.predict(parsed)
    print(f"iteration {pred.iteration_ms:.2f} ms, {pred.throughput(parsed.global_bs):.2f} samples/s, "
          f"max memory {pred.max_memory:.0f} MB")
    print("stage, gpus, ops, time per micro-batch (ms), pipeline (ms), memory (MB: total = normal + reserved)")
    for i, (s, t, p, m) in enumerate(zip(parsed.stages, pred.stage_ms, pred.pipeline_ms, pred.memory, strict=True)):
        print(f"{i}, {s.num_gpus}, {len(s.ops)}, {t:.2f}, {p:.2f}, {m.total:.0f} = {m.total - m.reserved:.0f} + "
              f"{m.reserved:.0f}")
    return pred


def profile_suite(model_name: str, size: str, mbs: list[int], tps: list[int], seq_len: int, warmup: int,
                  repeats: int, comm_mb: str, algos: list[int] | None = None, ranks: int | None = None,
                  groups: list[int] | None = None, p2p: bool | None = None, repeat_seconds: float = 0.0,
                  nodes: int = 1, network: str = "", rounds: int = 1) -> str:
    """A suite (TOML) profiling every op per TP size, micro-batch and algo (default: all the model's),
    plus collectives over each of `groups` ranks (default: the TP sizes over 1) and P2P (default: where
    there are 2 ranks or more): within a node where it has 2 ranks, between two nodes where there are
    `nodes`. Every op point runs on `nodes` x `ranks` (default max(tps): one node's GPUs), as
    ranks / tp TP groups per node at once; `network` shapes the emulated hosts' links of a local run.
    With `rounds` > 1 the op points run in that many rounds over every micro-batch and algo in turn,
    each round with its share of `repeats` and `repeat_seconds`."""
    algos = algos or ([0] if model_name == "t5" else [0, 1])
    ranks = ranks or max(tps)
    groups = [tp for tp in tps if tp > 1] if groups is None else groups
    common = {"model": model_name, "size": size, "seq_len": seq_len, "warmup": warmup, "repeats": repeats}
    shared = common | {"repeats": -(-repeats // rounds)}  # a round's share, rounded up
    timed = {"repeat_seconds": repeat_seconds / rounds} if repeat_seconds else {}
    turns: dict[str, object] = {"round": list(range(1, rounds + 1))} if rounds > 1 else {}
    exps: list[dict[str, object]] = [
        {"name": f"tp{tp}", "family": "aceso", "launch": {"nodes": nodes, "procs_per_node": ranks} if nodes > 1
         else {"procs_per_node": ranks},
         "params": shared | timed | {"tp": tp},
         "matrix": turns | {"mbs": mbs, "algo": algos}} for tp in tps]
    exps += [{"name": f"collectives-{n}", "family": "aceso", "launch": {"procs_per_node": n},
              "params": {"kind": "collectives", **common, "sizes_mb": comm_mb}} for n in groups]
    links = [("p2p", {"procs_per_node": 2})] if ranks > 1 else []
    links += [("p2p-inter-node", {"nodes": 2, "procs_per_node": 1})] if nodes > 1 else []
    if p2p is None or p2p:
        exps += [{"name": name, "family": "aceso", "launch": launch, "params": {"kind": "p2p", **common}}
                 for name, launch in links]
    return suite_toml({"description": f"Aceso profile of {model_name} {size}: TP {tps}, micro-batches {mbs}"},
                      {"nodes": 1, "time_limit": "04:00:00", "network": network}, exps)


def train_suite(name: str, runs: list[tuple[str, str, Path]], nodes: int, gpus_per_node: int,
                params: dict[str, object], network: str = "") -> str:
    """A suite training each (experiment, plan, config) on nodes x gpus_per_node ranks."""
    return suite_toml({"description": f"Aceso runtime: {name}"},
                      {"nodes": nodes, "time_limit": "02:00:00", "network": network},
                      [{"name": exp, "family": "aceso", "launch": {"procs_per_node": gpus_per_node},
                        "params": {"kind": "train", "plan": plan, "config": str(config.resolve()), **params}}
                       for exp, plan, config in runs])


def _config_fields(config: Path) -> dict:
    try:
        return dict(json.loads(config.read_text()))
    except (OSError, ValueError) as exc:
        raise ReproflowError(f"--config {config}: not a config JSON ({exc}).") from None


def train(req: TrainRequest, where: Placement) -> list[str]:
    """Train config JSONs, or a search folder's best config and its Megatron-LM plan (`plan`), with
    reproflow's runtime: here on gloo ranks, or submitted. Returns the submitted job ids."""
    runs: list[tuple[str, str, Path, int]] = []  # experiment, plan, config, GPUs
    for config in req.config:
        if config.suffix != ".json":
            if not req.num_gpus_per_node:
                raise ReproflowError(f"--config {config} is a search folder: give --num-gpus-per-node (and "
                                     "--num-nodes); its configs may not exist yet.")
            gpus = req.num_nodes * req.num_gpus_per_node
            runs += [(f"{plan}-{config.parent.name}-{config.name}", plan, config, gpus) for plan in req.plan]
            continue
        d = _config_fields(config)
        plan = "megatron" if "megatron" in config.name else req.plan[0]
        runs.append((config.stem.replace("_", "-"), plan, config, int(sum(d.get("num_gpus", [0])))))
    ids: list[str] = []
    for exp, plan, config, gpus in runs:
        if gpus % req.num_nodes:
            raise ReproflowError(f"{config}: {gpus} GPUs do not spread over --num-nodes {req.num_nodes}.")
        for impl in req.tp_impl:
            params = {"train_iters": req.train_iters, "train_seconds": req.train_seconds, "seq_len": req.seq_len,
                      "dropout": req.dropout, "log_path": str(req.log_path.resolve()), "tp_impl": impl}
            name = f"aceso-train-{exp}" + ("-mcore" if impl == "megatron-core" else "")
            text = train_suite(name, [(exp, plan, config)], req.num_nodes, gpus // req.num_nodes, params,
                               req.network)
            ids += api.run_generated_suite(text, name, where)
    return ids


def profile(req: ProfileRequest, where: Placement) -> list[str]:
    """Profile a model's ops (per TP size, micro-batch and algo), collectives and P2P, then (run here)
    write the database: a suite is generated under the results, so reruns only profile what is missing.
    Returns the submitted job ids."""
    stem = model(req.prof_model_name, req.prof_model_size).file_stem
    text = profile_suite(req.prof_model_name, req.prof_model_size, list(req.prof_mbs_list), list(req.prof_tp_size),
                         req.prof_seq_len, req.prof_warmup_times, req.prof_repeat_times, req.prof_comm_sizes,
                         p2p=None if req.prof_p2p else False, repeat_seconds=req.prof_repeat_seconds,
                         nodes=req.prof_num_nodes, network=req.network, rounds=req.prof_rounds)
    ids = api.run_generated_suite(text, f"aceso-profile-{stem}", where)
    if not (where.dry_run or where.submit):
        database(where.results, req.prof_path)
    return ids


def database(results: Path, out: Path) -> list[Path]:
    """Write the profiler's rows under `results` as Aceso's database files in `out`."""
    from reproflow.reporting.report import load_results

    frame = load_results(results)
    if frame.empty or "aceso" not in set(frame["family"]):
        raise ReproflowError(f"no aceso profiler rows under {results}. Run a profile suite first, e.g. "
                             "`reproflow run aceso-profile-tiny`.")
    written = write_from_rows(frame, out)
    for path in written:
        print(path)
    return written
