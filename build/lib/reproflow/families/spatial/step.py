"""One spatial-parallel point: its setup and checks, the timed steps and the check against the unsplit model."""


from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from reproflow.families.spatial.comm import Comm, make_comm
from reproflow.families.spatial.layout import Layout
from reproflow.families.spatial.models import resnet_layers
from reproflow.families.spatial.pipeline import Setup, Stage, dry_run, serial_reference, synthetic_batch
from reproflow.rank.context import RunContext
from reproflow.spec.errors import ParamError, PointFailed
from reproflow.spec.family import Measurement

# The reference's synthetic dataset (`--app 3`) holds 10 batches per epoch.
SYNTHETIC_BATCHES = 10


def layers_of(params: Mapping[str, Any]) -> int:
    """Sequential layers `--balance` splits: first convolution + blocks + head for ResNet (38 for
    ResNet-110), num_layers + 6 for AmoebaNet-D."""
    return resnet_layers(params["resnet_depth"]) if params["model"] == "resnet" else params["num_layers"] + 6


def setup_of(params: Mapping[str, Any]) -> Setup:
    """The step's setup from the point's parameters."""
    layout = Layout(params["split_size"], params["spatial_size"], params["num_spatial_parts"], params["local_dp"],
                    params["slice_method"])
    try:
        balance = tuple(int(b) for b in params["balance"].split(",") if b.strip())
    except ValueError:
        raise ParamError(f"balance {params['balance']!r} is not a list of layer counts.",
                         "comma-separated integers, e.g. '19,19'") from None
    return Setup(params["model"], layout, params["image_size"], params["batch_size"], params["parts"],
                 params["halo_d2"], params["fused_layers"], params["num_layers"], params["num_filters"],
                 params["num_classes"], balance, not params["enable_evaluation"], params["precision"],
                 params["optimizer"], params["learning_rate"], resnet_depth=params["resnet_depth"])


def check(params: Mapping[str, Any], world_size: int) -> None:
    """Everything about a point that can be known before it runs."""
    s = setup_of(params)
    problems = s.layout.problems(s.image_size, s.batch_size, s.micro_batches)
    if params["app"] != 3:
        problems.append(f"--app {params['app']}: only 3 (synthetic images, the benchmarks' default) is available; "
                        "1 (ImageFolder) and 2 (CIFAR-10) need datasets this tool does not ship")
    if s.model == "resnet" and (s.resnet_depth < 11 or (s.resnet_depth - 2) % 9):
        problems.append(f"--resnet-depth {s.resnet_depth} must be 9n + 2 (11, 20, 29, ..., 110: three stages of n "
                        "bottleneck blocks)")
    if s.model == "amoebanet" and (s.num_layers % 3 or s.num_layers < 3):
        problems.append(f"--num-layers {s.num_layers} must be a positive multiple of 3 (three groups of normal cells)")
    if s.model == "amoebanet" and (s.num_filters < 8 or s.num_filters % 8):
        problems.append(f"--num-filters {s.num_filters} must be a multiple of 8 (the cells use filters/4 channels, "
                        "halved by factorized reductions)")
    if s.balance and (len(s.balance) != s.layout.split_size or sum(s.balance) != layers_of(params)
                      or min(s.balance) < 1):
        problems.append(f"--balance {params['balance']} must list {s.layout.split_size} positive layer counts "
                        f"summing to the model's {layers_of(params)} layers")
    if s.precision == "fp_16" and s.train:
        problems.append("--precision fp_16 is for inference, as in the reference: add --enable-evaluation")
    if not problems:
        try:
            dry_run(s)
        except ValueError as exc:
            problems.append(str(exc))
    if not problems and s.layout.world != world_size:
        problems.append(f"this layout needs {s.layout.world} processes (split_size + parts x spatial_size - "
                        f"spatial_size + (split_size - spatial_size)(local_DP - 1)), the job has {world_size}; "
                        f"start it with -np {s.layout.world}")
    if problems:
        raise ParamError("; ".join(problems) + ".")


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    """The backend must be the one the ranks were started for."""
    backend = params["comm_backend"]
    if backend == "mpi":
        try:
            from mpi4py import MPI
        except ImportError:
            raise ParamError("backend 'mpi' needs mpi4py, which is not installed.",
                             "pip install '.[mpi]' (make does), or backend gloo") from None
        if MPI.COMM_WORLD.Get_size() != ctx.world_size:
            raise ParamError(f"backend 'mpi' but MPI sees {MPI.COMM_WORLD.Get_size()} process(es) for "
                             f"{ctx.world_size} ranks.", "launch.launcher = 'mpi' (mpirun, srun --mpi), or backend "
                             f"'{ctx.backend}'")
    elif backend != ctx.backend:
        raise ParamError(f"backend '{backend}' but the job's process group is {ctx.backend}.",
                         f"backend '{ctx.backend}' or 'mpi', or launch.backend = '{backend}'")


def _max_rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.double().abs().max().item()
    return (got.double() - ref.double()).abs().max().item() / max(scale, 1e-300)


def verify(ctx: RunContext, comm: Comm, s: Setup) -> list[Measurement]:
    """One step of the split model in fp64, checked on rank 0 against the unsplit model: logits and
    gradients (float64, so rounding is not mistaken for an error; see pipeline.DTYPES)."""
    s = replace(s, precision="fp64")
    stage = Stage(s, comm, ctx.rank, ctx.device)
    images, labels = synthetic_batch(s, -1)
    stage.step(images, labels, update=False)
    mine = {"logits": [lg.cpu() for lg in stage.logits], "replica": stage.role.index if stage.last else -1,
            "grads": {}}
    leader = stage.role.index == 0
    if s.train and leader:
        mine["grads"] = {i: [g.cpu() for g in gs] for i, gs in stage.grads().items()}
    stage.zero_grads()
    gathered = ctx.gather_objects(mine)
    if ctx.rank != 0:
        return []
    ref_logits, ref_grads = serial_reference(s, images, labels)
    parts = sorted((g["replica"], g["logits"]) for g in gathered if g["replica"] >= 0)
    per_micro = [torch.cat([p[1][m] for p in parts]) for m in range(s.micro_batches)]
    out = [Measurement("logits_max_rel_err", _max_rel(torch.cat(per_micro), ref_logits), "")]
    if s.train:
        grads: dict[int, list[torch.Tensor]] = {}
        for g in gathered:
            grads.update(g["grads"])
        err = max(_max_rel(a, b) for i in ref_grads for a, b in zip(grads[i], ref_grads[i], strict=True))
        out.append(Measurement("grads_max_rel_err", err, ""))
    ctx.log("reproflow: check against the unsplit model: " + ", ".join(f"{m.metric} {m.value:.2e}" for m in out))
    return out


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Build this rank's stage, check it, then time the reference's epochs of synthetic steps."""
    s = setup_of(params)
    torch.set_grad_enabled(True)
    comm = make_comm(params["comm_backend"], ctx.device, ctx.rank, ctx.world_size)
    try:
        out = verify(ctx, comm, s) if params["verify"] else []
        stage = Stage(s, comm, ctx.rank, ctx.device)
        steps = params["steps"] or SYNTHETIC_BATCHES // params["times"]
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        stage.activation_bytes = 0
        times: list[float] = []
        ctx.barrier()
        exchanges = 0
        for epoch in range(params["num_epochs"]):
            loss = correct = 0.0
            for step in range(steps):
                images, labels = synthetic_batch(s, epoch * steps + step)
                before = stage.space.exchanges
                # The gather is the step's end on every rank, so the next step starts together.
                seconds = max(ctx.gather_floats(stage.step(images, labels)))
                exchanges = stage.space.exchanges - before
                loss, correct = loss + stage.loss, correct + stage.correct
                times.append(seconds)
                ctx.log(f"Epoch: {epoch} images per sec:{s.batch_size / seconds}")
                out += [Measurement("step_s", seconds, "s", {"epoch": epoch, "step": step}),
                        Measurement("images_per_s", s.batch_size / seconds, "images/s", {"epoch": epoch, "step": step})]
            loss, correct = (sum(v) for v in zip(*ctx.gather_objects((loss, correct)), strict=True))
            ctx.log(f"Epoch {epoch} Global loss: {loss / steps} Acc {correct / steps / s.batch_size}")
        exchanges = max(ctx.gather_objects(exchanges))
    except ValueError as exc:
        raise PointFailed(str(exc)) from None
    ips = [s.batch_size / t for t in times]
    ctx.log(f"Mean {statistics.mean(ips)} Median {statistics.median(ips)}")
    out += [Measurement("images_per_s_mean", statistics.mean(ips), "images/s"),
            Measurement("images_per_s_median", statistics.median(ips), "images/s"),
            Measurement("halo_exchanges_per_step", float(exchanges), "")]
    if len(times) > 1:
        out.append(Measurement("images_per_s_steady", s.batch_size / statistics.mean(times[1:]), "images/s"))
    memory = torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else stage.activation_bytes
    role = stage.role
    for r, (mem, stage_no, spatial) in enumerate(ctx.gather_objects((memory, role.stage, role.spatial))):
        metric = "peak_memory_bytes" if ctx.device.type == "cuda" else "activation_bytes"
        out.append(Measurement(metric, float(mem), "B", {"stage": stage_no, "spatial": spatial}, rank=r))
    return out


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    """The point's summary, in the reference's words."""
    s = setup_of(params)
    lay = s.layout
    config = f"layer parallelism, split {lay.split_size}"
    if lay.spatial_size:
        config = (f"split {lay.split_size}, spatial {lay.spatial_size} x {lay.parts} {lay.slice_method}"
                  + (" + halo-D2" if s.halo_d2 else ""))
    head = (f"{s.model} {s.image_size}x{s.image_size} batch {s.batch_size}, {config}, "
            f"{'inference' if not s.train else 'training'} {s.precision}")
    agg = {m.metric: m.value for m in rows if m.rank is None and not m.coords}
    lines = [head, f"  Mean {agg.get('images_per_s_mean', math.nan):.3f} Median "
                   f"{agg.get('images_per_s_median', math.nan):.3f} images/s; halo exchanges per step "
                   f"{agg.get('halo_exchanges_per_step', 0):.0f}"]
    if "logits_max_rel_err" in agg:
        lines.append(f"  vs unsplit model: logits {agg['logits_max_rel_err']:.1e}"
                     + (f", gradients {agg['grads_max_rel_err']:.1e}" if "grads_max_rel_err" in agg else ""))
    mem = [m for m in rows if m.rank is not None]
    if mem:
        lines.append("  " + mem[0].metric + " per rank: " + ", ".join(
            f"r{m.rank}(stage {m.coords['stage']}{' tile' if m.coords['spatial'] else ''}) {m.value / 2**20:.1f} MiB"
            for m in mem))
    return "\n".join(lines)
