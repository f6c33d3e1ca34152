"""`reproflow aceso profile | search | train | megatron | predict | database | reproduce | e2e |
search-cost | perf-model-acc`: Aceso's tools and result scripts, with the reference's option names.

Search and plan generation are CPU-only and read a profiled database in the reference's format
(`--profiled-time-path`). Outputs follow the reference: config JSON per pipeline depth, the best
ones under `top_configs/`, per-stage info CSVs under `csv/`, and a search-cost summary CSV.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reproflow.cli import generated_suite_options, run_generated_suite
from reproflow.errors import ParamError, ReproflowError
from reproflow.families.aceso import mcore
from reproflow.families.aceso.costmodel import Config, CostModel
from reproflow.families.aceso.database import read_database
from reproflow.families.aceso.models import Model, model
from reproflow.families.aceso.plans import best_feasible, megatron_plans, read_json, write_json
from reproflow.families.aceso.search import Options, Result, search
from reproflow.results import atomic_write
from reproflow.suite import suite_toml


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-name", required=True, choices=("gpt", "t5", "resnet", "scale-layer"))
    p.add_argument("--model-size", default="", help="e.g. 1_3B, 770M, 1B (scale-layer: none)")
    p.add_argument("--num-layers", type=int, default=None, help="default: the size's depth; required for scale-layer")
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--micro-batch-size", type=int, nargs="+", default=None,
                   help="profiled micro-batch sizes (default: 16 32 48 64 for resnet, else 1 2 4 8)")
    p.add_argument("--num-nodes", type=int, required=True)
    p.add_argument("--num-gpus-per-node", type=int, required=True)
    p.add_argument("--memory-limit", type=float, default=28000, help="MB per GPU")
    p.add_argument("--max-tp", type=int, default=None, help="default: GPUs per node (4 for GPT-350M)")
    p.add_argument("--start-num-stages", type=int, default=1)
    p.add_argument("--end-num-stages", type=int, default=None, help="default: min(GPUs, 16)")
    p.add_argument("--profiled-time-path", type=Path, required=True, help="the profiled database folder")
    p.add_argument("--config-save-path", type=Path, required=True, help="where config JSONs go")


class _Setup:
    """Model, database and cost model from the common options, with errors that name the option."""

    def __init__(self, args: argparse.Namespace) -> None:
        try:
            self.model: Model = model(args.model_name, args.model_size, args.num_layers)
        except ValueError as exc:
            raise ReproflowError(f"--model-name/--model-size/--num-layers: {exc}") from None
        self.mbs = args.micro_batch_size or ([16, 32, 48, 64] if args.model_name == "resnet" else [1, 2, 4, 8])
        self.gpus = args.num_nodes * args.num_gpus_per_node
        self.max_tp = args.max_tp or self.model.max_tp(args.num_gpus_per_node)
        self.db = read_database(args.profiled_time_path, self.model, self.mbs, self.max_tp)
        self.ops = self.model.full_op_list(self.db.ops)
        self.cost = CostModel(self.db, args.num_gpus_per_node, args.memory_limit)
        self.depths = range(args.start_num_stages, (args.end_num_stages or min(self.gpus, 16)) + 1)
        self.name = f"{self.model.name}_{self.model.size}"
        args.config_save_path.mkdir(parents=True, exist_ok=True)


def _megatron_line(setup: _Setup, args: argparse.Namespace) -> tuple[str, Config | None, float]:
    plans = megatron_plans(setup.cost, setup.ops, args.global_batch_size, setup.gpus, setup.max_tp, setup.depths)
    best = best_feasible(plans, args.memory_limit)
    if best is None:
        return "Megatron-LM uniform plans: none fits the memory limit", None, 0.0
    thpt = best.prediction.throughput(args.global_batch_size)
    return (f"Megatron-LM uniform plan: pp {best.pp} tp {best.tp} dp {best.dp} micro-batch {best.micro_bs} "
            f"recompute {'all' if best.recompute else 'none'}: {best.prediction.iteration_ms / 1000:.2f} s, "
            f"{thpt:.2f} samples/s, {best.prediction.max_memory:.0f} MB", best.config, best.prediction.iteration_ms)


def cmd_megatron(args: argparse.Namespace) -> int:
    """The fastest feasible uniform (pp, tp, dp, micro-batch, recompute) plan, as Aceso's JSON."""
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
               "time_budget_total")


def database_sha256(path: Path) -> str:
    """Content hash of a database folder: every CSV's name and bytes, in name order."""
    digest = hashlib.sha256()
    for f in sorted(Path(path).glob("*.csv")):
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def cmd_search(args: argparse.Namespace) -> int:
    """One search per pipeline depth in parallel; write the reference's outputs and compare with Megatron-LM.

    A search is keyed by the database's content hash and its options: a second search of the same
    database with the same options reuses the first one's configs (unless --force)."""
    if args.submit:
        return _submit_search(args)
    if args.from_results:
        from reproflow.families.aceso.database import write_from_rows
        from reproflow.report import load_results

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
                   args.memory_limit, setup.max_tp, args.max_num_hops, args.time_budget_total)
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
        _stage_info(r, csv_dir / f"info_{setup.name}_{r.num_stages}stages_{suffix}.csv")
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
    atomic_write(manifest, json.dumps({"database_sha256": db_hash, "options": options, "search_s": round(wall, 2),
                                       "configs": [f"{setup.name}_{r.num_stages}stages_{suffix}.json"
                                                   for r in found], "megatron": mega}, indent=2, default=str) + "\n")
    if found:
        best = found[0].best
        assert best is not None
        verdict = "at least as fast as" if mega_ms == 0 or best.time <= mega_ms else "SLOWER than"
        print(f"Aceso search: {best.time / 1000:.2f} s, {args.global_batch_size / (best.time / 1000):.2f} samples/s, "
              f"{best.memory:.0f} MB: {verdict} the uniform plan")
    return 0 if found else 1


def _search_job(argv: list[str]) -> int:
    """Body of a submitted search job: the same command without --submit."""
    from reproflow.cli import main

    code = main(["aceso", "search", *argv])
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
        flag = "--" + name.replace("_", "-")
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


def _stage_info(r: Result, path: Path) -> None:
    assert r.best is not None
    pred = r.best.pred
    lines = ["stage-index,time,memory(total),memory(normal),memory(reserved)"]
    for i, (t, m) in enumerate(zip(pred.pipeline_ms, pred.memory, strict=True)):
        lines.append(f"stage-{i},{t:.2f},{m.total:.2f},{m.total - m.reserved:.2f},{m.reserved:.2f}")
    atomic_write(path, "\n".join(lines) + "\n")


def cmd_megatron_lm(args: argparse.Namespace) -> int:
    """Megatron-LM itself on a uniform GPT plan (from `aceso megatron` or `aceso search`): print the
    torchrun command of its pretrain_gpt.py with the plan's tp, pp, per-DP-rank micro-batch, global
    batch, shape and recompute on mock data; with --run, run it (on a GPU node, in the megatron
    container) and write the iteration time as the reference's CSV under
    --log-path/megatron-lm/runtime/gpt/<size>/csv/."""
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
    """Per-stage time and memory of a config JSON (Aceso's or reproflow's)."""
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
                  repeats: int, comm_mb: str) -> str:
    """A suite (TOML) profiling every op per TP size, micro-batch and algo, plus collectives and P2P.
    Every op point runs on max(tps) ranks (one node's GPUs), as world / tp TP groups at once."""
    algos = [0] if model_name == "t5" else [0, 1]
    common = {"model": model_name, "size": size, "seq_len": seq_len, "warmup": warmup, "repeats": repeats}
    exps: list[dict[str, object]] = [
        {"name": f"tp{tp}", "family": "aceso", "launch": {"procs_per_node": max(tps)}, "params": common | {"tp": tp},
         "matrix": {"mbs": mbs, "algo": algos}} for tp in tps]
    exps += [{"name": f"collectives-{tp}", "family": "aceso", "launch": {"procs_per_node": tp},
              "params": {"kind": "collectives", **common, "sizes_mb": comm_mb}} for tp in tps if tp > 1]
    if max(tps) > 1:
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
    """Train config JSONs, or a search folder's best config and its Megatron-LM plan (--plan), with
    reproflow's runtime: here on gloo ranks, or on Slurm (--submit, after --after jobs). Writes the
    reference's per-rank CSVs under --log-path/{aceso,megatron}/runtime/<model>/<size>/csv/ and
    result rows under --results."""
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
            params = {"train_iters": args.train_iters, "seq_len": args.seq_len, "dropout": args.dropout,
                      "log_path": str(args.log_path.resolve()), "tp_impl": impl}
            name = f"aceso-train-{exp}" + ("-mcore" if impl == "megatron-core" else "")
            text = train_suite(name, [(exp, plan, config)], args.num_nodes, gpus // args.num_nodes, params)
            ids += run_generated_suite(text, name, args)
    args.submitted = ",".join(ids)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile a model's ops (per TP size, micro-batch and algo), collectives and P2P here, then write the
    database: a suite is generated under --results, so reruns only profile what is missing."""
    stem = model(args.prof_model_name, args.prof_model_size).file_stem
    text = profile_suite(args.prof_model_name, args.prof_model_size, args.prof_mbs_list, args.prof_tp_size,
                         args.prof_seq_len, args.prof_warmup_times, args.prof_repeat_times, args.prof_comm_sizes)
    args.submitted = ",".join(run_generated_suite(text, f"aceso-profile-{stem}", args))
    if args.dry_run or getattr(args, "submit", False):
        return 0
    args.from_results = args.results
    args.out = args.prof_path
    return cmd_database(args)


def cmd_database(args: argparse.Namespace) -> int:
    """Write the profiler's rows under --results as Aceso's database files."""
    from reproflow.families.aceso.database import write_from_rows
    from reproflow.report import load_results

    frame = load_results(args.from_results if getattr(args, "from_results", None) else args.results)
    if frame.empty or "aceso" not in set(frame["family"]):
        raise ReproflowError(f"no aceso profiler rows under {args.results}. Run a profile suite first, e.g. "
                             "`reproflow run aceso-profile-tiny`.")
    for path in write_from_rows(frame, args.out):
        print(path)
    return 0


@dataclass(frozen=True)
class Target:
    """One model of a setting: what the reference's scripts profile, search and train."""

    model: str
    size: str
    global_bs: int
    mbs: tuple[int, ...]
    seq_len: int = 0  # 0: the size's sequence (image side for Wide-ResNet)


# The reference's small setting (1 node x 4 GPUs, 12000 MB, 200 s of search), and the same three models
# shrunk to run on 4 CPU processes in minutes.
SMALL = {
    "reference": (Target("gpt", "1_3B", 512, (1, 2, 4, 8)), Target("t5", "770M", 512, (1, 2, 4, 8)),
                  Target("resnet", "1B", 768, (16, 32, 48, 64))),
    "tiny": (Target("gpt", "tiny", 16, (1, 2, 4, 8), 64), Target("t5", "tiny", 16, (1, 2, 4, 8), 64),
             Target("resnet", "tiny", 32, (4, 8, 16), 32)),
}


def cmd_reproduce(args: argparse.Namespace) -> int:
    """The reference's small setting end to end, one command: for each model, profile its ops,
    search configs, train the best config and the Megatron-LM uniform plan with the same runtime
    (the plan also on megatron-core's tensor-parallel layers where megatron-core is installed), then
    print the end-to-end, search-cost and performance-model tables. With --submit the three
    steps of each model are Slurm jobs chained with afterok dependencies; run the result scripts
    (`reproflow aceso e2e small` ...) when they have finished."""
    root: Path = args.log_path
    if root.resolve().is_relative_to(Path(args.results).resolve()):
        raise ReproflowError(f"--log-path {root} is inside --results {args.results}: the profiles and runtime CSVs "
                             "would mix with the result rows. Put them beside it, e.g. --log-path aceso-logs.")
    targets = [t for t in SMALL[args.sizes] if t.model in args.models]
    budget = args.time_budget_total if args.time_budget_total is not None else (5 if args.sizes == "tiny" else 200)
    gpn, nodes = args.num_gpus_per_node, args.num_nodes
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
        prof = argparse.Namespace(**shared, after=[], prof_model_name=t.model, prof_model_size=t.size,
                                  prof_tp_size=tps, prof_mbs_list=list(t.mbs), prof_seq_len=t.seq_len,
                                  prof_warmup_times=2 if args.sizes == "tiny" else 3,
                                  prof_repeat_times=5 if args.sizes == "tiny" else 10,
                                  prof_comm_sizes="0-4" if args.sizes == "tiny" else "0-64",
                                  prof_path=root / "profiled-time")
        cmd_profile(prof)
        if args.dry_run:
            print(f"then: reproflow aceso search ... --config-save-path {where}; reproflow aceso train --config "
                  f"{where} --plan aceso megatron")
            continue
        search_args = argparse.Namespace(
            model_name=t.model, model_size=t.size, num_layers=None, global_batch_size=t.global_bs,
            micro_batch_size=list(t.mbs), num_nodes=nodes, num_gpus_per_node=gpn, memory_limit=args.memory_limit,
            max_tp=None, start_num_stages=1, end_num_stages=None, profiled_time_path=root / "profiled-time",
            config_save_path=where, max_num_hops=7, time_budget_total=budget, num_of_saved_configs=1,
            log_path=None, config_suffix="", processes=0, force=False, submit=args.submit,
            from_results=args.results if args.submit else None,
            after=[prof.submitted] if prof.submitted else [])
        cmd_search(search_args)
        if args.until == "search":
            continue
        after = [getattr(search_args, "submitted", "")] if args.submit else []
        for plan, impls in (("aceso", ["reproflow"]), ("megatron", ["reproflow", *mcore_impl])):
            cmd_train(argparse.Namespace(**shared, config=[where], plan=[plan], num_nodes=nodes,
                                         num_gpus_per_node=gpn, train_iters=args.train_iters, seq_len=t.seq_len,
                                         dropout=0.1, log_path=root, tp_impl=impls, after=after))
    if args.submit or args.dry_run:
        print(f"when the jobs are done: reproflow aceso e2e small --log-path {root} (and search-cost, perf-model-acc)")
        return 0
    for name in ("search-cost",) if args.until == "search" else ("e2e", "search-cost", "perf-model-acc"):
        cmd_results(argparse.Namespace(script=name, setting="small", log_path=root, out=args.out or root / "results",
                                       published=args.published))
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    """The reference's result scripts: tables printed and written as CSVs, and the paper's figure."""
    from reproflow.paths import project_root
    from reproflow.report import load_analysis

    analysis = load_analysis(project_root(), "aceso")
    assert analysis is not None
    log = args.log_path or Path("aceso-logs" if args.setting == "small" else "aceso-logs-large")
    out = args.out or log / "results"
    fn = {"e2e": analysis.e2e, "search-cost": analysis.search_cost, "perf-model-acc": analysis.perf_model_acc}
    text = fn[args.script](log, args.setting, out, args.published)
    print(text or f"no {args.script} data under {log}: run `reproflow aceso reproduce` (or train) first")
    print(f"tables and figures: {out}")
    return 0


def register_cli(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Add `reproflow aceso ...`."""
    top = sub.add_parser("aceso", help="Aceso: profile, search, train, Megatron-LM plans, result scripts",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tools = top.add_subparsers(dest="aceso_command", required=True, metavar="TOOL")
    p = tools.add_parser("search", help="iterative bottleneck alleviation, one search per pipeline depth",
                         formatter_class=formatter, description=cmd_search.__doc__)
    _common(p)
    p.add_argument("--max-num-hops", type=int, default=7)
    p.add_argument("--time-budget-total", type=float, default=10, help="seconds per pipeline depth")
    p.add_argument("--num-of-saved-configs", type=int, default=1)
    p.add_argument("--log-path", type=Path, default=None, help="summary CSV folder (default: --config-save-path)")
    p.add_argument("--config-suffix", default="", help="file-name suffix (default: the start time)")
    p.add_argument("--processes", type=int, default=0, help="parallel searches (default: one per depth)")
    p.add_argument("--from-results", type=Path, default=None,
                   help="first write the database at --profiled-time-path from these profiler results")
    p.add_argument("--force", action="store_true", help="search again even if this database and these options "
                   "were searched before")
    p.add_argument("--submit", action="store_true", help="run as a CPU-only Slurm job (through submitit)")
    p.add_argument("--after", action="append", default=[], metavar="JOBID",
                   help="with --submit: start after these jobs succeed (e.g. the profile jobs)")
    p.set_defaults(func=cmd_search)
    p = tools.add_parser("megatron", help="the fastest feasible Megatron-LM uniform plan",
                         formatter_class=formatter, description=cmd_megatron.__doc__)
    _common(p)
    p.set_defaults(func=cmd_megatron)
    p = tools.add_parser("profile", help="profile a model's ops, collectives and P2P here and write the database",
                         formatter_class=formatter, description=cmd_profile.__doc__)
    p.add_argument("--prof-model-name", required=True, choices=("gpt", "t5", "resnet", "scale-layer"))
    p.add_argument("--prof-model-size", required=True, help="e.g. tiny, 1_3B, 770M, 1B, scale-layer")
    p.add_argument("--prof-tp-size", type=int, nargs="+", default=[1, 2], help="TP sizes (local ranks each)")
    p.add_argument("--prof-mbs-list", type=int, nargs="+", default=[1, 2, 4, 8], help="micro-batch sizes")
    p.add_argument("--prof-seq-len", type=int, default=0, help="sequence length or image side; 0: the size's")
    p.add_argument("--prof-warmup-times", type=int, default=3)
    p.add_argument("--prof-repeat-times", type=int, default=10)
    p.add_argument("--prof-comm-sizes", default="0-64", help="collective sizes in whole MB, e.g. '0-16,32'")
    p.add_argument("--prof-path", type=Path, required=True, help="database folder to write")
    generated_suite_options(p)
    p.set_defaults(func=cmd_profile)
    p = tools.add_parser("database", help="the profiler's rows as Aceso's database files",
                         formatter_class=formatter, description=cmd_database.__doc__)
    p.add_argument("--results", type=Path, default=Path("results"), help="results folder with profiler rows")
    p.add_argument("--out", type=Path, required=True, help="database folder to write")
    p.set_defaults(func=cmd_database)
    p = tools.add_parser("train", help="train config JSONs with reproflow's runtime (here or on Slurm)",
                         formatter_class=formatter, description=cmd_train.__doc__)
    p.add_argument("--config", type=Path, nargs="+", required=True,
                   help="config JSONs, or a search's --config-save-path (its best config / Megatron-LM plan)")
    p.add_argument("--plan", nargs="+", choices=("aceso", "megatron"), default=["aceso"],
                   help="for a search folder: which configs to train; for a file: its runtime column")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--num-gpus-per-node", type=int, default=0, help="ranks per node (default: the config's GPUs)")
    p.add_argument("--train-iters", type=int, default=5, help="iterations (then one more with op timers)")
    p.add_argument("--seq-len", type=int, default=0, help="sequence length or image side the database used")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--log-path", type=Path, default=Path("aceso-logs"), help="root of the runtime CSVs")
    p.add_argument("--tp-impl", nargs="+", choices=("reproflow", "megatron-core"), default=["reproflow"],
                   help="tensor-parallel linear layers: reproflow's and/or megatron-core's (one run each)")
    generated_suite_options(p)
    p.set_defaults(func=cmd_train)
    p = tools.add_parser("reproduce", help="profile -> search -> train -> tables, one command (small setting)",
                         formatter_class=formatter, description=cmd_reproduce.__doc__)
    p.add_argument("setting", choices=("small",), help="the reference's setting")
    p.add_argument("--sizes", choices=tuple(SMALL), default="tiny",
                   help="tiny: the three models shrunk for CPUs; reference: GPT-1.3B, T5-770M, WRN-1B (GPUs)")
    p.add_argument("--models", nargs="+", choices=("gpt", "t5", "resnet"), default=["gpt", "t5", "resnet"])
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--num-gpus-per-node", type=int, default=4)
    p.add_argument("--memory-limit", type=float, default=12000, help="MB per GPU")
    p.add_argument("--time-budget-total", type=float, default=None, help="search seconds per depth (default: "
                   "200, as the reference; 5 for tiny)")
    p.add_argument("--train-iters", type=int, default=5)
    p.add_argument("--until", choices=("search", "train"), default="train",
                   help="search: profile and search only (figure 8, search cost); train: also train (figures 7, 9)")
    p.add_argument("--log-path", type=Path, default=Path("aceso-logs"), help="root of profiles, configs, CSVs")
    p.add_argument("--published", type=Path, default=None, help="the artifact's results/ref/ CSVs, drawn beside")
    p.add_argument("--out", type=Path, default=None, help="tables and figures (default: <log-path>/results)")
    p.add_argument("--no-megatron-core", action="store_true",
                   help="train the Megatron-LM plan on reproflow's layers only (default: also on megatron-core's)")
    generated_suite_options(p)
    p.set_defaults(func=cmd_reproduce)
    for name, what in (("e2e", "end-to-end throughput (figure 7)"), ("search-cost", "search cost (figure 8)"),
                       ("perf-model-acc", "time and memory prediction accuracy (figure 9)")):
        p = tools.add_parser(name, help=f"the reference's result script: {what}", formatter_class=formatter,
                             description=cmd_results.__doc__)
        p.add_argument("setting", choices=("small", "large", "scale"))
        p.add_argument("--log-path", type=Path, default=None,
                       help="log root (default: aceso-logs for small, aceso-logs-large otherwise)")
        p.add_argument("--out", type=Path, default=None, help="tables and figures (default: <log-path>/results)")
        p.add_argument("--published", type=Path, default=None,
                       help="the artifact's results/ref/ CSVs (published numbers drawn beside)")
        p.set_defaults(func=cmd_results, script=name)
    p = tools.add_parser("megatron-lm", help="Megatron-LM's own pretrain_gpt.py on a uniform plan (GPU nodes)",
                         formatter_class=formatter, description=cmd_megatron_lm.__doc__)
    p.add_argument("--config", type=Path, required=True, help="a uniform GPT plan JSON")
    p.add_argument("--megatron-dir", type=Path, default=Path("/opt/Megatron-LM"), help="Megatron-LM checkout")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--train-iters", type=int, default=5)
    p.add_argument("--log-path", type=Path, default=Path("aceso-logs"), help="root of the runtime CSVs")
    p.add_argument("--run", action="store_true", help="run it (default: print the command)")
    p.set_defaults(func=cmd_megatron_lm)
    p = tools.add_parser("predict", help="per-stage time and memory of a config JSON",
                         formatter_class=formatter, description=cmd_predict.__doc__)
    _common(p)
    p.add_argument("--config", type=Path, required=True, help="config JSON")
    p.set_defaults(func=cmd_predict)
