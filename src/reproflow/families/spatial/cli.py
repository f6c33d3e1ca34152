"""`reproflow spatial resnet|amoebanet`: the benchmark scripts' command line.

  reproflow spatial resnet --split-size 2 --num-spatial-parts 4 --spatial-size 1 --image-size 256 \\
      --batch-size 2 --slice-method square                   (5 MPI ranks: 4 tiles, then 1 LP rank)
  reproflow spatial resnet --image-size 256 --batch-size 2 --compare
      (layer parallelism alone, then square / vertical / horizontal, each with and without --halo-D2)
  reproflow spatial amoebanet --num-layers 6 --num-filters 32 --image-size 128 --halo-D2 --enable-evaluation

The options keep the reference's names and defaults. Each command writes a suite under --results and
runs it here (mpirun with --backend mpi, the default; torch.distributed with gloo) or submits it
(--submit); the rows (images/s per step, Mean and Median, the check against the unsplit model,
activation memory per rank) land in the results folder. Rank counts follow the reference:
split_size + parts × spatial_size − spatial_size + (split_size − spatial_size)(local_DP − 1).
"""

from __future__ import annotations

import argparse
from typing import Any

from reproflow import api
from reproflow.api.options import generated_suite_options, placement
from reproflow.families.spatial.layout import SLICES, Layout
from reproflow.spec.errors import ReproflowError
from reproflow.spec.params import number, whole
from reproflow.spec.suite import suite_toml


def _parts(text: str) -> int:
    values = {int(v) for v in text.split(",") if v.strip()}
    if len(values) != 1:
        raise ReproflowError(f"--num-spatial-parts {text!r}: give one count, or the same count for every spatial "
                             "stage (e.g. 4 or 4,4); stages with different counts are not supported.")
    return values.pop()


def point_params(args: argparse.Namespace) -> dict[str, Any]:
    """The family parameters of the command line."""
    return {
        "model": args.model, "batch_size": args.batch_size, "parts": args.parts, "split_size": args.split_size,
        "num_spatial_parts": _parts(args.num_spatial_parts), "spatial_size": args.spatial_size, "times": args.times,
        "image_size": args.image_size, "num_epochs": args.num_epochs, "resnet_depth": args.resnet_depth,
        "num_layers": args.num_layers,
        "num_filters": args.num_filters, "num_classes": args.num_classes, "balance": args.balance or "",
        "halo_d2": args.halo_D2, "fused_layers": args.fused_layers, "local_dp": args.local_DP,
        "slice_method": args.slice_method, "app": args.app, "enable_evaluation": args.enable_evaluation,
        "comm_backend": args.backend, "precision": args.precision, "optimizer": args.optimizer,
        "learning_rate": args.learning_rate, "steps": args.steps, "verify": not args.no_verify,
    }


def _launch(params: dict[str, Any], world: int) -> dict[str, Any]:
    mpi = params["comm_backend"] == "mpi"
    return {"procs_per_node": world, "launcher": "mpi" if mpi else "torchrun",
            "backend": "auto" if mpi else params["comm_backend"]}


def experiments(params: dict[str, Any], compare: bool) -> list[dict[str, Any]]:
    """One experiment for the options; with `compare`, layer parallelism alone and every slicing ± halo-D2."""
    def world(p: dict[str, Any]) -> int:
        return Layout(p["split_size"], p["spatial_size"], p["num_spatial_parts"], p["local_dp"],
                      p["slice_method"]).world

    if not compare:
        return [{"name": "spatial", "family": "spatial", "launch": _launch(params, world(params)), "params": params}]
    lp = params | {"spatial_size": 0, "halo_d2": False}
    sp = {k: v for k, v in params.items() if k not in ("slice_method", "halo_d2")}
    sp["spatial_size"] = max(1, params["spatial_size"])
    return [
        {"name": "layer-parallel", "family": "spatial", "launch": _launch(lp, world(lp)), "params": lp},
        {"name": "spatial", "family": "spatial", "launch": _launch(params, world(sp | {"slice_method": "vertical"})),
         "params": sp, "matrix": {"slice_method": list(SLICES), "halo_d2": [False, True]}},
    ]


def cmd_spatial(args: argparse.Namespace) -> int:
    params = point_params(args)
    exps = experiments(params, args.compare)
    text = suite_toml({"description": f"spatial parallelism: {args.model} {args.image_size}x{args.image_size}, "
                                      f"batch {args.batch_size}"},
                      {"nodes": 1, "time_limit": "02:00:00"}, exps)
    name = (f"spatial-{args.model}-{args.image_size}-b{args.batch_size}-s{args.split_size}x{params['spatial_size']}"
            f"-p{params['num_spatial_parts']}" + ("-compare" if args.compare else ""))
    api.run_generated_suite(text, name, placement(args))
    return 0


def register_cli(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    """Add `reproflow spatial ...`."""
    p = sub.add_parser("spatial", help="spatial parallelism (MPI4DL): ResNet / AmoebaNet over image tiles",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=("resnet", "amoebanet"), help="ResNet-110-v2 or AmoebaNet-D")
    p.add_argument("--batch-size", type=whole(1), default=32, help="input batch size")
    p.add_argument("--parts", type=whole(1), default=1, help="micro-batches per step (pipelined)")
    p.add_argument("--split-size", type=whole(1), default=2, help="number of model partitions")
    p.add_argument("--num-spatial-parts", default="4", help="image tiles per spatial stage (one count, or one per "
                   "stage, all equal)")
    p.add_argument("--spatial-size", type=whole(0), default=1, help="partitions that use spatial parallelism (0: layer "
                   "parallelism alone)")
    p.add_argument("--times", type=whole(1), default=1, help="GEMS replication factor (an epoch is 10/times batches)")
    p.add_argument("--image-size", type=whole(1), default=32,
                   help="image side for the synthetic benchmark (power of two)")
    p.add_argument("--num-epochs", type=whole(1), default=1, help="number of epochs")
    p.add_argument("--resnet-depth", type=whole(1), default=110, help="ResNet-v2 depth, 9n + 2 (110: ResNet-110)")
    p.add_argument("--num-layers", type=whole(1), default=18, help="AmoebaNet normal cells (multiple of 3)")
    p.add_argument("--num-filters", type=whole(1), default=416, help="AmoebaNet filters")
    p.add_argument("--num-classes", type=whole(1), default=10, help="number of classes")
    p.add_argument("--balance", default=None, help="layers per partition, comma-separated, summing to the model's "
                   "layers (ResNet-110 38, depth 9n + 2: 3n + 2; AmoebaNet num-layers + 6)")
    p.add_argument("--halo-D2", action="store_true", help="design 2: halo exchange once per group of blocks")
    p.add_argument("--fused-layers", type=whole(1), default=1, help="halo-D2: ResNet blocks sharing one exchange")
    p.add_argument("--local-DP", type=whole(1), default=1, help="replicas of each layer-parallel partition")
    p.add_argument("--slice-method", default="square", help="square, vertical or horizontal")
    p.add_argument("--app", type=whole(1), default=3, help="3: synthetic data (the only one available)")
    p.add_argument("--enable-evaluation", action="store_true", help="inference only")
    p.add_argument("--backend", default="mpi", help="mpi (mpi4py, started by mpirun), gloo or nccl")
    p.add_argument("--precision", default="fp32", help="fp32, or fp_16 (inference)")
    p.add_argument("--optimizer", default="sgd", help="sgd (momentum 0.9) or adam")
    p.add_argument("--learning-rate", type=number(), default=1e-3, help="learning rate")
    p.add_argument("--steps", type=whole(0), default=0, help="steps per epoch (0: the reference's 10 / times)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the check of one step against the unsplit model (rank 0 runs the whole model once)")
    p.add_argument("--compare", action="store_true", help="layer parallelism alone, then each slice method with and "
                   "without halo-D2")
    generated_suite_options(p)
    p.set_defaults(func=cmd_spatial)
