"""`reproflow aceso profile | search | megatron | predict | database`: Aceso's tools, its option names.

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
from pathlib import Path

from reproflow.errors import ReproflowError
from reproflow.families.aceso.costmodel import Config, CostModel
from reproflow.families.aceso.database import read_database
from reproflow.families.aceso.models import Model, model
from reproflow.families.aceso.plans import best_feasible, megatron_plans, read_json, write_json
from reproflow.families.aceso.search import Options, Result, search
from reproflow.results import atomic_write


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
        path = args.config_save_path / f"{setup.name}_{setup.model.num_layers}layers_megatron_est_{int(ms)}.json"
        write_json(config, path)
        print(f"config: {path}")
    return 0 if config is not None else 1


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
    atomic_write(manifest, json.dumps({"database_sha256": db_hash, "options": options, "search_s": round(wall, 2),
                                       "configs": [f"{setup.name}_{r.num_stages}stages_{suffix}.json"
                                                   for r in found]}, indent=2, default=str) + "\n")
    line, _, mega_ms = _megatron_line(setup, args)
    print(line)
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
    return 0


def _stage_info(r: Result, path: Path) -> None:
    assert r.best is not None
    pred = r.best.pred
    lines = ["stage-index,time,memory(total),memory(normal),memory(reserved)"]
    for i, (t, m) in enumerate(zip(pred.pipeline_ms, pred.memory, strict=True)):
        lines.append(f"stage-{i},{t:.2f},{m.total:.2f},{m.total - m.reserved:.2f},{m.reserved:.2f}")
    atomic_write(path, "\n".join(lines) + "\n")


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
    """A suite (TOML) profiling every op per TP size, micro-batch and algo, plus collectives and P2P."""
    algos = [0] if model_name == "t5" else [0, 1]
    common = (f'model = "{model_name}", size = "{size}", seq_len = {seq_len}, warmup = {warmup}, '
              f"repeats = {repeats}")
    text = [f'[suite]\ndescription = "Aceso profile of {model_name} {size}: TP {tps}, micro-batches {mbs}"\n',
            '[launch]\nnodes = 1\ntime_limit = "04:00:00"\n']
    for tp in tps:
        text.append(f'[[experiment]]\nname = "tp{tp}"\nfamily = "aceso"\nlaunch = {{ procs_per_node = {tp} }}\n'
                    f"params = {{ {common} }}\nmatrix = {{ mbs = {mbs}, algo = {algos} }}\n")
    for tp in [t for t in tps if t > 1]:
        text.append(f'[[experiment]]\nname = "collectives-{tp}"\nfamily = "aceso"\n'
                    f"launch = {{ procs_per_node = {tp} }}\n"
                    f'params = {{ kind = "collectives", {common}, sizes_mb = "{comm_mb}" }}\n')
    if max(tps) > 1:
        text.append('[[experiment]]\nname = "p2p"\nfamily = "aceso"\nlaunch = { procs_per_node = 2 }\n'
                    f'params = {{ kind = "p2p", {common} }}\n')
    return "\n".join(text)


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile a model's ops (per TP size, micro-batch and algo), collectives and P2P here, then write the
    database: a suite is generated under --results, so reruns only profile what is missing."""
    from reproflow.cli import cmd_run

    stem = model(args.prof_model_name, args.prof_model_size).file_stem
    suite = args.results / f"aceso-profile-{stem}.toml"
    suite.parent.mkdir(parents=True, exist_ok=True)
    text = profile_suite(args.prof_model_name, args.prof_model_size, args.prof_mbs_list, args.prof_tp_size,
                         args.prof_seq_len, args.prof_warmup_times, args.prof_repeat_times, args.prof_comm_sizes)
    atomic_write(suite, text)
    run = argparse.Namespace(suite=str(suite), set=[], results=str(args.results), force=False, procs=None,
                             experiment=[], explain=False, dry_run=args.dry_run)
    code = cmd_run(run)
    if code or args.dry_run:
        return code
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


def register_cli(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Add `reproflow aceso ...`."""
    top = sub.add_parser("aceso", help="Aceso: profile, search, Megatron-LM plans, predictions",
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
    p.add_argument("--results", type=Path, default=Path("results"), help="where the profiler's rows go")
    p.add_argument("--dry-run", action="store_true", help="print the jobs, run nothing")
    p.set_defaults(func=cmd_profile)
    p = tools.add_parser("database", help="the profiler's rows as Aceso's database files",
                         formatter_class=formatter, description=cmd_database.__doc__)
    p.add_argument("--results", type=Path, default=Path("results"), help="results folder with profiler rows")
    p.add_argument("--out", type=Path, required=True, help="database folder to write")
    p.set_defaults(func=cmd_database)
    p = tools.add_parser("predict", help="per-stage time and memory of a config JSON",
                         formatter_class=formatter, description=cmd_predict.__doc__)
    _common(p)
    p.add_argument("--config", type=Path, required=True, help="config JSON")
    p.set_defaults(func=cmd_predict)
