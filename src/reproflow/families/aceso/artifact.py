"""The artifact's experiments, one command each (`reproflow aceso reproduce small|large|scale` and the
result scripts): each row of its settings (settings.py) through pipeline.py's steps, with its own
options, then the reference's tables and figures (the family's `report` module).

small: profile -> search -> train on this machine's ranks (or submitted), the Megatron-LM plan
trained beside Aceso's config, and each trained config's ops profiled again right after its
training. large and scale: the search and the plan on a profiled database (the artifact's).
"""


from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from reproflow import api
from reproflow.api import Placement
from reproflow.families.aceso import mcore
from reproflow.families.aceso.baseline import (
    ROLES,
    SCREEN,
    confirm_trainings,
    order_seed,
    say,
    screen_trainings,
    select,
    select_job,
    turns_suite,
)
from reproflow.families.aceso.costmodel import CostModel
from reproflow.families.aceso.database import AFTER_TRAINING, read_database, write_from_rows
from reproflow.families.aceso.manifest import depth_name, newest_manifest, resolve_config
from reproflow.families.aceso.models import Model, model
from reproflow.families.aceso.pipeline import (
    SEARCH_KEYS,
    ProfileRequest,
    SearchRequest,
    Setup,
    depths_of,
    grid_names,
    op_info,
    profile,
    profile_suite,
    search,
    stage_info,
)
from reproflow.families.aceso.plans import megatron_plans, read_json, write_json
from reproflow.families.aceso.search import budget_text
from reproflow.families.aceso.settings import SETTINGS, TINY_PROFILE_ROUNDS, TINY_TIE_RESOLUTION, Setting
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.store.files import atomic_write


@dataclass(frozen=True, kw_only=True)
class ReproduceRequest:
    """One of the artifact's settings (`aceso reproduce`); None: the setting's own default."""

    setting: str
    sizes: str = "tiny"
    models: tuple[str, ...] = ("gpt", "t5", "resnet", "gpt-memory")
    model_sizes: tuple[str, ...] = ()
    profiled_time_path: Path | None = None
    artifact_configs: Path | None = None
    cost_model: str | None = None
    num_nodes: int = 0
    num_gpus_per_node: int = 0
    network: str | None = None
    memory_limit: float | None = None
    budget_cases: int | None = None
    time_budget_total: float | None = None
    processes: int = 0
    train_iters: int | None = None
    train_seconds: float | None = None
    train_rounds: int | None = None
    screen_iters: int | None = None
    global_batch_size: int | None = None
    until: str = "train"
    log_path: Path | None = None
    published: Path | None = None
    out: Path | None = None
    no_megatron_core: bool = False


def _search_request(s: Setting, db: Path, where: Path, nodes: int, gpus_per_node: int, req: ReproduceRequest,
                    cost_model: str, force: bool = False, from_results: Path | None = None,
                    grid: bool = False) -> SearchRequest:
    """The search of one row of the artifact's settings (with the reproduce request's overrides); `grid`:
    write every Megatron-LM plan worth training, uneven first and last stages too, for the screen."""
    o = s.search
    return SearchRequest(
        model_name=s.model, model_size=s.size, num_layers=s.num_layers, global_batch_size=s.global_bs,
        micro_batch_size=o.mbs, num_nodes=nodes, num_gpus_per_node=gpus_per_node,
        memory_limit=req.memory_limit if req.memory_limit is not None else o.memory_limit,
        profiled_time_path=db, config_save_path=where, max_num_hops=o.max_hops,
        num_of_saved_configs=o.saved_configs,
        budget_cases=req.budget_cases or o.budget_cases, time_budget_total=req.time_budget_total,
        processes=req.processes, force=force, from_results=from_results, cost_model=cost_model,
        megatron_memory_limit=req.memory_limit if req.memory_limit is not None else s.megatron_memory_limit,
        megatron_micro_batch_size=s.megatron_mbs, op_group_size=o.op_group_size,
        peak_mem_in_backward=o.peak_mem_in_backward, finetune_after_trial=o.finetune_after_trial,
        sort_metric=o.sort_metric, megatron_grid=grid, memory_pressure=s.case == "memory",
        tie_resolution=TINY_TIE_RESOLUTION if s.size == "tiny" else 0.0)


def reproduce(req: ReproduceRequest, where: Placement) -> None:
    """One of the artifact's settings, one command, with the artifact's own settings for every model.

    small: for each model, profile its ops, search configs, measure the Megatron-LM baseline where the
    setting asks (baseline.py: every plan screened, the fastest that fits taken), train Aceso's config
    and the baseline with the same runtime in ABBA rounds in one job (the plan also on megatron-core's
    tensor-parallel layers where installed), then the reference's result scripts (figures 7, 8, 9).
    large and scale: the search and the plan on a profiled database (the artifact's), then the predicted
    throughput and search cost."""
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
    targets = [t for t in SETTINGS["tiny" if tiny else "small"] if t.selector in req.models]
    if req.global_batch_size is not None:
        targets = [replace(t, global_bs=_global_batch(t, req.global_batch_size)) for t in targets]
    # tiny: the two configs in four rounds, ABBA, so the ratio's interval spans the machine's drift
    # between trainings (docs/aceso-results.md); each training 6 iterations, the first untimed (baseline.SCREEN
    # says why one is enough on CPUs; the reference sizes, on GPUs, leave 2 out)
    rounds = req.train_rounds if req.train_rounds is not None else (4 if tiny else 1)
    if rounds < 1:
        raise ReproflowError(f"--train-rounds {rounds}: each config trains at least once; give 1 or more.")
    train_iters = req.train_iters if req.train_iters is not None else (6 if tiny else 5)
    warmup_iters = 1 if tiny else 2
    train_seconds = req.train_seconds if req.train_seconds is not None else 0.0
    here = replace(where.following(()), force=False)
    mcore_impl: tuple[str, ...] = () if req.no_megatron_core else ("megatron-core",)
    if mcore_impl:
        try:
            mcore.available()
        except ParamError as exc:
            print(f"the Megatron-LM plan runs on reproflow's layers only: {exc}")
            mcore_impl = ()
    links: set[tuple[int, str]] = set()  # (hosts, network) whose P2P this run has measured
    for t in targets:
        folder = root / "aceso" / "search" / t.model / t.label
        nodes, gpn = req.num_nodes or t.nodes, req.num_gpus_per_node or t.gpus_per_node
        tps = tuple(x for x in (1, 2, 4, 8) if x <= gpn)
        # Slurm's nodes have their own network; here nodes are emulated hosts with a shaped link.
        network = "" if where.submit or nodes == 1 else (t.network if req.network is None else req.network)
        steps = "profile -> search" if req.until == "search" else "profile -> search -> train (Aceso and Megatron-LM)"
        print(f"==== {t.model} {t.label}: {steps} on {nodes} x {gpn} "
              f"{'GPUs' if where.submit else 'local ranks'}{f', {network} between hosts' if network else ''} ====",
              flush=True)
        prof = ProfileRequest(prof_model_name=t.model, prof_model_size=t.size, prof_tp_size=tps,
                              prof_mbs_list=tuple(sorted(set(t.search.mbs) | set(t.megatron_mbs))),
                              prof_seq_len=t.seq_len, prof_warmup_times=2 if tiny else 3, prof_repeat_times=10,
                              # tiny: 10 passes take under a second, shorter than this machine's slowdowns
                              prof_repeat_seconds=2.0 if tiny else 0.0,
                              prof_rounds=TINY_PROFILE_ROUNDS if tiny else 1,
                              # tiny: up to the tiny models' gradients (the runtime model's all-reduce)
                              prof_comm_sizes="0-4,8,16,32" if tiny else "0-64",
                              prof_path=root / "profiled-time", prof_num_nodes=nodes, network=network,
                              # One link, measured once a run here: the models share the database's P2P
                              # tables (submitted, each model's jobs measure it, as they may run at once).
                              prof_p2p=bool(where.submit) or (nodes, network) not in links)
        links.add((nodes, network))
        profiled = profile(prof, here)
        if where.dry_run:
            budget = budget_text(req.budget_cases or t.search.budget_cases, req.time_budget_total)
            train = "" if req.until == "search" else f"; reproflow aceso train --config {folder} --plan aceso megatron"
            print(f"then: reproflow aceso search ... --config-save-path {folder} (budget {budget}){train}")
            continue
        # Trained here, every size's baseline is the fastest plan of the grid as measured (the artifact's
        # scripts take the uniform plan its model predicts fastest: the search-only path below keeps that).
        search_req = _search_request(t, root / "profiled-time", folder, nodes, gpn, req, req.cost_model,
                                     from_results=where.results if where.submit else None, grid=True)
        searched = search(search_req, here.following(profiled))
        if req.until == "search":
            continue
        after: tuple[str, ...] = (searched.job_id,) if where.submit else ()
        label = f"{t.model}-{t.label}"
        params = {"seq_len": t.seq_len, "dropout": 0.1, "log_path": str(root.resolve()), "case": t.case}
        launch = {"nodes": nodes, "gpus_per_node": gpn, "network": network}
        screen = {**SCREEN, **({"train_iters": req.screen_iters} if req.screen_iters else {})}
        after = _measure_baseline(search_req, label, {**params, **screen}, launch, here.following(after))
        # Each side's measured and predicted picks in turns, in one job (the Megatron-LM plan once more on
        # megatron-core's layers first, where installed); run here, each by its JSON, so that the points
        # of another search's configs are never taken for these.
        name = f"aceso-train-{label}"
        configs = None if where.submit else {(p, k): resolve_config(folder, p, pick=k) for p, k in ROLES}
        text = turns_suite(name, f"Aceso's configs and the Megatron-LM plans of {label} (measured and predicted "
                           f"picks) in {rounds} round(s), in turns",
                           folder, confirm_trainings(rounds, bool(mcore_impl), configs), nodes, gpn,
                           {**params, "train_iters": train_iters, "train_seconds": train_seconds,
                            "warmup_iters": warmup_iters}, network)
        trained = api.run_generated_suite(text, name, here.following(after))
        profile_after_training(prof, search_req, ("aceso", "megatron"), label, here.following(trained))
    if where.submit or where.dry_run:
        print(f"when the jobs are done: reproflow aceso e2e small --log-path {root} (and search-cost, perf-model-acc)")
        return
    for name in ("search-cost",) if req.until == "search" else ("e2e", "search-cost", "perf-model-acc"):
        results(name, "small", root, req.out or root / "results", req.published)


def _global_batch(s: Setting, batch: int) -> int:
    """`--global-batch-size` for one model, checked: every micro-batch its search and grid try divides it."""
    sizes = sorted(set(s.search.mbs) | set(s.megatron_mbs))
    step = math.lcm(*sizes)
    if batch % step:
        raise ReproflowError(f"--global-batch-size {batch}: {s.model}'s micro-batches {', '.join(map(str, sizes))} "
                             f"must each divide it; give a multiple of {step} (e.g. {max(1, batch // step) * step}).")
    return batch


def _measure_baseline(req: SearchRequest, label: str, params: dict[str, object], launch: dict[str, object],
                      where: Placement) -> tuple[str, ...]:
    """The screen of every Megatron-LM plan worth training and Aceso's config, then the selection of
    the fastest measured (baseline.py); submitted, the selection is a job after the screen's, and the
    screen names the grid's every plan (those its search does not write are not applicable). Returns
    the job ids the next step waits for."""
    folder = req.config_save_path
    aceso: list[dict[str, object]]
    if where.submit:
        grid = grid_names(req)
        aceso = [{"grid_plan": depth_name(k)} for k in depths_of(req)]
    else:
        manifest = newest_manifest(folder)
        assert manifest is not None
        done = json.loads(manifest.read_text())
        grid = [g["name"] for g in done.get("megatron_grid") or ()]
        aceso = [{"config": folder / n} for n in done["configs"]]
    options = {k: getattr(req, k) for k in SEARCH_KEYS}
    name = f"aceso-screen-{label}"
    text = turns_suite(name, f"every Megatron-LM plan of {label} and every config of Aceso's, once each, shuffled",
                       folder, screen_trainings(grid, aceso, order_seed(options)),
                       int(launch["nodes"]),  # type: ignore[call-overload]
                       int(launch["gpus_per_node"]), params, str(launch["network"]))  # type: ignore[call-overload]
    ids = api.run_generated_suite(text, name, where)
    if where.submit:
        job = api.submit_call("aceso-baseline", select_job, where.results.resolve(), folder.resolve(), name,
                              folder=folder.resolve() / "submitit", minutes=10, where=where.following(ids))
        print(f"submitted the choice of the Megatron-LM baseline as Slurm job {job}, after the screen")
        print(f"job ids: {job}")
        return (job,)
    from reproflow.reporting.report import load_results

    print(say(select(load_results(where.results), folder, name)), flush=True)
    return ()


def profile_after_training(prof: ProfileRequest, search_req: SearchRequest, plans: tuple[str, ...], label: str,
                           where: Placement) -> tuple[str, ...]:
    """Profile the ops of the configs of `plans` just trained again, at once, in one job, and predict each
    from that profile too (`info_<config>-after-training.csv` beside the search's `info_<config>.csv`):
    ranks sharing a machine run at a speed that drifts over minutes, and the search's profile is minutes
    before the training. Here only what the configs use is profiled (their ops' TP sizes, micro-batches
    and algos on as many ranks as before, the collectives of their TP and DP groups within a node);
    submitted, the configs do not exist yet when the jobs are, so every op the search's profile took is
    profiled again, and the predictions are a job after it. Either way into a database of this profile
    and the search's for the rest (its P2P link among them: a link does not drift as a shared CPU does).
    Once per case: rounds added later (a claim asking for more) reuse it. Returns the submitted job ids."""
    mbs, tps = list(prof.prof_mbs_list), list(prof.prof_tp_size)
    algos: list[int] | None = None  # None: the model's every algo, the collectives of every TP size
    groups: list[int] | None = None
    if not where.submit:
        setup = Setup(search_req)
        configs = [read_json(resolve_config(search_req.config_save_path, p), setup.model, setup.ops) for p in plans]
        ops = [(c.micro_bs, tp, dp, algo) for c in configs for stage in c.stages
               for tp, dp, algo in zip(stage.tp, stage.dp, stage.algo, strict=True)]
        mbs, tps = sorted({m // d for m, _, d, _ in ops}), sorted({t for _, t, _, _ in ops})
        algos = sorted({a for *_, a in ops})
        # groups across nodes are priced from the P2P link, not a collectives table
        groups = sorted({n for _, t, d, _ in ops for n in (t, d) if 1 < n <= max(prof.prof_tp_size)})
    text = profile_suite(prof.prof_model_name, prof.prof_model_size, mbs, tps, prof.prof_seq_len,
                         prof.prof_warmup_times, prof.prof_repeat_times, prof.prof_comm_sizes, algos=algos,
                         ranks=max(prof.prof_tp_size), repeat_seconds=prof.prof_repeat_seconds, groups=groups,
                         p2p=False, nodes=prof.prof_num_nodes, network=prof.network, rounds=prof.prof_rounds)
    ids = api.run_generated_suite(text, f"aceso-profile-{label}{AFTER_TRAINING}", where)
    if not where.submit:
        predict_after_training(where.results, prof.prof_path, search_req, plans, label)
        return ()
    absolute = replace(search_req, profiled_time_path=search_req.profiled_time_path.resolve(),
                       config_save_path=search_req.config_save_path.resolve(),
                       log_path=search_req.log_path.resolve() if search_req.log_path else None, from_results=None)
    job = api.submit_call("aceso-predict-again", predict_after_training, where.results.resolve(),
                          prof.prof_path.resolve(), absolute, plans, label,
                          folder=absolute.config_save_path / "submitit", minutes=10,
                          where=where.following(ids) if ids else where)
    print(f"submitted the predictions from the ops profiled again as Slurm job {job}, after the profile")
    print(f"job ids: {job}")
    return (job,)


def predict_after_training(results: Path, prof_path: Path, search_req: SearchRequest, plans: tuple[str, ...],
                           label: str) -> list[Path]:
    """The configs of `plans` predicted from their ops profiled again after training (the rows of suite
    aceso-profile-<label>-after-training, over a copy of the search's database); the info CSVs and each op's
    predictions from both profiles (`ops_<config>.csv`) written."""
    from reproflow.reporting.report import load_results

    setup = Setup(search_req)
    paths = [resolve_config(search_req.config_save_path, plan) for plan in plans]
    after = Path(f"{prof_path}{AFTER_TRAINING}-{label}")
    shutil.copytree(prof_path, after, dirs_exist_ok=True)  # what was not profiled again
    rows = load_results(results)
    write_from_rows(rows[rows["suite"].astype(str) == f"aceso-profile-{label}{AFTER_TRAINING}"], after,
                    after_training=True)
    again = Setup(replace(search_req, profiled_time_path=after)).cost
    written = []
    for path in paths:
        config = read_json(path, setup.model, setup.ops)
        pred = again.predict(config)
        info = search_req.config_save_path / "csv" / f"info_{path.stem}{AFTER_TRAINING}.csv"
        stage_info(pred, info)
        ops = info.with_name(f"ops_{path.stem}.csv")
        op_info(config, {"predicted": setup.cost, "after_training": again}, ops)
        written += [info, ops]
        print(f"{path.stem}: predicted from its ops profiled again right after training: {pred.iteration_ms:.2f} ms "
              f"({setup.cost.predict(config).iteration_ms:.2f} from the search's profile) -> {info}")
    return written


def _reproduce_search(req: ReproduceRequest, where: Placement) -> None:
    """large | scale: Aceso's search and the Megatron-LM plan for every model and size, then the tables."""
    assert req.log_path is not None and req.cost_model is not None
    if req.global_batch_size is not None:
        raise ReproflowError(f"--global-batch-size {req.global_batch_size}: the searches on a profiled database keep "
                             "the artifact's batch, to compare with its published results; leave it out (it is for "
                             "the small setting profiled and trained here).")
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
                     f"Aceso: {o.memory_limit:.0f} MB, micro-batches {list(o.mbs)}, budget "
                     f"{budget_text(req.budget_cases or o.budget_cases, req.time_budget_total)}, {o.max_hops} "
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
    from reproflow.families.aceso import report  # matplotlib and pandas: only where the tables are made

    log = log_path or Path("aceso-logs" if setting == "small" else "aceso-logs-large")
    out = out or log / "results"
    fn = {"e2e": report.e2e, "search-cost": report.search_cost, "perf-model-acc": report.perf_model_acc,
          "predicted": report.predicted}
    text = fn[script](log, setting, out, published)
    print(text or f"no {script} data under {log}: run `reproflow aceso reproduce` (or train) first")
    print(f"tables and figures: {out}")
    return str(text or "")
