"""CFP (arXiv 2504.00598): profiling-based intra-operator parallelism that keeps communication-free structures.

Three passes, as the reference's scripts (`--mode analysis|profile|search`): the analysis captures
the training step of GPT, GShard-MoE or LLaMA2 (models.py) as an ATen graph and groups it into
ParallelBlocks and unique segments (graph.py); the profile pass runs every block-strategy
combination of each unique segment on the job's ranks (execute.py: DTensor on a 1-D or 2-D
mesh, gloo or NCCL); the search composes the plan by dynamic programming, runs it, and runs the data-parallel
and Megatron-style tensor-parallel plans and the Alpa-style per-contraction integer program
(alpa.py) beside it (passes.py). `reproflow cfp` is the command line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reproflow.families.cfp.choices import BASELINES, MODELS, MODES
from reproflow.spec.errors import ParamError
from reproflow.spec.family import Family, Measurement
from reproflow.spec.params import Param

if TYPE_CHECKING:
    from reproflow.rank.context import RunContext



def check(params: Mapping[str, Any], world_size: int) -> None:
    # The passes import DTensor and scipy (a second): only where a CFP suite is loaded, not in every CLI start.
    from reproflow.families.cfp import passes, torch_baselines

    passes.check(params, world_size)
    if params["mode"] == "enum" and passes.Setup.of(params, world_size).mesh:
        raise ParamError(f"mode enum runs on a 1-D mesh; mesh is {params['mesh']!r}.", "leave mesh empty for enum")

    wanted = [b for b in params["baselines"].split(",") if b]
    bad = [b for b in wanted if b not in BASELINES]
    if bad:
        raise ParamError(f"baselines has {', '.join(bad)}.", f"a comma-separated list of {', '.join(BASELINES)}")
    # Only the search runs baselines: an analysis or profile point runs anywhere.
    if params["mode"] != "search":
        return
    if any(b.startswith("zero") for b in wanted) and not torch_baselines.deepspeed_available():
        raise ParamError("baselines zero1-3 need DeepSpeed, which is not installed.",
                         "pip install '.[deepspeed]' (make does), or leave zero1, zero2, zero3 out of baselines")
    if "deepspeed-megatron" in wanted and not torch_baselines.deepspeed_available(megatron=True):
        raise ParamError("baseline deepspeed-megatron needs DeepSpeed and megatron-core, which are not both "
                         "installed.", "pip install '.[deepspeed,megatron]' (make does), or leave "
                         "deepspeed-megatron out of baselines")
    if "megatron" in wanted and not torch_baselines.megatron_available():
        raise ParamError("baseline megatron needs megatron-core, which is not installed.",
                         "pip install '.[megatron]' (make does), or leave megatron out of baselines")


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    from reproflow.families.cfp import passes

    return {"analysis": passes.analysis, "profile": passes.profile, "search": passes.search,
            "enum": passes.enum}[params["mode"]](ctx, params)


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    head = f"CFP {params['mode']} of {params['model']} {params['size']} (batch {params['batch_size']})"
    lines = [head] + [f"  {m.metric}{'' if not m.coords else ' ' + str(dict(m.coords))}: {m.value:g} {m.unit}"
                      for m in rows if m.rank is None]
    return "\n".join(lines)


FAMILY = Family(
    name="cfp",
    sample_coords=('step', 'place'),
    headline="tflops",
    summary="CFP: ParallelBlock analysis, segment profiling and strategy search on GPT, MoE and LLaMA",
    params=(
        Param("mode", "str", "analysis", "the pass: analysis, profile, search (needs the profiles), or enum "
              "(communication volume against measured time, per plan)", choices=MODES),
        Param("model", "str", "gpt", "the model", choices=MODELS),
        Param("size", "str", "tiny", "model size: tiny (for CPUs), or the reference's (gpt 125M..2.6B, moe seed, "
              "llama 7B)"),
        Param("num_layer", "int", 0, "layers (0: the size's)", minimum=0),
        Param("mesh", "str", "", "device mesh: '' (1-D over the job's ranks) or AxB (2-D, A*B = ranks; 1xN and Nx1 "
              "are the 1-D mesh)"),
        Param("batch_size", "int", 8, "global batch size (split over the ranks by data-parallel blocks)", minimum=1),
        Param("warmup", "int", 1, "untimed steps before each measurement", minimum=0),
        Param("repeats", "int", 2, "profile: timed steps per strategy combination", minimum=1),
        Param("lower_top", "int", 4, "profile: the fastest combinations of each segment and input partition timed "
              "again lowered, as the search runs plans (0: none)", minimum=0),
        Param("lower_repeats", "int", 5, "profile: timed steps of each combination timed again lowered, in turns "
              "(their median is what the search reads: 5 outvote 2 spikes)", minimum=1),
        Param("runs", "int", 3, "search: timed steps of each plan", minimum=1),
        Param("screen", "int", 0, "search: timed steps of every plan first, in turns; then only CFP's plan and "
              "the fastest of each kind of baseline (Alpa's; data- or tensor-parallel; DDP or FSDP2; a ZeRO "
              "stage) take the `runs` steps (0: every plan takes them)", minimum=0),
        Param("memory_limit_gb", "float", 0.0, "search: per-device memory limit (0: none)", minimum=0.0),
        Param("baselines", "str", ",".join(BASELINES),
              "search: plans run beside CFP's (alpa: per-contraction strategies by an integer program; ddp, "
              "fsdp2: PyTorch's on the module; megatron: Megatron-LM's tensor parallelism with DDP; zero1-3: "
              "DeepSpeed's ZeRO stages; deepspeed-megatron: Megatron-LM's tensor parallelism with ZeRO-1; the "
              "two Megatron ones once per tensor-parallel degree)"),
        Param("verify", "bool", True, "search: check each plan's loss and gradients against the unsharded model "
              "(one process holds the whole model: tiny sizes)"),
        Param("force", "bool", False, "profile: re-profile segments already on disk"),
        Param("verbose", "bool", False, "analysis: print every ParallelBlock with its instructions and plans"),
        Param("work_dir", "str", "cfp-logs", "where the analysis, strategy map and profiles are written"),
    ),
    run=run,
    table=table,
    check=check,
)

__all__ = ["FAMILY"]
