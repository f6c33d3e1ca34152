"""Spatial parallelism (MPI4DL): ResNet-110-v2 and AmoebaNet-D over image tiles with halo exchange.

The first `spatial_size` of `split_size` partitions run on `num_spatial_parts` ranks each, one
image tile per rank (square, vertical or horizontal slices), exchanging halos with their
neighbours before every convolution and pooling (or, with halo-D2, once per group of blocks); the
tiles are joined for the layer-parallel partitions. Messages go over MPI (mpi4py) by default, or
torch.distributed. Each point times synthetic-data steps as the reference prints them (`images per
sec`, `Mean ... Median ...`) and, with `verify`, checks logits and gradients against the unsplit
model. `reproflow spatial resnet|amoebanet` takes the reference's options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reproflow.families.spatial.layout import SLICES
from reproflow.spec.family import Family, Measurement
from reproflow.spec.params import Param

if TYPE_CHECKING:
    from reproflow.rank.context import RunContext

MODELS = ("resnet", "amoebanet")
BACKENDS = ("mpi", "gloo", "nccl")
PRECISIONS = ("fp32", "fp_16", "fp64")


# The step's code is torch: step.py is imported when a point is checked or run, not when listed.
def check(params: Mapping[str, Any], world_size: int) -> None:
    from reproflow.families.spatial import step

    step.check(params, world_size)


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    from reproflow.families.spatial import step

    step.runtime_check(params, ctx)


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    from reproflow.families.spatial import step

    return step.run(ctx, params)


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    from reproflow.families.spatial import step

    return step.table(params, rows)


FAMILY = Family(
    name="spatial",
    sample_coords=('epoch', 'step'),
    samples=('steps', 'step_s'),
    headline="images_per_s",
    summary="spatial parallelism (MPI4DL): ResNet / AmoebaNet over image tiles with halo exchange",
    params=(
        Param("model", "str", "resnet", "resnet (ResNet-110-v2) or amoebanet (AmoebaNet-D)", choices=MODELS),
        Param("batch_size", "int", 32, "global batch per step", minimum=1),
        Param("parts", "int", 1, "micro-batches per step, pipelined GPipe-style", minimum=1),
        Param("split_size", "int", 2, "model partitions (stages)", minimum=1, maximum=1024),
        Param("num_spatial_parts", "int", 4, "image tiles per spatial stage", minimum=1, maximum=4096),
        Param("spatial_size", "int", 1, "leading partitions that run spatially (0: layer parallelism alone)",
              minimum=0),
        Param("times", "int", 1, "GEMS replication factor: an epoch is 10 / times synthetic batches", minimum=1,
              maximum=10),
        Param("image_size", "int", 32, "square image side, a power of two", minimum=32),
        Param("num_epochs", "int", 1, "epochs", minimum=1),
        Param("resnet_depth", "int", 110, "ResNet-v2 depth, 9n + 2 (110: the benchmarks' ResNet-110)", minimum=11),
        Param("num_layers", "int", 18, "AmoebaNet normal cells (a multiple of 3)", minimum=3),
        Param("num_filters", "int", 416, "AmoebaNet filters", minimum=8),
        Param("num_classes", "int", 10, "classes", minimum=2),
        Param("balance", "str", "", "layers per partition, comma-separated (empty: even, remainder to the last)"),
        Param("halo_d2", "bool", False, "design 2: one wide halo exchange per group of blocks, valid convolutions "
              "inside"),
        Param("fused_layers", "int", 1, "halo-D2: ResNet blocks sharing one exchange", minimum=1),
        Param("local_dp", "int", 1, "data-parallel replicas of each layer-parallel partition", minimum=1),
        Param("slice_method", "str", "square", "how images are cut into tiles", choices=SLICES),
        Param("app", "int", 3, "3: synthetic images (1 ImageFolder and 2 CIFAR-10 need datasets)", minimum=1,
              maximum=3),
        Param("enable_evaluation", "bool", False, "inference only (batch norm uses running statistics)"),
        Param("comm_backend", "str", "mpi", "messages: mpi (mpi4py; start the ranks with launch.launcher = 'mpi'), "
              "or the job's torch.distributed group (gloo, nccl)", choices=BACKENDS),
        Param("precision", "str", "fp32", "fp32, or fp_16 for inference (fp64: for checks)", choices=PRECISIONS),
        Param("optimizer", "str", "sgd", "sgd (momentum 0.9, as the benchmark scripts) or adam",
              choices=("sgd", "adam")),
        Param("learning_rate", "float", 1e-3, "learning rate", minimum=0.0),
        Param("steps", "int", 0, "steps per epoch (0: the reference's 10 / times)", minimum=0),
        Param("speedup_claim", "bool", False, "the tiled configuration the speed-up claim judges against layer "
              "parallelism, named in the suite before the run (one per model)"),
        Param("round", "int", 0, "the round of a comparison timed in turns (ABBA) this point belongs to (0: none)",
              minimum=0),
        Param("verify", "bool", True, "before timing, compare one step's logits and gradients with the unsplit "
              "model on rank 0 (which then runs the whole model once)"),
    ),
    run=run,
    table=table,
    check=check,
    runtime_check=runtime_check,
)

__all__ = ["FAMILY"]
