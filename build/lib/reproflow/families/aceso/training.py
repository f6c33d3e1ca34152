"""Aceso's runtime, training a config JSON (the reference's format) with real torch.distributed:
the checks of a point, the timed iterations, and the reference's CSVs.

Every rank writes the reference's per-stage CSV,
`{log_path}/{plan}/runtime/{model}/{size}/csv/{config}_stage{s}_rank{r}.csv` (plan `megatron-mcore`
for a run on megatron-core's layers; `{size}-{case}` for a case of its own):
global batch, iteration time (ms, the median of the timed iterations), stage timers (ms), per-op
forward timers (us per micro-batch, from one extra instrumented iteration), memory (MB). On GPUs
memory is the CUDA allocator's; on CPU, which has no caching allocator to ask, it is accounted:
weights, gradients and optimizer state plus the peak of the activations autograd keeps for in-flight
micro-batches (`reserved` = `max_allocated`). The layout is layout.py's, a stage's work stage.py's.
"""

from __future__ import annotations

import csv
import gc
import io
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from reproflow.families.aceso import mcore
from reproflow.families.aceso.layout import MB, Groups, check_shapes, load_config
from reproflow.families.aceso.manifest import predicted, resolve_config
from reproflow.families.aceso.plans import config_digest
from reproflow.families.aceso.stage import Stage, Timers
from reproflow.families.aceso.tp import Env, Group, OpDef
from reproflow.rank.context import RunContext
from reproflow.rank.memory import keep_freed_memory
from reproflow.spec.errors import ParamError
from reproflow.spec.family import Measurement
from reproflow.store.files import atomic_write


def flops_per_micro_batch(ops: list[OpDef]) -> float:
    """Forward FLOPs of one micro-batch through the whole, unpartitioned model: matmuls and
    convolutions counted by torch's FlopCounterMode on meta tensors."""
    meta = torch.device("meta")
    tp = Group()
    total = 0.0
    for op in ops:
        weights = {k: torch.empty(w.shape, device=meta) for k, w in op.weights.items()}
        xs = [torch.empty(a.shape, device=meta) for a in op.ins]
        data = {k: torch.zeros(a.shape, dtype=torch.long if a.high else torch.float32, device=meta)
                for k, a in op.data.items()}
        with FlopCounterMode(display=False) as counter:
            op.forward(Env(tp, data.__getitem__, 0.0), weights, *xs)
        total += counter.get_total_flops()
    return float(total)


def _memory_mb(ctx: RunContext, stage: Stage) -> dict[str, float]:
    if ctx.device.type == "cuda":
        return {"allocated": torch.cuda.memory_allocated(ctx.device) / MB,
                "max_allocated": torch.cuda.max_memory_allocated(ctx.device) / MB,
                "reserved": torch.cuda.memory_reserved(ctx.device) / MB,
                "max_reserved": torch.cuda.max_memory_reserved(ctx.device) / MB}
    fixed = sum(w.numel() * w.element_size() for ws in stage.weights.values() for w in ws.values())
    fixed *= 4  # weights, gradients, Adam's two moments (all the weights' dtype on CPU)
    peak = (fixed + stage.peak_saved) / MB
    return {"allocated": (fixed + stage.live_saved) / MB, "max_allocated": peak, "reserved": peak, "max_reserved": peak}


def check(params: Mapping[str, Any], world_size: int, *, at_run_time: bool = False) -> None:
    """The config fits the job: its GPUs are the job's ranks, its shapes split. A search folder is
    only checked when the job runs (a chained job is submitted before its search has run)."""
    if not params["config"]:
        raise ParamError("'config' is empty.", "the path of a config JSON (reproflow aceso search or megatron)")
    if Path(params["config"]).suffix != ".json" and not at_run_time:
        return
    _, stages = load_config(resolve_config(Path(params["config"]), params["plan"], params.get("grid_plan", ""),
                          params.get("pick", "measured")),
                            params["seq_len"])
    gpus = sum(s.size for s in stages)
    if gpus != world_size:
        raise ParamError(f"the config uses {gpus} GPUs (sum of num_gpus) but the job has {world_size} ranks.",
                         f"launch {gpus} ranks, e.g. procs_per_node = {gpus}")
    check_shapes(stages)
    if params["tp_impl"] == "megatron-core":
        mcore.available()


def _iterate(ctx: RunContext, stage: Stage, optimizer: torch.optim.Optimizer, iterations: int, seconds: float,
             warmup: int, loss_scale: float, report_loss: bool, global_bs: int
             ) -> tuple[list[float], list[float], list[float], dict[str, float]]:
    """The training loop: (this rank's iteration seconds, the slowest rank's, losses, the last timed
    iteration's stage timers). At least `iterations` timed iterations, and more until the slowest rank's
    add up to `seconds` (every rank sees the same sums, so all stop together); then one with op timers,
    not timed."""
    times: list[float] = []
    steps: list[float] = []
    losses: list[float] = []
    timers: dict[str, float] = {}
    it, instrumented = 0, False
    while not instrumented:
        stage.iteration = it
        instrumented = len(steps) >= iterations and sum(steps) >= seconds
        stage.op_us = {} if instrumented else None
        stage.timers = Timers()
        optimizer.zero_grad(set_to_none=False)
        ctx.barrier()
        begin = time.perf_counter()
        loss_sum = stage.step(warmup, loss_scale)
        t0 = time.perf_counter()
        stage.wait_sends()
        t1 = time.perf_counter()
        stage.all_reduce_grads()
        t2 = time.perf_counter()
        optimizer.step()
        ctx.sync()
        end = time.perf_counter()
        stage.timers.add("send-wait", t1 - t0)
        stage.timers.add("grads-all-reduce", t2 - t1)
        stage.timers.add("optimizer", end - t2)
        if not report_loss:
            loss_sum.zero_()
        dist.all_reduce(loss_sum)
        losses.append(float(loss_sum.item()))
        slowest = max(ctx.gather_floats(end - begin))
        if not instrumented:
            times.append(end - begin)
            steps.append(slowest)
            timers = dict(stage.timers.ms)
        ctx.log(f" iteration {it + 1:3d}/{iterations + 1 if not seconds else '-'} | elapsed time per iteration (ms): "
                f"{slowest * 1000:.1f} | global batch size: {global_bs} | loss: {losses[-1]:.6E} |"
                + (" (instrumented: op timers, not timed)" if instrumented else ""))
        it += 1
    return times, steps, losses, timers


def train(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Train the config for `train_iters` iterations or more (`train_seconds`), then one instrumented;
    measurements of rank 0."""
    path = resolve_config(Path(params["config"]), params["plan"], params.get("grid_plan", ""),
                          params.get("pick", "measured"))
    config, stages = load_config(path, params["seq_len"])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[
        params["dtype"] if params["dtype"] != "auto" else ("bfloat16" if ctx.device.type == "cuda" else "float32")]
    groups = Groups(stages, ctx.rank, singletons=params["tp_impl"] == "megatron-core")
    keep_freed_memory()  # from the first iteration on, as the profiler: no process times a cold heap
    stage = Stage(ctx, config, stages, groups, params, dtype)
    optimizer = torch.optim.Adam([w for ws in stage.weights.values() for w in ws.values()], lr=params["lr"])
    n_stages, s = len(stages), stage.index
    last = stage.plan.ops[-1]
    loss_scale = 1.0 / (stage.num_micro * last.dp)
    report_loss = stage.last and (ctx.rank - stage.plan.first) % last.tp == 0
    warmup = min(n_stages - s - 1, stage.num_micro)
    iterations, seconds = params["train_iters"], params["train_seconds"]
    ctx.log(f"aceso train: {path.name}: {n_stages} stages, GPUs {[st.size for st in stages]}, micro-batch "
            f"{config.micro_bs}, {stage.num_micro} micro-batches, {iterations} iterations"
            + (f" (or more, until they take {seconds:g} s)" if seconds else "") + " + 1 with op timers")
    # Megatron-LM's --manual-gc: Python's collector off while training (one collection first), so a
    # threshold-triggered collection does not land in one rank's iteration and stall the others.
    gc.collect()
    gc.disable()
    try:
        times, steps, losses, timers = _iterate(ctx, stage, optimizer, iterations, seconds, warmup, loss_scale,
                                                report_loss, config.global_bs)
    finally:
        gc.enable()
    # The median, where the reference takes the mean of its 3 GPU iterations: on a shared CPU one
    # preempted iteration (3x the others) moves a mean of 18 by 10 %, and the profile's op times are
    # medians of their passes too.
    my_ms = statistics.median(times[params["warmup_iters"]:] or times[-1:]) * 1000
    memory = _memory_mb(ctx, stage)
    op_us = stage.op_us or {}
    row = {"global_batch_size": config.global_bs, "time": round(my_ms, 2),
           **{k: round(v, 2) for k, v in timers.items()},
           **{f"{p.op.name}#{p.index}": round(op_us.get(p.index, 0.0) / stage.num_micro, 2) for p in stage.plan.ops},
           **{k: round(v, 2) for k, v in memory.items()}}
    column = params["plan"] + ("-mcore" if params["tp_impl"] == "megatron-core" else "")
    size = config.model.size + (f"-{params['case']}" if params["case"] else "")
    logs = Path(params["log_path"]) / column / "runtime" / config.model.name / size
    _write_csv(logs, path.stem, s, ctx.rank, row)
    every = ctx.gather_objects({"stage": s, "time": my_ms, **memory})
    iteration_ms = max(float(r["time"]) for r in every)  # type: ignore[index]
    world = ctx.world_size
    model_flops = 3 * flops_per_micro_batch([p.op for st in stages for p in st.ops]) * stage.num_micro
    tflops = model_flops / (iteration_ms / 1000) / world / 1e12
    samples = config.global_bs / (iteration_ms / 1000)
    ctx.log(f"aceso train: {iteration_ms:.2f} ms per iteration, {samples:.2f} samples/s, "
            f"{tflops:.4f} TFLOP/s per rank (model FLOPs), losses {losses[0]:.4f} -> {losses[-1]:.4f}")
    who = {"config_name": path.stem, "config_digest": config_digest(path), "model_name": config.model.name,
           "model_size": config.model.size}
    out = [Measurement("iteration_ms", iteration_ms, "ms", who),
           Measurement("samples_per_s", samples, "samples/s", who),
           Measurement("tflops_per_gpu", tflops, "TFLOP/s", who), Measurement("model_flops", model_flops, "FLOP", who)]
    out += [Measurement("loss", v, "", {**who, "iteration": i + 1}) for i, v in enumerate(losses)]
    # What the search predicted for this config before any training: the prediction claim's other side.
    out += [Measurement(metric, value, unit, who) for metric, value, unit in
            zip(("predicted_ms", "predicted_mb"), predicted(path), ("ms", "MB"), strict=True) if value is not None]
    # Each timed iteration's slowest rank: the samples a claim's confidence interval comes from.
    kept = steps[params["warmup_iters"]:] or steps[-1:]
    out += [Measurement("step_ms", v * 1000, "ms", {**who, "iteration": len(steps) - len(kept) + i + 1})
            for i, v in enumerate(kept)]
    for r, info in enumerate(every):
        assert isinstance(info, dict)
        at = {**who, "stage": info["stage"]}
        out += [Measurement("rank_time", info["time"], "ms", at, rank=r),
                Measurement("rank_max_allocated", info["max_allocated"], "MB", at, rank=r),
                Measurement("rank_max_reserved", info["max_reserved"], "MB", at, rank=r)]
    return out


def _write_csv(log_path: Path, name: str, stage: int, rank: int, row: dict[str, float]) -> None:
    """The reference's `{log_path}/csv/{name}_stage{s}_rank{r}.csv`: a header and one row."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(row.keys())
    writer.writerow(row.values())
    atomic_write(log_path / "csv" / f"{name}_stage{stage}_rank{rank}.csv", buf.getvalue())
