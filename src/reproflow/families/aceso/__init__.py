"""Aceso (EuroSys'24): profile -> search (iterative bottleneck alleviation) -> train.

The family that runs on ranks is the op profiler (kind ops, collectives, p2p: profile.py), which
runs every op on the job's ranks and records Aceso's database columns as rows, and the runtime
(kind train: training.py, on layout.py's ranks and resharding and stage.py's 1F1B stage), which
trains a config JSON; both run the ops of transformer_ops.py and resnet_ops.py. Beside them: the
model zoo (models.py), the database format (database.py), the performance model (costmodel.py),
config JSON and Megatron-LM plans (plans.py), the search (search.py), the Megatron-LM baseline measured
(baseline.py), a search's outputs (manifest.py), the artifact's settings (settings.py), the profile ->
search -> train pipeline (pipeline.py) and `reproflow aceso`, which parses into it (cli.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reproflow.families.aceso.manifest import PICKS
from reproflow.spec.family import Family, Measurement
from reproflow.spec.params import Param

if TYPE_CHECKING:
    from reproflow.rank.context import RunContext


# The profiler and the runtime import torch: only when a point is checked or run, not when listed.
def check(params: Mapping[str, Any], world_size: int) -> None:
    from reproflow.families.aceso import profile, training

    (training.check if params["kind"] == "train" else profile.check)(params, world_size)


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    from reproflow.families.aceso import training

    if params["kind"] == "train":
        training.check(params, ctx.world_size, at_run_time=True)


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    from reproflow.families.aceso import profile, training

    return (training.train if params["kind"] == "train" else profile.run)(ctx, params)


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    if params["kind"] != "train":
        from reproflow.families.aceso import profile

        return profile.table(params, rows)
    v = {m.metric: m.value for m in rows if m.rank is None and "iteration" not in m.coords}
    losses = [m.value for m in rows if m.metric == "loss"]
    return (f"config {params['config']}: {v['iteration_ms']:.2f} ms per iteration, {v['samples_per_s']:.2f} "
            f"samples/s, {v['tflops_per_gpu']:.4f} TFLOP/s per GPU; loss {losses[0]:.4f} -> {losses[-1]:.4f}")


FAMILY = Family(
    name="aceso",
    sample_coords=('iteration',),
    headline="samples_per_s",
    summary="Aceso: op profiler (forward/backward time and sizes on TP ranks) and runtime (train a config JSON)",
    params=(
        Param("kind", "str", "ops", "profile every op, the collectives, or P2P bandwidth (2 ranks); or train a config",
              choices=("ops", "collectives", "p2p", "train")),
        Param("model", "str", "gpt", "model whose ops are profiled", choices=("gpt", "scale-layer", "t5", "resnet")),
        Param("size", "str", "tiny", "model size (Aceso's, or tiny for CPUs)"),
        Param("mbs", "int", 1, "micro-batch size", minimum=1),
        Param("tp", "int", 0, "TP size profiled (0: all the job's ranks); smaller runs several TP groups at once",
              minimum=0),
        Param("algo", "int", 0, "partition algorithm of the TP ops (0 or 1)", choices=(0, 1)),
        Param("seq_len", "int", 0, "GPT or T5-encoder sequence length, or ResNet image side; 0: the size's",
              minimum=0),
        Param("warmup", "int", 3, "untimed calls per op", minimum=0),
        Param("repeats", "int", 10, "timed calls per op", minimum=1),
        Param("repeat_seconds", "float", 0.0, "ops: more timed passes than repeats until they take this many "
              "seconds (0: repeats exactly)", minimum=0.0),
        Param("sizes_mb", "str", "0-64", "collectives: whole-MB sizes, e.g. '0-16,32,64'"),
        Param("p2p_max_mb", "int", 64, "p2p: largest message (1, 2, 4, ... MB)", minimum=1),
        Param("config", "str", "", "train: a config JSON (Aceso's format), or a search's --config-save-path"),
        Param("plan", "str", "aceso", "train: the runtime column (aceso: a searched config; megatron: a uniform "
              "plan) and, for a search folder, which of its configs", choices=("aceso", "megatron")),
        Param("grid_plan", "str", "", "train: with a search folder, this config of it: plan megatron, a plan of its "
              "Megatron-LM grid (e.g. megatron_pp2_tp1_dp1_mbs4_layers3-1_norecompute.json); plan aceso, Aceso's "
              "config of one pipeline depth (e.g. 2stages); empty: the config `pick` names"),
        Param("pick", "str", "measured", "train: with a search folder and no grid_plan, which config stands for the "
              "plan: the fastest measured on the screen that fits (measured; the predicted fastest before a "
              "screen), the search's predicted fastest as the artifact picks it (predicted), or both (one config "
              "is both)", choices=PICKS),
        Param("train_iters", "int", 5, "train: iterations (then one more with per-op timers)", minimum=1),
        Param("train_seconds", "float", 0.0, "train: more iterations than train_iters until the timed ones take "
              "this many seconds (0: train_iters exactly)", minimum=0.0),
        Param("warmup_iters", "int", 2, "train: first iterations left out of the iteration time", minimum=0),
        Param("lr", "float", 1e-3, "train: Adam's learning rate", minimum=0.0),
        Param("dropout", "float", 0.1, "train: dropout probability (0 to compare partitions exactly)",
              minimum=0.0),
        Param("seed", "int", 1234, "train: seed of the weights and the synthetic batch", minimum=0),
        Param("tp_impl", "str", "reproflow", "train: tensor-parallel linear layers: reproflow's, or megatron-core's "
              "ColumnParallelLinear / RowParallelLinear", choices=("reproflow", "megatron-core")),
        Param("dtype", "str", "auto", "train: float32 or bfloat16 (auto: float32 on CPU, bfloat16 on GPUs)",
              choices=("auto", "float32", "bfloat16")),
        Param("log_path", "str", "aceso-logs", "train: root of the reference's per-stage CSVs "
              "({plan}/runtime/{model}/{size}/csv/)"),
        Param("case", "str", "", "train: a case of its own beside the model's size (e.g. memory: a lower memory "
              "limit), its CSVs under {size}-{case}"),
        Param("round", "int", 0, "train: the round of trainings in turns this one belongs to; ops: the round of a "
              "profile in rounds, whose database takes each op's median over them (0: none)", minimum=0),
        Param("turn", "int", 0, "train: its place in its job's order of trainings (0: alone), so that an order "
              "effect shows in the rows", minimum=0),
    ),
    run=run,
    table=table,
    check=check,
    runtime_check=runtime_check,
)

__all__ = ["FAMILY"]
