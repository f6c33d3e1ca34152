"""The work behind `reproflow aceso ...` (cli.py parses; each command's function here runs it)."""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from reproflow import api
from reproflow.api.options import placement
from reproflow.families.aceso import mcore
from reproflow.families.aceso.costmodel import Config, CostModel, Prediction
from reproflow.families.aceso.database import AFTER_TRAINING, read_database, write_from_rows
from reproflow.families.aceso.models import Model, model
from reproflow.families.aceso.plans import best_feasible, megatron_plans, read_config, read_json, write_json
from reproflow.families.aceso.runtime import newest_manifest, resolve_config
from reproflow.families.aceso.search import Options, search
from reproflow.families.aceso.settings import GPT_MBS, RESNET_MBS, SETTINGS, Setting
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.suite import suite_toml
from reproflow.store.results import atomic_write


class _Setup:
    """Model, database and cost model from the common options, with errors that name the option."""

    def __init__(self, args: argparse.Namespace) -> None:
        try:
            self.model: Model = model(args.model_name, args.model_size, args.num_layers)
        except ValueError as exc:
            raise ReproflowError(f"--model-name/--model-size/--num-layers: {exc}") from None
        self.args = args
        self.mbs = args.micro_batch_size or list(RESNET_MBS if args.model_name == "resnet" else GPT_MBS)
        self.gpus = args.num_nodes * args.num_gpus_per_node
        self.max_tp = args.max_tp or self.model.max_tp(args.num_gpus_per_node)
        self.cost = self.cost_model(self.mbs, args.memory_limit)
        self.db = self.cost.db
        self.ops = self.model.full_op_list(self.db.ops)
        self.depths = range(args.start_num_stages, (args.end_num_stages or min(self.gpus, 16)) + 1)
        self.name = f"{self.model.name}_{self.model.size}"
        args.config_save_path.mkdir(parents=True, exist_ok=True)

    def cost_model(self, mbs: list[int], memory_limit: float) -> CostModel:
        """The chosen performance model on the database's tables for these micro-batch sizes."""
        a = self.args
        db = read_database(a.profiled_time_path, self.model, mbs, self.max_tp)
        return CostModel(db, a.num_gpus_per_node, memory_limit, kind=a.cost_model,
                         peak_mem_in_backward=getattr(a, "peak_mem_in_backward", 0.0))

    def megatron_cost(self) -> tuple[CostModel, float]:
        """The model and memory limit of the Megatron-LM plan (the artifact gives some baselines their own)."""
        a = self.args
        mbs, limit = getattr(a, "megatron_micro_batch_size", None), getattr(a, "megatron_memory_limit", None)
        if not mbs and limit is None:
            return self.cost, a.memory_limit
        limit = a.memory_limit if limit is None else limit
        return self.cost_model(mbs or self.mbs, limit), limit


def _megatron_line(setup: _Setup, args: argparse.Namespace) -> tuple[str, Config | None, float]:
    cost, limit = setup.megatron_cost()
    plans = megatron_plans(cost, setup.ops, args.global_batch_size, setup.gpus, setup.max_tp, setup.depths)
    best = best_feasible(plans, limit)
    if best is None:
        return f"Megatron-LM uniform plans: none fits {limit:.0f} MB", None, 0.0
    thpt = best.prediction.throughput(args.global_batch_size)
    return (f"Megatron-LM uniform plan: pp {best.pp} tp {best.tp} dp {best.dp} micro-batch {best.micro_bs} "
            f"recompute {'all' if best.recompute else 'none'}: {best.prediction.iteration_ms / 1000:.2f} s, "
            f"{thpt:.2f} samples/s, {best.prediction.max_memory:.0f} MB", best.config, best.prediction.iteration_ms)


def cmd_megatron(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso megatron` (its options: cli.py)."""
    setup = _Setup(args)
    line, config, ms = _megatron_line(setup, args)
    print(line)
    if config is not None:
        print(f"config: {_write_megatron(setup, args, config, ms)}")
    return 0 if config is not None else 1


def _write_megatron(setup: _Setup, args: argparse.Namespace, config: Config, ms: float) -> Path:
    path = args.config_save_path / f"{setup.name}_{setup.model.num_layers}layers_megatron_est_{int(ms)}.json"
    write_json(config, path)
    return path


SEARCH_KEYS = ("model_name", "model_size", "num_layers", "global_batch_size", "micro_batch_size", "num_nodes",
               "num_gpus_per_node", "memory_limit", "max_tp", "start_num_stages", "end_num_stages", "max_num_hops",
               "time_budget_total", "cost_model", "megatron_memory_limit", "megatron_micro_batch_size",
               "op_group_size", "peak_mem_in_backward", "finetune_after_trial", "sort_metric")


def database_sha256(path: Path) -> str:
    """Content hash of a database folder: every CSV's name and bytes, in name order."""
    digest = hashlib.sha256()
    for f in sorted(Path(path).glob("*.csv")):
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def cmd_search(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso search` (its options: cli.py)."""
    if args.submit:
        return _submit_search(args)
    if args.from_results:
        from reproflow.reporting.report import load_results

        written = write_from_rows(load_results(args.from_results), args.profiled_time_path)
        print(f"database: {len(written)} files from the profiler rows in {args.from_results}")
    setup = _Setup(args)
    db_hash = database_sha256(args.profiled_time_path)
    options = {k: getattr(args, k) for k in SEARCH_KEYS}
    key = hashlib.sha256(json.dumps([db_hash, options], sort_keys=True, default=str).encode()).hexdigest()[:12]
    manifest = args.config_save_path / f"search-{key}.json"
    if manifest.exists() and not args.force:
        done = json.loads(manifest.read_text())
        print(f"reused: this database (sha256 {db_hash[:12]}) was searched with these options before; "
              f"configs: {', '.join(done['configs'])} (--force searches again)")
        return 0
    suffix = args.config_suffix or f"{_dt.datetime.now():%Y-%m-%d-%H-%M-%S}"
    opts = Options(args.global_batch_size, tuple(setup.mbs), args.num_nodes, args.num_gpus_per_node,
                   args.memory_limit, setup.max_tp, args.max_num_hops, args.time_budget_total,
                   op_group_size=args.op_group_size, finetune_after_trial=args.finetune_after_trial,
                   sort_metric=args.sort_metric)
    print(f"searching {setup.name} ({len(setup.ops)} ops) on {args.num_nodes} x {args.num_gpus_per_node} GPUs, "
          f"depths {setup.depths.start}-{setup.depths.stop - 1}, {args.time_budget_total:g} s budget per depth",
          flush=True)
    start = time.monotonic()
    results = search(setup.cost, setup.ops, opts, setup.depths, args.processes)
    wall = time.monotonic() - start
    found = sorted((r for r in results if r.best is not None), key=lambda r: r.best.time)  # type: ignore[union-attr]
    save, csv_dir = args.config_save_path, args.config_save_path / "csv"
    for r in found:
        assert r.best is not None
        write_json(r.best.config, save / f"{setup.name}_{r.num_stages}stages_{suffix}.json")
        _stage_info(r.best.pred, csv_dir / f"info_{setup.name}_{r.num_stages}stages_{suffix}.csv")
    (save / "top_configs").mkdir(exist_ok=True)
    for r in found[:args.num_of_saved_configs]:
        name = f"{setup.name}_{r.num_stages}stages_{suffix}.json"
        shutil.copy(save / name, save / "top_configs" / name)
    print("# of stages\test_iteration_time(s)\test_thpt(samples/s)\test_mem(MB)\t# of explored cases\t"
          "search(s)\tto best(s)")
    for r in found:
        assert r.best is not None
        print(f"{r.num_stages}\t{r.best.time / 1000:.2f}\t{args.global_batch_size / (r.best.time / 1000):.2f}\t"
              f"{r.best.memory:.0f}\t{r.explored}\t{r.seconds:.2f}\t{r.seconds_to_best:.2f}")
    for r in results:
        if r.best is None:
            print(f"{r.num_stages}\tno feasible config")
    log = args.log_path or save
    log.mkdir(parents=True, exist_ok=True)
    atomic_write(log / f"{setup.name}_summary_{suffix}.csv", f"search_cost\n{wall:.2f}\n")
    print(f"\noverall search time: {wall:.2f} s")
    line, mega_config, mega_ms = _megatron_line(setup, args)
    print(line)
    mega = _write_megatron(setup, args, mega_config, mega_ms).name if mega_config is not None else None
    same = bool(found and mega and read_config(save / mega) == read_config(
        save / f"{setup.name}_{found[0].num_stages}stages_{suffix}.json"))
    if same:
        print("Aceso's search returned the Megatron-LM plan itself (the same config)")
    depths = [{"num_stages": r.num_stages, "ms": round(r.best.time, 2) if r.best else None, "explored": r.explored,
               "seconds": round(r.seconds, 2), "to_best_s": round(r.seconds_to_best, 2)} for r in results]
    atomic_write(manifest, json.dumps({"database_sha256": db_hash, "options": options, "search_s": round(wall, 2),
                                       "configs": [f"{setup.name}_{r.num_stages}stages_{suffix}.json"
                                                   for r in found], "megatron": mega,
                                       "best_ms": round(found[0].best.time, 2) if found and found[0].best else None,
                                       "megatron_ms": round(mega_ms, 2) if mega else None, "depths": depths,
                                       "same_as_megatron": same,
                                       "written": time.time()}, indent=2, default=str) + "\n")
    if found:
        best = found[0].best
        assert best is not None
        verdict = "at least as fast as" if mega_ms == 0 or best.time <= mega_ms else "SLOWER than"
        print(f"Aceso search: {best.time / 1000:.2f} s, {args.global_batch_size / (best.time / 1000):.2f} samples/s, "
              f"{best.memory:.0f} MB: {verdict} the uniform plan")
    return 0 if found else 1


def _search_job(argv: list[str]) -> int:
    """Body of a submitted search job: the same command without --submit."""
    from reproflow.families.aceso.cli import main

    code = main(["search", *argv])
    if code:
        raise RuntimeError(f"reproflow aceso search exited with {code}")
    return code


_SEARCH_FLAGS = (*SEARCH_KEYS, "profiled_time_path", "config_save_path", "num_of_saved_configs", "log_path",
                 "config_suffix", "processes", "from_results")


def _argv_of(args: argparse.Namespace) -> list[str]:
    """The search's options as a command line (paths made absolute), for the submitted job."""
    argv: list[str] = []
    for name in _SEARCH_FLAGS:
        value = getattr(args, name)
        if value is None or value == "":
            continue
        flag = "--model" if name == "cost_model" else "--" + name.replace("_", "-")
        if isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value.resolve()) if isinstance(value, Path) else str(value)]
    return argv + (["--force"] if args.force else [])


def _submit_search(args: argparse.Namespace) -> int:
    """Submit the search as a CPU-only Slurm job (one task), after the given jobs succeed."""
    import submitit

    argv = _argv_of(args)
    folder = (args.config_save_path / "submitit").resolve()
    try:
        executor = submitit.SlurmExecutor(folder=folder / "%j", python=sys.executable)
    except RuntimeError as exc:
        raise ReproflowError(f"cannot submit to Slurm: {exc}. Run the search here without --submit.") from None
    params: dict[str, object] = {"job_name": "reproflow-aceso-search", "nodes": 1, "ntasks_per_node": 1,
                                 "time": max(5, int(args.time_budget_total * 2 / 60) + 10)}
    after = [j for item in args.after for j in item.split(",") if j]
    if after:
        params["dependency"] = "afterok:" + ":".join(after)
    executor.update_parameters(**params)
    job = executor.submit(_search_job, argv)
    print(f"submitted the search as Slurm job {job.job_id}" + (f", after {', '.join(after)}" if after else ""))
    print(f"job ids: {job.job_id}")
    args.submitted = str(job.job_id)
    return 0


def _stage_info(pred: Prediction, path: Path) -> None:
    """The reference's per-stage info CSV of a prediction."""
    lines = ["stage-index,time,memory(total),memory(normal),memory(reserved)"]
    for i, (t, m) in enumerate(zip(pred.pipeline_ms, pred.memory, strict=True)):
        lines.append(f"stage-{i},{t:.2f},{m.total:.2f},{m.total - m.reserved:.2f},{m.reserved:.2f}")
    atomic_write(path, "\n".join(lines) + "\n")


def cmd_megatron_lm(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso megatron-lm` (its options: cli.py)."""
    import shlex
    import subprocess

    from reproflow.families.aceso.plans import megatron_lm_args, parse_megatron_log

    d = _config_fields(args.config)
    try:
        plan_args = megatron_lm_args(d, args.train_iters)
    except (ValueError, KeyError) as exc:
        raise ReproflowError(f"--config {args.config}: {exc}") from None
    gpus = int(sum(d["num_gpus"]))
    per_node = gpus // args.num_nodes
    launch = ["torchrun", f"--nproc-per-node={per_node}"]
    if args.num_nodes > 1:
        launch += [f"--nnodes={args.num_nodes}", "--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT"]
    command = [*launch, str(args.megatron_dir / "pretrain_gpt.py"), *plan_args]
    print(" ".join(shlex.quote(c) if "$" not in c else c for c in command))
    if not args.run:
        return 0
    if not (args.megatron_dir / "pretrain_gpt.py").is_file():
        raise ReproflowError(f"no {args.megatron_dir}/pretrain_gpt.py: give --megatron-dir of a Megatron-LM checkout "
                             "(the megatron container has one at /opt/Megatron-LM); Megatron-LM needs CUDA GPUs.")
    done = subprocess.run(command, capture_output=True, text=True)
    print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
    times = parse_megatron_log(done.stdout + done.stderr)
    if done.returncode or not times:
        raise ReproflowError(f"Megatron-LM exited with {done.returncode} and logged {len(times)} iterations.")
    timed = times[2:] or times
    ms = sum(timed) / len(timed)
    out = args.log_path / "megatron-lm" / "runtime" / "gpt" / str(d["model_size"]) / "csv"
    gbs = d["global_batch_size"]
    atomic_write(out / f"{args.config.stem}_stage0_rank0.csv", f"global_batch_size,time\n{gbs},{ms:.2f}\n")
    print(f"Megatron-LM: {ms:.2f} ms per iteration, {float(gbs) / (ms / 1000):.2f} samples/s -> {out}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso predict` (its options: cli.py)."""
    setup = _Setup(args)
    config = read_json(args.config, setup.model, setup.ops)
    pred = setup.cost.predict(config)
    print(f"iteration {pred.iteration_ms:.2f} ms, {pred.throughput(config.global_bs):.2f} samples/s, "
          f"max memory {pred.max_memory:.0f} MB")
    print("stage, gpus, ops, time per micro-batch (ms), pipeline (ms), memory (MB: total = normal + reserved)")
    for i, (s, t, p, m) in enumerate(zip(config.stages, pred.stage_ms, pred.pipeline_ms, pred.memory, strict=True)):
        print(f"{i}, {s.num_gpus}, {len(s.ops)}, {t:.2f}, {p:.2f}, {m.total:.0f} = {m.total - m.reserved:.0f} + "
              f"{m.reserved:.0f}")
    return 0


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


def cmd_train(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso train` (its options: cli.py)."""
    runs: list[tuple[str, str, Path, int]] = []  # experiment, plan, config, GPUs
    for config in args.config:
        if config.suffix != ".json":
            if not args.num_gpus_per_node:
                raise ReproflowError(f"--config {config} is a search folder: give --num-gpus-per-node (and "
                                     "--num-nodes); its configs may not exist yet.")
            gpus = args.num_nodes * args.num_gpus_per_node
            runs += [(f"{plan}-{config.parent.name}-{config.name}", plan, config, gpus) for plan in args.plan]
            continue
        d = _config_fields(config)
        plan = "megatron" if "megatron" in config.name else args.plan[0]
        runs.append((config.stem.replace("_", "-"), plan, config, int(sum(d.get("num_gpus", [0])))))
    ids: list[str] = []
    for exp, plan, config, gpus in runs:
        if gpus % args.num_nodes:
            raise ReproflowError(f"{config}: {gpus} GPUs do not spread over --num-nodes {args.num_nodes}.")
        for impl in args.tp_impl:
            params = {"train_iters": args.train_iters, "train_seconds": args.train_seconds, "seq_len": args.seq_len,
                      "dropout": args.dropout,
                      "log_path": str(args.log_path.resolve()), "tp_impl": impl}
            name = f"aceso-train-{exp}" + ("-mcore" if impl == "megatron-core" else "")
            text = train_suite(name, [(exp, plan, config)], args.num_nodes, gpus // args.num_nodes, params)
            ids += api.run_generated_suite(text, name, placement(args))
    args.submitted = ",".join(ids)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso profile` (its options: cli.py)."""
    stem = model(args.prof_model_name, args.prof_model_size).file_stem
    text = profile_suite(args.prof_model_name, args.prof_model_size, args.prof_mbs_list, args.prof_tp_size,
                         args.prof_seq_len, args.prof_warmup_times, args.prof_repeat_times, args.prof_comm_sizes,
                         repeat_seconds=args.prof_repeat_seconds)
    args.submitted = ",".join(api.run_generated_suite(text, f"aceso-profile-{stem}", placement(args)))
    if args.dry_run or getattr(args, "submit", False):
        return 0
    args.from_results = args.results
    args.out = args.prof_path
    return cmd_database(args)


def cmd_database(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso database` (its options: cli.py)."""
    from reproflow.reporting.report import load_results

    frame = load_results(args.from_results if getattr(args, "from_results", None) else args.results)
    if frame.empty or "aceso" not in set(frame["family"]):
        raise ReproflowError(f"no aceso profiler rows under {args.results}. Run a profile suite first, e.g. "
                             "`reproflow run aceso-profile-tiny`.")
    for path in write_from_rows(frame, args.out):
        print(path)
    return 0


def _search_args(s: Setting, db: Path, where: Path, nodes: int, gpus_per_node: int, args: argparse.Namespace,
                 after: list[str], from_results: Path | None = None) -> argparse.Namespace:
    """`aceso search`'s options for one row of the artifact's settings (and this command's overrides)."""
    o = s.search
    memory = args.memory_limit if getattr(args, "memory_limit", None) is not None else o.memory_limit
    mega_memory = args.memory_limit if getattr(args, "memory_limit", None) is not None else s.megatron_memory_limit
    return argparse.Namespace(
        model_name=s.model, model_size=s.size, num_layers=s.num_layers, global_batch_size=s.global_bs,
        micro_batch_size=list(o.mbs), num_nodes=nodes, num_gpus_per_node=gpus_per_node, memory_limit=memory,
        max_tp=None, start_num_stages=1, end_num_stages=None, profiled_time_path=db, config_save_path=where,
        max_num_hops=o.max_hops, num_of_saved_configs=o.saved_configs, log_path=None, config_suffix="",
        time_budget_total=args.time_budget_total if args.time_budget_total is not None else o.budget_s,
        processes=args.processes, force=getattr(args, "force", False), submit=args.submit,
        from_results=from_results, after=after,
        cost_model=args.cost_model, megatron_memory_limit=mega_memory, megatron_micro_batch_size=list(s.megatron_mbs),
        op_group_size=o.op_group_size, peak_mem_in_backward=o.peak_mem_in_backward,
        finetune_after_trial=o.finetune_after_trial, sort_metric=o.sort_metric)


def cmd_reproduce(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso reproduce` (its options: cli.py)."""
    if args.log_path is None:
        args.log_path = Path("aceso-logs" if args.setting == "small" else "aceso-logs-large")
    if args.cost_model is None:
        args.cost_model = "runtime" if args.setting == "small" else "reference"
    if args.setting != "small" or args.profiled_time_path is not None:
        return _reproduce_search(args)
    root: Path = args.log_path
    if root.resolve().is_relative_to(Path(args.results).resolve()):
        raise ReproflowError(f"--log-path {root} is inside --results {args.results}: the profiles and runtime CSVs "
                             "would mix with the result rows. Put them beside it, e.g. --log-path aceso-logs.")
    targets = [t for t in SETTINGS["tiny" if args.sizes == "tiny" else "small"] if t.model in args.models]
    if args.train_iters is None:
        args.train_iters = 40 if args.sizes == "tiny" else 5
    if args.train_seconds is None:
        args.train_seconds = 10.0 if args.sizes == "tiny" else 0.0
    gpn, nodes = args.num_gpus_per_node or local_ranks(args), args.num_nodes
    tps = [t for t in (1, 2, 4, 8) if t <= gpn]
    shared = {"results": args.results, "dry_run": args.dry_run, "submit": args.submit, "image": args.image,
              "mounts": args.mounts, "force": False}
    mcore_impl = [] if args.no_megatron_core else ["megatron-core"]
    if mcore_impl:
        try:
            mcore.available()
        except ParamError as exc:
            print(f"the Megatron-LM plan runs on reproflow's layers only: {exc}")
            mcore_impl = []
    for t in targets:
        where = root / "aceso" / "search" / t.model / t.size
        print(f"==== {t.model} {t.size}: profile -> search -> train (Aceso and Megatron-LM) on {nodes} x {gpn} "
              f"{'GPUs' if args.submit else 'local ranks'} ====", flush=True)
        profiled = sorted(set(t.search.mbs) | set(t.megatron_mbs))
        prof = argparse.Namespace(**shared, after=[], prof_model_name=t.model, prof_model_size=t.size,
                                  prof_tp_size=tps, prof_mbs_list=profiled, prof_seq_len=t.seq_len,
                                  prof_warmup_times=2 if args.sizes == "tiny" else 3,
                                  prof_repeat_times=10,
                                  # tiny: 10 passes take under a second, shorter than this machine's slowdowns
                                  prof_repeat_seconds=2.0 if args.sizes == "tiny" else 0.0,
                                  # tiny: up to the tiny models' gradients (the runtime model's all-reduce)
                                  prof_comm_sizes="0-4,8,16,32" if args.sizes == "tiny" else "0-64",
                                  prof_path=root / "profiled-time")
        cmd_profile(prof)
        if args.dry_run:
            print(f"then: reproflow aceso search ... --config-save-path {where}; reproflow aceso train --config "
                  f"{where} --plan aceso megatron")
            continue
        search_args = _search_args(t, root / "profiled-time", where, nodes, gpn, args,
                                   [prof.submitted] if prof.submitted else [], args.results if args.submit else None)
        cmd_search(search_args)
        if args.until == "search":
            continue
        after = [getattr(search_args, "submitted", "")] if args.submit else []
        # The plan on reproflow's layers last: its training is the one the profile after it pairs with.
        for plan, impls in (("aceso", ["reproflow"]), ("megatron", [*mcore_impl, "reproflow"])):
            cmd_train(argparse.Namespace(**shared, config=[where], plan=[plan], num_nodes=nodes,
                                         num_gpus_per_node=gpn, train_iters=args.train_iters,
                                         train_seconds=args.train_seconds, seq_len=t.seq_len,
                                         dropout=0.1, log_path=root, tp_impl=impls, after=after))
            if not args.submit and (plan == "aceso" or _same_as_megatron(where)):
                profile_after_training(prof, search_args, args.train_iters, plan)
    if args.submit or args.dry_run:
        print(f"when the jobs are done: reproflow aceso e2e small --log-path {root} (and search-cost, perf-model-acc)")
        return 0
    for name in ("search-cost",) if args.until == "search" else ("e2e", "search-cost", "perf-model-acc"):
        cmd_results(argparse.Namespace(script=name, setting="small", log_path=root, out=args.out or root / "results",
                                       published=args.published))
    return 0


def _same_as_megatron(where: Path) -> bool:
    """Whether the newest search in `where` returned the Megatron-LM plan itself."""
    manifest = newest_manifest(where)
    return bool(manifest and json.loads(manifest.read_text()).get("same_as_megatron"))


def profile_after_training(prof: argparse.Namespace, search: argparse.Namespace, train_iters: int,
                           plan: str = "aceso") -> Path:
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

    setup = _Setup(search)
    path = resolve_config(search.config_save_path, plan)
    config = read_json(path, setup.model, setup.ops)
    ops = [(tp, dp, algo) for stage in config.stages for tp, dp, algo in zip(stage.tp, stage.dp, stage.algo,
                                                                              strict=True)]
    text = profile_suite(prof.prof_model_name, prof.prof_model_size, sorted({config.micro_bs // d for _, d, _ in ops}),
                         sorted({t for t, _, _ in ops}), prof.prof_seq_len, prof.prof_warmup_times,
                         prof.prof_repeat_times, prof.prof_comm_sizes, algos=sorted({a for _, _, a in ops}),
                         ranks=max(prof.prof_tp_size), groups=sorted({n for t, d, _ in ops for n in (t, d) if n > 1}),
                         p2p=len(config.stages) > 1, repeat_seconds=prof.prof_repeat_seconds)
    name = f"aceso-profile-{setup.model.file_stem}{AFTER_TRAINING}-{'' if plan == 'aceso' else plan + '-'}{train_iters}"
    api.run_generated_suite(text, name, placement(prof))
    after = Path(f"{prof.prof_path}{AFTER_TRAINING}")
    shutil.copytree(prof.prof_path, after, dirs_exist_ok=True)  # what was not profiled again
    rows = load_results(prof.results)
    write_from_rows(rows[rows["suite"].astype(str) == name], after, after_training=True)
    pred = _Setup(argparse.Namespace(**{**vars(search), "profiled_time_path": after})).cost.predict(config)
    info = search.config_save_path / "csv" / f"info_{path.stem}{AFTER_TRAINING}.csv"
    _stage_info(pred, info)
    print(f"{setup.name}: predicted from its ops profiled again right after training: {pred.iteration_ms:.2f} ms "
          f"({setup.cost.predict(config).iteration_ms:.2f} from the search's profile) -> {info}")
    return info


def local_ranks(args: argparse.Namespace) -> int:
    """Ranks per node when none are given: the artifact's 4 GPUs, or, for the tiny models on this machine,
    one rank per core (2 to 4). Ranks beyond the cores take turns on them, so an op's time depends on
    what the other ranks do at that moment, which no op profile can know: on 2 cores with 4 ranks the
    tiny models' predictions were 8 to 46 % off from run to run."""
    if args.sizes != "tiny" or args.submit:
        return 4
    ranks = max(2, min(4, len(os.sched_getaffinity(0))))
    print(f"tiny models on this machine: {ranks} local ranks, one per core (--num-gpus-per-node to choose)")
    return ranks


def _reproduce_search(args: argparse.Namespace) -> int:
    """large | scale: Aceso's search and the Megatron-LM plan for every model and size, then the tables."""
    rows = [s for s in SETTINGS[args.setting] if s.model in args.models or args.setting == "scale"]
    if args.setting == "small" and args.sizes == "tiny":
        raise ReproflowError("--profiled-time-path with the small setting searches the artifact's own models: add "
                             "--sizes reference (tiny models are profiled here, without --profiled-time-path).")
    if args.model_sizes:
        rows = [s for s in rows if s.label in args.model_sizes]
        missing = set(args.model_sizes) - {s.label for s in rows}
        if missing:
            known = ", ".join(s.label for s in SETTINGS[args.setting])
            raise ReproflowError(f"--model-sizes {' '.join(sorted(missing))}: not in the {args.setting} setting "
                                 f"(it has {known}).")
    if args.profiled_time_path is None or not args.profiled_time_path.is_dir():
        raise ReproflowError(f"--profiled-time-path {args.profiled_time_path}: not a folder. Give the profiled "
                             "database, e.g. the artifact's profiler/profiled-time-eurosys/.")
    root: Path = args.log_path
    if args.dry_run:
        for s in rows:
            o = s.search
            print(f"{s.model} {s.label}: {s.nodes} x {s.gpus_per_node} GPUs, global batch {s.global_bs}, "
                  + (f"the given single-GPU config (micro-batch {s.single_gpu[0]})" if s.single_gpu else
                     f"Aceso: {o.memory_limit:.0f} MB, micro-batches {list(o.mbs)}, {o.budget_s:g} s, {o.max_hops} "
                     f"hops; Megatron-LM plan: {s.megatron_memory_limit:.0f} MB, micro-batches {list(s.megatron_mbs)}"))
        return 0
    for s in rows:
        where = root / "aceso" / "search" / s.model / s.label
        print(f"==== {s.model} {s.label}: {s.nodes} x {s.gpus_per_node} GPUs, global batch {s.global_bs} ====",
              flush=True)
        if s.single_gpu is not None:
            _single_gpu_config(s, args.profiled_time_path, where, args.cost_model)
        else:
            cmd_search(_search_args(s, args.profiled_time_path, where, s.nodes, s.gpus_per_node, args, args.after))
        if args.artifact_configs is not None:
            _score_artifact(s, args, where)
    if args.submit:
        print(f"when the jobs are done: reproflow aceso predicted {args.setting} --log-path {root} "
              "(and search-cost)")
        return 0
    for name in ("predicted", "search-cost"):
        cmd_results(argparse.Namespace(script=name, setting=args.setting, log_path=root,
                                       out=args.out or root / "results", published=args.published))
    return 0


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


def _score_artifact(s: Setting, args: argparse.Namespace, where: Path) -> None:
    """The artifact's own search output for this size (its configs folder), scored with the reference
    model beside reproflow's: the best predicted iteration among its saved configs."""
    folder = args.artifact_configs / s.model / s.label
    files = sorted((folder / "top_configs").glob("*.json")) or sorted(folder.glob("*stages*.json"))
    if not files:
        print(f"no artifact configs under {folder}")
        return
    m = model(s.model, s.size, s.num_layers)
    db = read_database(args.profiled_time_path, m, list(s.search.mbs), m.max_tp(s.gpus_per_node))
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


def cmd_results(args: argparse.Namespace) -> int:
    """The work of `reproflow aceso results` (its options: cli.py)."""
    from reproflow.reporting.report import load_analysis

    analysis = load_analysis("aceso")
    assert analysis is not None
    log = args.log_path or Path("aceso-logs" if args.setting == "small" else "aceso-logs-large")
    out = args.out or log / "results"
    fn = {"e2e": analysis.e2e, "search-cost": analysis.search_cost, "perf-model-acc": analysis.perf_model_acc,
          "predicted": analysis.predicted}
    text = fn[args.script](log, args.setting, out, args.published)
    print(text or f"no {args.script} data under {log}: run `reproflow aceso reproduce` (or train) first")
    print(f"tables and figures: {out}")
    return 0
