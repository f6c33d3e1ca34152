"""param compute: GEMM, EmbeddingBag and MLP throughput, as param `train/compute/pt` measures them.

Every rank measures on its own device; rows carry each rank's time and the p50 across ranks.
GEMM reports TFLOP/s = 2·M·N·K / time; EmbeddingBag GB/s of gathered rows; MLP (Linear+ReLU chain,
softmax, cross-entropy, backward, optimizer step) TFLOP/s = 6·batch·Σ l_i·l_{i+1} / time and QPS.
Datasets A, B, C are param's; S is reproflow's CPU-sized set (same shapes scaled down).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reproflow.families.param_compute.datasets import COORDS, DATASETS, DTYPES, KERNELS, SHAPE_LEN
from reproflow.spec.errors import NotApplicable, ParamError
from reproflow.spec.family import Family, Measurement
from reproflow.spec.params import Param
from reproflow.store.provenance import cpu_flags

if TYPE_CHECKING:
    from reproflow.rank.context import RunContext


def check(params: Mapping[str, Any], world_size: int) -> None:
    """Dataset and shape rules, checked before anything runs."""
    kernel = params["kernel"]
    if not params["shapes"] and params["dataset"] not in DATASETS[kernel]:
        raise ParamError(f"dataset {params['dataset']!r} does not exist for kernel {kernel!r}.",
                         ", ".join(DATASETS[kernel]))
    for shape in params["shapes"]:
        if len(shape) != SHAPE_LEN[kernel]:
            raise ParamError(f"shape {list(shape)} needs {SHAPE_LEN[kernel]} numbers for kernel {kernel!r}.")
    if kernel == "emb" and params["dtype"] != "float32":
        raise ParamError("the emb kernel measures float32 tables only, as param does.")
    if params["implementation"] == "param":
        from reproflow.families.param_compute import original

        original.check(params)


# CPU instructions that give a matmul native bfloat16 / float16 arithmetic (x86 flags of /proc/cpuinfo);
# without one, torch converts every element to float32 and back: tens of times slower than float32.
HALF_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16", "avx_ne_convert"),
              "float16": ("avx512_fp16", "amx_fp16", "avx_ne_convert")}


def runtime_check(params: Mapping[str, Any], ctx: RunContext) -> None:
    """The original driver.py must be present where the job runs; half-precision matmuls on a CPU
    without native half-precision arithmetic are not applicable there (emulated, not what param measures)."""
    if params["implementation"] == "param":
        from reproflow.families.param_compute import original

        original.runtime_check(params, ctx.device.type)
    wanted = HALF_FLAGS.get(params["dtype"])
    if ctx.device.type == "cpu" and wanted and params["kernel"] in ("gemm", "linear"):
        flags = cpu_flags()
        if flags and not flags & set(wanted):
            raise NotApplicable(f"{params['dtype']} matmuls on this CPU are emulated in float32 (it has none of "
                                f"{', '.join(wanted)}): tens of times slower and not the arithmetic param measures; "
                                "measure them on a GPU or a CPU with one of those instructions")


def run(ctx: RunContext, params: Mapping[str, Any]) -> list[Measurement]:
    """Measure every shape on every rank (kernels.py; torch is imported on the ranks only)."""
    from reproflow.families.param_compute import kernels

    return kernels.run(ctx, params)


def table(params: Mapping[str, Any], rows: Sequence[Measurement]) -> str:
    """param's compute table for the kernel: shape columns, time per step, rate."""
    kernel = params["kernel"]
    cols = COORDS[kernel]
    metrics = {"gemm": ("tflops",), "emb": ("bandwidth",), "linear": ("qps", "tflops")}[kernel]
    heads = {"tflops": "Rate(TF/s)", "bandwidth": "BW(GB/s)", "qps": "QPS"}
    by_shape: dict[tuple, dict[str, float]] = {}
    for m in rows:
        if m.rank is None:
            by_shape.setdefault(tuple(m.coords[c] for c in cols), {})[m.metric] = m.value
    lines = [
        f"Measuring the performance of {kernel} ({params['implementation']}): steps = {params['steps']}, "
        f"warmups = {params['warmups']}, "
        f"dtype {params['dtype']}",
        " ".join(f"{c.upper():>10}" for c in cols) + f" {'Time(s)':>12}" + "".join(f" {heads[k]:>12}" for k in metrics),
    ]
    for shape, v in by_shape.items():
        lines.append(" ".join(f"{x:>10d}" for x in shape) + f" {v['time_p50_s']:>12.6f}"
                     + "".join(f" {v[k]:>12.3f}" for k in metrics))
    return "\n".join(lines)


FAMILY = Family(
    name="param_compute",
    headline="tflops",
    summary="GEMM TFLOP/s, EmbeddingBag GB/s and MLP TFLOP/s per rank (param train/compute/pt)",
    params=(
        Param("kernel", "str", "gemm", "what to measure (param driver subcommand)", choices=KERNELS),
        Param("dataset", "str", "A", "param's shape set A, B, C, or reproflow's CPU-sized S",
              choices=("A", "B", "C", "S")),
        Param("shapes", "int-lists", [], "explicit shapes instead of a dataset: GEMM [M,N,K], emb "
              "[features,dim,nnz,batch], linear [layers,input,hidden,output,batch]"),
        Param("dtype", "str", "float32", "element type; tf32 keeps fp32 storage with TF32 math",
              choices=DTYPES),
        Param("steps", "int", 100, "timed steps per shape (param --steps)", minimum=1, maximum=1000000),
        Param("warmups", "int", 10, "untimed steps per shape (param --warmups)", minimum=0, maximum=100000),
        Param("optimizer", "str", "sgd", "linear kernel's optimizer, stepped every step",
              choices=("sgd", "adagrad", "none")),
        Param("implementation", "str", "reproflow", "who measures: reproflow, or the original param driver.py "
              "from $PARAM_DIR", choices=("reproflow", "param")),
    ),
    run=run,
    table=table,
    check=check,
    runtime_check=runtime_check,
)
