"""Aceso's pipeline, profile -> search -> train: each step a typed request in and a result out.

`reproflow aceso ...` (cli.py) only parses its options into these requests. Profiles and trainings
are suites the engine runs or submits (reproflow.api.run_generated_suite); a submitted search is a
one-task job through the engine's submission too (reproflow.api.submit_call). `reproduce` chains the
steps for each row of the artifact's settings (settings.py) and ends with the reference's result
scripts (the `analysis` package's aceso module).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from reproflow import api
from reproflow.api import Placement
from reproflow.families.aceso import mcore
from reproflow.families.aceso.costmodel import Config, CostModel, Prediction
from reproflow.families.aceso.database import AFTER_TRAINING, read_database, write_from_rows
from reproflow.families.aceso.manifest import newest_manifest, resolve_config
from reproflow.families.aceso.models import Model, model
from reproflow.families.aceso.plans import best_feasible, megatron_plans, read_config, read_json, write_json
from reproflow.families.aceso.search import Options
from reproflow.families.aceso.search import search as search_depths
from reproflow.families.aceso.settings import GPT_MBS, RESNET_MBS, SETTINGS, Setting
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.suite import suite_toml
from reproflow.store.results import atomic_write

# The fields of the requests are the reference's option names (argparse's dests): cli.py fills them by name.


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
    cost_model: str = "runtime"
    max_num_hops: int = 7
    time_budget_total: float = 10
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
    force: bool = False


# What keys a search (with the database's hash): the same database searched with these again is reused.
SEARCH_KEYS = ("model_name", "model_size", "num_layers", "global_batch_size", "micro_batch_size", "num_nodes",
               "num_gpus_per_node", "memory_limit", "max_tp", "start_num_stages", "end_num_stages", "max_num_hops",
               "time_budget_total", "cost_model", "megatron_memory_limit", "megatron_micro_batch_size",
               "op_group_size", "peak_mem_in_backward", "finetune_after_trial", "sort_metric")


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
    prof_comm_sizes: str = "0-64"
    prof_path: Path


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


@dataclass(frozen=True, kw_only=True)
class ReproduceRequest:
    """One of the artifact's settings (`aceso reproduce`); None: the setting's own default."""

    setting: str
    sizes: str = "tiny"
    models: tuple[str, ...] = ("gpt", "t5", "resnet")
    model_sizes: tuple[str, ...] = ()
    profiled_time_path: Path | None = None
    artifact_configs: Path | None = None
    cost_model: str | None = None
    num_nodes: int = 1
    num_gpus_per_node: int = 0
    memory_limit: float | None = None
    time_budget_total: float | None = None
    processes: int = 0
    train_iters: int | None = None
    train_seconds: float | None = None
    until: str = "train"
    log_path: Path | None = None
    published: Path | None = None
    out: Path | None = None
    no_megatron_core: bool = False


class _Setup:
    """Model, database and cost model of a request, with errors that name the option."""

    def __init__(self, req: SearchRequest) -> None:
        try:
            self.model: Model = model(req.model_name, req.model_size, req.num_layers)
        except ValueError as exc:
            raise ReproflowError(f"--model-name/--model-size/--num-layers: {exc}") from None
        self.req = req
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

    def megatron_plan(self) -> tuple[str, Config | None, float]:
        """The fastest feasible uniform plan: its line, config and predicted iteration (ms)."""
        cost, limit = self.megatron_cost()
        gbs = self.req.global_batch_size
        best = best_feasible(megatron_plans(cost, self.ops, gbs, self.gpus, self.max_tp, self.depths), limit)
        if best is None:
            return f"Megatron-LM uniform plans: none fits {limit:.0f} MB", None, 0.0
        return (f"Megatron-LM uniform plan: pp {best.pp} tp {best.tp} dp {best.dp} micro-batch {best.micro_bs} "
                f"recompute {'all' if best.recompute else 'none'}: {best.prediction.iteration_ms / 1000:.2f} s, "
                f"{best.prediction.throughput(gbs):.2f} samples/s, {best.prediction.max_memory:.0f} MB",
                best.config, best.prediction.iteration_ms)

    def write_megatron(self, config: Config, ms: float) -> Path:
        path = self.req.config_save_path / f"{self.name}_{self.model.num_layers}layers_megatron_est_{int(ms)}.json"
        write_json(config, path)
        return path


def megatron(req: SearchRequest) -> Path | None:
    """The fastest feasible uniform (pp, tp, dp, micro-batch, recompute) plan as Aceso's JSON, or None."""
    setup = _Setup(req)
    line, config, ms = setup.megatron_plan()
    print(line)
    if config is None:
        return None
    path = setup.write_megatron(config, ms)
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
    Megatron-LM. With `where.submit`, submit it as a CPU-only job (after `where.after`) instead.

    A search is keyed by the database's content hash and its options: a second search of the same
    database with the same options reuses the first one's configs (unless `force`)."""
    if where is not None and where.submit:
        return _submit_search(req, where)
    if req.from_results:
        from reproflow.reporting.report import load_results

        written = write_from_rows(load_results(req.from_results), req.profiled_time_path)
        print(f"database: {len(written)} files from the profiler rows in {req.from_results}")
    setup = _Setup(req)
    db_hash = database_sha256(req.profiled_time_path)
    options = {k: getattr(req, k) for k in SEARCH_KEYS}
    key = hashlib.sha256(json.dumps([db_hash, options], sort_keys=True, default=str).encode()).hexdigest()[:12]
    manifest = req.config_save_path / f"search-{key}.json"
    if manifest.exists() and not req.force:
        done = json.loads(manifest.read_text())
        print(f"reused: this database (sha256 {db_hash[:12]}) was searched with these options before; "
              f"configs: {', '.join(done['configs'])} (--force searches again)")
        return SearchOutcome(manifest, True)
    suffix = req.config_suffix or f"{_dt.datetime.now():%Y-%m-%d-%H-%M-%S}"
    gbs = req.global_batch_size
    opts = Options(gbs, tuple(setup.mbs), req.num_nodes, req.num_gpus_per_node, req.memory_limit, setup.max_tp,
                   req.max_num_hops, req.time_budget_total, op_group_size=req.op_group_size,
                   finetune_after_trial=req.finetune_after_trial, sort_metric=req.sort_metric)
    print(f"searching {setup.name} ({len(setup.ops)} ops) on {req.num_nodes} x {req.num_gpus_per_node} GPUs, "
          f"depths {setup.depths.start}-{setup.depths.stop - 1}, {req.time_budget_total:g} s budget per depth",
          flush=True)
    start = time.monotonic()
    by_depth = search_depths(setup.cost, setup.ops, opts, setup.depths, req.processes)
    wall = time.monotonic() - start
    found = sorted((r for r in by_depth if r.best is not None), key=lambda r: r.best.time)  # type: ignore[union-attr]
    save, csv_dir = req.config_save_path, req.config_save_path / "csv"
    names = [f"{setup.name}_{r.num_stages}stages_{suffix}.json" for r in found]
    for r, name in zip(found, names, strict=True):
        assert r.best is not None
        write_json(r.best.config, save / name)
        _stage_info(r.best.pred, csv_dir / f"info_{setup.name}_{r.num_stages}stages_{suffix}.csv")
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
    line, mega_config, mega_ms = setup.megatron_plan()
    print(line)
    mega = setup.write_megatron(mega_config, mega_ms).name if mega_config is not None else None
    same = bool(found and mega and read_config(save / mega) == read_config(save / names[0]))
    if same:
        print("Aceso's search returned the Megatron-LM plan itself (the same config)")
    depths = [{"num_stages": r.num_stages, "ms": round(r.best.time, 2) if r.best else None, "explored": r.explored,
               "seconds": round(r.seconds, 2), "to_best_s": round(r.seconds_to_best, 2)} for r in by_depth]
    best = found[0].best if found else None
    atomic_write(manifest, json.dumps({"database_sha256": db_hash, "options": options, "search_s": round(wall, 2),
                                       "configs": names, "megatron": mega,
                                       "best_ms": round(best.time, 2) if best else None,
                                       "megatron_ms": round(mega_ms, 2) if mega else None, "depths": depths,
                                       "same_as_megatron": same,
                                       "written": time.time()}, indent=2, default=str) + "\n")
    if best is not None:
        verdict = "at least as fast as" if mega_ms == 0 or best.time <= mega_ms else "SLOWER than"
        print(f"Aceso search: {best.time / 1000:.2f} s, {gbs / (best.time / 1000):.2f} samples/s, "
              f"{best.memory:.0f} MB: {verdict} the uniform plan")
    return SearchOutcome(manifest, best is not None)


def search_job(req: SearchRequest) -> str:
    """Body of a submitted search: the search, failing the job when it found no config."""
    outcome = search(req)
    if not outcome.found:
        raise RuntimeError(f"the search of {req.config_save_path} found no feasible config")
    return str(outcome.manifest)


def _submit_search(req: SearchRequest, where: Placement) -> SearchOutcome:
    """The search as a CPU-only Slurm job (one task), after `where.after`, with its paths made absolute."""
    absolute = replace(req, profiled_time_path=req.profiled_time_path.resolve(),
                       config_save_path=req.config_save_path.resolve(),
                       log_path=req.log_path.resolve() if req.log_path else None,
                       from_results=req.from_results.resolve() if req.from_results else None)
    job_id = api.submit_call("aceso-search", search_job, absolute, folder=absolute.config_save_path / "submitit",
                             minutes=max(5, int(req.time_budget_total * 2 / 60) + 10), where=where)
    after = [j for item in where.after for j in item.split(",") if j]
    print(f"submitted the search as Slurm job {job_id}" + (f", after {', '.join(after)}" if after else ""))
    print(f"job ids: {job_id}")
    return SearchOutcome(None, True, job_id)


def _stage_info(pred: Prediction, path: Path) -> None:
    """The reference's per-stage info CSV of a prediction."""
    lines = ["stage-index,time,memory(total),memory(normal),memory(reserved)"]
    for i, (t, m) in enumerate(zip(pred.pipeline_ms, pred.memory, strict=True)):
        lines.append(f"stage-{i},{t:.2f},{m.total:.2f},{m.total - m.reserved:.2f},{m.reserved:.2f}")
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
    setup = _Setup(req)
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
                  groups: list[int] | None = None, p2p: bool | None = None, repeat_seconds: float = 0.0) -> str:
    """A suite (TOML) profiling every op per TP size, micro-batch and algo (default: all the model's),
    plus collectives over each of `groups` ranks (default: the TP sizes over 1) and P2P (default: where
    there are 2 ranks or more). Every op point runs on `ranks` (default max(tps): one node's GPUs), as
    ranks / tp TP groups at once."""
    algos = algos or ([0] if model_name == "t5" else [0, 1])
    ranks = ranks or max(tps)
    groups = [tp for tp in tps if tp > 1] if groups is None else groups
    common = {"model": model_name, "size": size, "seq_len": seq_len, "warmup": warmup, "repeats": repeats}
    timed = {"repeat_seconds": repeat_seconds} if repeat_seconds else {}
    exps: list[dict[str, object]] = [
        {"name": f"tp{tp}", "family": "aceso", "launch": {"procs_per_node": ranks},
         "params": common | timed | {"tp": tp},
         "matrix": {"mbs": mbs, "algo": algos}} for tp in tps]
    exps += [{"name": f"collectives-{n}", "family": "aceso", "launch": {"procs_per_node": n},
              "params": {"kind": "collectives", **common, "sizes_mb": comm_mb}} for n in groups]
    if ranks > 1 if p2p is None else p2p:
        exps.append({"name": "p2p", "family": "aceso", "launch": {"procs_per_node": 2},
                     "params": {"kind": "p2p", **common}})
    return suite_toml({"description": f"Aceso profile of {model_name} {size}: TP {tps}, micro-batches {mbs}"},
                      {"nodes": 1, "time_limit": "04:00:00"}, exps)


def train_suite(name: str, runs: list[tuple[str, str, Path]], nodes: int, gpus_per_node: int,
                params: dict[str, object]) -> str:
    """A suite training each (experiment, plan, config) on nodes x gpus_per_node ranks."""
    return suite_toml({"description": f"Aceso runtime: {name}"}, {"nodes": nodes, "time_limit": "02:00:00"},
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
            text = train_suite(name, [(exp, plan, config)], req.num_nodes, gpus // req.num_nodes, params)
            ids += api.run_generated_suite(text, name, where)
    return ids


def profile(req: ProfileRequest, where: Placement) -> list[str]:
    """Profile a model's ops (per TP size, micro-batch and algo), collectives and P2P, then (run here)
    write the database: a suite is generated under the results, so reruns only profile what is missing.
    Returns the submitted job ids."""
    stem = model(req.prof_model_name, req.prof_model_size).file_stem
    text = profile_suite(req.prof_model_name, req.prof_model_size, list(req.prof_mbs_list), list(req.prof_tp_size),
                         req.prof_seq_len, req.prof_warmup_times, req.prof_repeat_times, req.prof_comm_sizes,
                         repeat_seconds=req.prof_repeat_seconds)
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


def _search_request(s: Setting, db: Path, where: Path, nodes: int, gpus_per_node: int, req: ReproduceRequest,
                    cost_model: str, force: bool = False, from_results: Path | None = None) -> SearchRequest:
    """The search of one row of the artifact's settings (with the reproduce request's overrides)."""
    o = s.search
    return SearchRequest(
        model_name=s.model, model_size=s.size, num_layers=s.num_layers, global_batch_size=s.global_bs,
        micro_batch_size=o.mbs, num_nodes=nodes, num_gpus_per_node=gpus_per_node,
        memory_limit=req.memory_limit if req.memory_limit is not None else o.memory_limit,
        profiled_time_path=db, config_save_path=where, max_num_hops=o.max_hops,
        num_of_saved_configs=o.saved_configs,
        time_budget_total=req.time_budget_total if req.time_budget_total is not None else o.budget_s,
        processes=req.processes, force=force, from_results=from_results, cost_model=cost_model,
        megatron_memory_limit=req.memory_limit if req.memory_limit is not None else s.megatron_memory_limit,
        megatron_micro_batch_size=s.megatron_mbs, op_group_size=o.op_group_size,
        peak_mem_in_backward=o.peak_mem_in_backward, finetune_after_trial=o.finetune_after_trial,
        sort_metric=o.sort_metric)


def reproduce(req: ReproduceRequest, where: Placement) -> None:
    """One of the artifact's settings, one command, with the artifact's own settings for every model.

    small: for each model, profile its ops, search configs, train the best config and the Megatron-LM
    uniform plan with the same runtime (the plan also on megatron-core's tensor-parallel layers where
    installed), then the reference's result scripts (figures 7, 8, 9). large and scale: the search and
    the plan on a profiled database (the artifact's), then the predicted throughput and search cost."""
    req = replace(req, log_path=req.log_path or Path("aceso-logs" if req.setting == "small" else "aceso-logs-large"),
                  cost_model=req.cost_model or ("runtime" if req.setting == "small" else "reference"))
    if req.setting != "small" or req.profiled_time_path is not None:
        _reproduce_search(req, where)
        return
    assert req.log_path is not None and req.cost_model is not None
    root = req.log_path
    if root.resolve().is_relative_to(where.results.resolve()):
        raise ReproflowError(f"--log-path {root} is inside --results {where.results}: the profiles and runtime CSVs "
                             "would mix with the result rows. Put them beside it, e.g. --log-path aceso-logs.")
    tiny = req.sizes == "tiny"
    targets = [t for t in SETTINGS["tiny" if tiny else "small"] if t.model in req.models]
    train_iters = req.train_iters if req.train_iters is not None else (40 if tiny else 5)
    train_seconds = req.train_seconds if req.train_seconds is not None else (10.0 if tiny else 0.0)
    gpn, nodes = req.num_gpus_per_node or local_ranks(req.sizes, where.submit), req.num_nodes
    tps = tuple(t for t in (1, 2, 4, 8) if t <= gpn)
    here = replace(where, after=(), force=False)
    mcore_impl: tuple[str, ...] = () if req.no_megatron_core else ("megatron-core",)
    if mcore_impl:
        try:
            mcore.available()
        except ParamError as exc:
            print(f"the Megatron-LM plan runs on reproflow's layers only: {exc}")
            mcore_impl = ()
    for t in targets:
        folder = root / "aceso" / "search" / t.model / t.size
        print(f"==== {t.model} {t.size}: profile -> search -> train (Aceso and Megatron-LM) on {nodes} x {gpn} "
              f"{'GPUs' if where.submit else 'local ranks'} ====", flush=True)
        prof = ProfileRequest(prof_model_name=t.model, prof_model_size=t.size, prof_tp_size=tps,
                              prof_mbs_list=tuple(sorted(set(t.search.mbs) | set(t.megatron_mbs))),
                              prof_seq_len=t.seq_len, prof_warmup_times=2 if tiny else 3, prof_repeat_times=10,
                              # tiny: 10 passes take under a second, shorter than this machine's slowdowns
                              prof_repeat_seconds=2.0 if tiny else 0.0,
                              # tiny: up to the tiny models' gradients (the runtime model's all-reduce)
                              prof_comm_sizes="0-4,8,16,32" if tiny else "0-64",
                              prof_path=root / "profiled-time")
        profiled = profile(prof, here)
        if where.dry_run:
            print(f"then: reproflow aceso search ... --config-save-path {folder}; reproflow aceso train --config "
                  f"{folder} --plan aceso megatron")
            continue
        search_req = _search_request(t, root / "profiled-time", folder, nodes, gpn, req, req.cost_model,
                                     from_results=where.results if where.submit else None)
        searched = search(search_req, replace(here, after=tuple(profiled)))
        if req.until == "search":
            continue
        after = (searched.job_id,) if where.submit else ()
        # The plan on reproflow's layers last: its training is the one the profile after it pairs with.
        for plan, impls in (("aceso", ("reproflow",)), ("megatron", (*mcore_impl, "reproflow"))):
            train(TrainRequest(config=(folder,), plan=(plan,), num_nodes=nodes, num_gpus_per_node=gpn,
                               train_iters=train_iters, train_seconds=train_seconds, seq_len=t.seq_len,
                               dropout=0.1, log_path=root, tp_impl=impls), replace(here, after=after))
            if not where.submit and (plan == "aceso" or _same_as_megatron(folder)):
                profile_after_training(prof, search_req, train_iters, plan, here)
    if where.submit or where.dry_run:
        print(f"when the jobs are done: reproflow aceso e2e small --log-path {root} (and search-cost, perf-model-acc)")
        return
    for name in ("search-cost",) if req.until == "search" else ("e2e", "search-cost", "perf-model-acc"):
        results(name, "small", root, req.out or root / "results", req.published)


def _same_as_megatron(folder: Path) -> bool:
    """Whether the newest search in `folder` returned the Megatron-LM plan itself."""
    manifest = newest_manifest(folder)
    return bool(manifest and json.loads(manifest.read_text()).get("same_as_megatron"))


def profile_after_training(prof: ProfileRequest, search_req: SearchRequest, train_iters: int, plan: str,
                           where: Placement) -> Path:
    """Profile the ops of the config of `plan` just trained again, at once, and predict it from that
    profile too (`info_<config>-after-training.csv` beside the search's `info_<config>.csv`). Ranks
    sharing a machine run at a speed that drifts over minutes (the same config trained at 350 and 416 ms
    a minute apart here): the search's profile, minutes before the training, then measures the drift as
    much as the model, and so does one profile for two trainings. Only what the config uses is profiled
    (its ops' TP sizes, micro-batches and algos on as many ranks as before, the collectives of its TP and
    DP groups, P2P between its stages), into a database of this profile and the search's for the rest.
    The suite is named after the plan and the training's iterations: a training run again with more of
    them (a claim asking for samples) is profiled again after; a reused one is not."""
    from reproflow.reporting.report import load_results

    setup = _Setup(search_req)
    path = resolve_config(search_req.config_save_path, plan)
    config = read_json(path, setup.model, setup.ops)
    ops = [(tp, dp, algo) for stage in config.stages for tp, dp, algo in zip(stage.tp, stage.dp, stage.algo,
                                                                              strict=True)]
    text = profile_suite(prof.prof_model_name, prof.prof_model_size, sorted({config.micro_bs // d for _, d, _ in ops}),
                         sorted({t for t, _, _ in ops}), prof.prof_seq_len, prof.prof_warmup_times,
                         prof.prof_repeat_times, prof.prof_comm_sizes, algos=sorted({a for _, _, a in ops}),
                         ranks=max(prof.prof_tp_size), groups=sorted({n for t, d, _ in ops for n in (t, d) if n > 1}),
                         p2p=len(config.stages) > 1, repeat_seconds=prof.prof_repeat_seconds)
    name = f"aceso-profile-{setup.model.file_stem}{AFTER_TRAINING}-{'' if plan == 'aceso' else plan + '-'}{train_iters}"
    api.run_generated_suite(text, name, where)
    after = Path(f"{prof.prof_path}{AFTER_TRAINING}")
    shutil.copytree(prof.prof_path, after, dirs_exist_ok=True)  # what was not profiled again
    rows = load_results(where.results)
    write_from_rows(rows[rows["suite"].astype(str) == name], after, after_training=True)
    pred = _Setup(replace(search_req, profiled_time_path=after)).cost.predict(config)
    info = search_req.config_save_path / "csv" / f"info_{path.stem}{AFTER_TRAINING}.csv"
    _stage_info(pred, info)
    print(f"{setup.name}: predicted from its ops profiled again right after training: {pred.iteration_ms:.2f} ms "
          f"({setup.cost.predict(config).iteration_ms:.2f} from the search's profile) -> {info}")
    return info


def local_ranks(sizes: str, submit: bool) -> int:
    """Ranks per node when none are given: the artifact's 4 GPUs, or, for the tiny models on this machine,
    one rank per core (2 to 4). Ranks beyond the cores take turns on them, so an op's time depends on
    what the other ranks do at that moment, which no op profile can know: on 2 cores with 4 ranks the
    tiny models' predictions were 8 to 46 % off from run to run."""
    if sizes != "tiny" or submit:
        return 4
    ranks = max(2, min(4, len(os.sched_getaffinity(0))))
    print(f"tiny models on this machine: {ranks} local ranks, one per core (--num-gpus-per-node to choose)")
    return ranks


def _reproduce_search(req: ReproduceRequest, where: Placement) -> None:
    """large | scale: Aceso's search and the Megatron-LM plan for every model and size, then the tables."""
    assert req.log_path is not None and req.cost_model is not None
    rows = [s for s in SETTINGS[req.setting] if s.model in req.models or req.setting == "scale"]
    if req.setting == "small" and req.sizes == "tiny":
        raise ReproflowError("--profiled-time-path with the small setting searches the artifact's own models: add "
                             "--sizes reference (tiny models are profiled here, without --profiled-time-path).")
    if req.model_sizes:
        rows = [s for s in rows if s.label in req.model_sizes]
        missing = set(req.model_sizes) - {s.label for s in rows}
        if missing:
            known = ", ".join(s.label for s in SETTINGS[req.setting])
            raise ReproflowError(f"--model-sizes {' '.join(sorted(missing))}: not in the {req.setting} setting "
                                 f"(it has {known}).")
    db = req.profiled_time_path
    if db is None or not db.is_dir():
        raise ReproflowError(f"--profiled-time-path {db}: not a folder. Give the profiled "
                             "database, e.g. the artifact's profiler/profiled-time-eurosys/.")
    root = req.log_path
    if where.dry_run:
        for s in rows:
            o = s.search
            print(f"{s.model} {s.label}: {s.nodes} x {s.gpus_per_node} GPUs, global batch {s.global_bs}, "
                  + (f"the given single-GPU config (micro-batch {s.single_gpu[0]})" if s.single_gpu else
                     f"Aceso: {o.memory_limit:.0f} MB, micro-batches {list(o.mbs)}, {o.budget_s:g} s, {o.max_hops} "
                     f"hops; Megatron-LM plan: {s.megatron_memory_limit:.0f} MB, micro-batches {list(s.megatron_mbs)}"))
        return
    for s in rows:
        folder = root / "aceso" / "search" / s.model / s.label
        print(f"==== {s.model} {s.label}: {s.nodes} x {s.gpus_per_node} GPUs, global batch {s.global_bs} ====",
              flush=True)
        if s.single_gpu is not None:
            _single_gpu_config(s, db, folder, req.cost_model)
        else:
            search(_search_request(s, db, folder, s.nodes, s.gpus_per_node, req, req.cost_model, force=where.force),
                   where)
        if req.artifact_configs is not None:
            _score_artifact(s, db, req.artifact_configs, folder)
    if where.submit:
        print(f"when the jobs are done: reproflow aceso predicted {req.setting} --log-path {root} "
              "(and search-cost)")
        return
    for name in ("predicted", "search-cost"):
        results(name, req.setting, root, req.out or root / "results", req.published)


def _uniform_cost(s: Setting, db_path: Path, cost_model: str) -> tuple[Model, CostModel, list[str]]:
    m = model(s.model, s.size, s.num_layers)
    db = read_database(db_path, m, list(s.megatron_mbs), m.max_tp(s.gpus_per_node))
    cost = CostModel(db, s.gpus_per_node, s.megatron_memory_limit, kind=cost_model)
    return m, cost, m.full_op_list(db.ops)


def _single_gpu_config(s: Setting, db_path: Path, where: Path, cost_model: str) -> None:
    """The artifact's given single-GPU config (its `single_gpu_configs/`): one stage, every op but the
    embedding and head recomputed; both systems train it, so it is Aceso's config and the plan."""
    assert s.single_gpu is not None
    mbs, recompute = s.single_gpu
    m, cost, ops = _uniform_cost(s, db_path, cost_model)
    plan = next(p for p in megatron_plans(cost, ops, s.global_bs, 1, 1, range(1, 2))
                if p.micro_bs == mbs and p.recompute == recompute)
    ms = plan.prediction.iteration_ms
    where.mkdir(parents=True, exist_ok=True)
    name = f"{m.name}_{s.label}_mbs{mbs}_recomp.json"
    write_json(plan.config, where / name)
    atomic_write(where / "search-single-gpu.json", json.dumps(
        {"configs": [name], "megatron": name, "best_ms": round(ms, 2), "megatron_ms": round(ms, 2), "search_s": None,
         "depths": [], "written": time.time()}, indent=2) + "\n")
    print(f"the artifact's single-GPU config (micro-batch {mbs}, recompute): {ms / 1000:.2f} s, "
          f"{plan.prediction.throughput(s.global_bs):.2f} samples/s, {plan.prediction.max_memory:.0f} MB")


def _score_artifact(s: Setting, db_path: Path, artifact_configs: Path, where: Path) -> None:
    """The artifact's own search output for this size (its configs folder), scored with the reference
    model beside reproflow's: the best predicted iteration among its saved configs."""
    folder = artifact_configs / s.model / s.label
    files = sorted((folder / "top_configs").glob("*.json")) or sorted(folder.glob("*stages*.json"))
    if not files:
        print(f"no artifact configs under {folder}")
        return
    m = model(s.model, s.size, s.num_layers)
    db = read_database(db_path, m, list(s.search.mbs), m.max_tp(s.gpus_per_node))
    cost, ops = CostModel(db, s.gpus_per_node, s.search.memory_limit, kind="reference"), m.full_op_list(db.ops)
    scored = []
    for f in files:
        pred = cost.predict(read_json(f, m, ops))
        if pred.max_memory <= s.search.memory_limit:
            scored.append((pred.iteration_ms, f.name))
    summary = sorted(folder.glob("*summary*.csv"))
    search_s = float(summary[-1].read_text().splitlines()[1]) if summary else None
    best = min(scored, default=None)
    atomic_write(where / "artifact.json", json.dumps(
        {"folder": str(folder), "best_ms": round(best[0], 2) if best else None, "config": best[1] if best else None,
         "search_s": search_s}, indent=2) + "\n")
    if best:
        print(f"the artifact's own search: {best[0] / 1000:.2f} s ({best[1]}, reference model)"
              + (f", searched in {search_s:.1f} s" if search_s is not None else ""))


def results(script: str, setting: str, log_path: Path | None, out: Path | None, published: Path | None) -> str:
    """The reference's result scripts (e2e, search-cost, perf-model-acc, predicted): tables printed and
    written as CSVs, and the paper's figure. Returns the printed table."""
    from reproflow.reporting.report import load_analysis

    analysis = load_analysis("aceso")
    if analysis is None:
        raise ReproflowError("the `analysis` package (installed with reproflow) has no aceso module.")
    log = log_path or Path("aceso-logs" if setting == "small" else "aceso-logs-large")
    out = out or log / "results"
    fn = {"e2e": analysis.e2e, "search-cost": analysis.search_cost, "perf-model-acc": analysis.perf_model_acc,
          "predicted": analysis.predicted}
    text = fn[script](log, setting, out, published)
    print(text or f"no {script} data under {log}: run `reproflow aceso reproduce` (or train) first")
    print(f"tables and figures: {out}")
    return str(text or "")

