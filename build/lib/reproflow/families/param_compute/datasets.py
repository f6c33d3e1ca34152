"""What a param compute point measures: param's shape sets per kernel (A, B, C, and reproflow's CPU-sized S),
the work of one step, and the units of its rates."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

_GEMM_A = [(m, 4096, 4096) for m in (128, 256, 512, 1024)] + [(m, 1024, 1024) for m in (128, 256, 512, 1024)]
_GEMM_A += [(4096, 4096, k) for k in (128, 256, 512, 1024)] + [(1024, 1024, k) for k in (128, 256, 512)]
_GEMM_B = [(m, 4096, 40928) for m in (128, 256, 512, 1024)] + [(m, 40928, 4096) for m in (128, 256, 512, 1024)]
_GEMM_B += [(m, 1024, 2000) for m in (128, 256, 512, 1024)]
_GEMM_B += [(1024, 2000, k) for k in (128, 256, 512, 1024)] + [(4096, 40928, k) for k in (128, 256, 512, 1024)]
_BATCHES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

# Shapes per kernel and dataset. GEMM: (M, N, K); emb: (features, dim, nnz, batch);
# linear: (layers, input, hidden, output, batch).
DATASETS: dict[str, dict[str, list[tuple[int, ...]]]] = {
    "gemm": {
        "A": _GEMM_A,
        "B": _GEMM_B,
        "C": [(1024, 1024, 64), (1024, 64, 1024), (1024, 4096, 1024), (1024, 1024, 4096)],
        "S": [(256, 1024, 1024), (512, 1024, 1024), (1024, 1024, 1024), (1024, 1024, 256)],
    },
    "emb": {
        "A": [(f, 128, 30, b) for f in (14_000_000, 26_000_000) for b in _BATCHES],
        "B": [(4_800_000, 56, 34, b) for b in _BATCHES[2:]],
        "S": [(1_000_000, 128, 30, b) for b in (512, 2048, 8192)],
    },
    "linear": {
        "A": [(18, s, s, s, b) for s in (1024, 4096) for b in (128, 256, 512, 1024, 2048, 4096)],
        "S": [(4, 1024, 1024, 1024, b) for b in (64, 256)],
    },
}
KERNELS = ("gemm", "emb", "linear")
SHAPE_LEN = {"gemm": 3, "emb": 4, "linear": 5}
DTYPES = ("float32", "tf32", "bfloat16", "float16")


def shapes(params: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """The shapes a point measures: explicit `shapes`, else the kernel's dataset."""
    return list(params["shapes"]) or DATASETS[params["kernel"]][params["dataset"]]


def work(kernel: str, shape: tuple[int, ...]) -> dict[str, float]:
    """What one step does, in the units of each rate: FLOPs, bytes gathered, samples (param's formulas)."""
    if kernel == "gemm":
        m, n, k = shape
        return {"tflops": 2.0 * m * n * k}
    if kernel == "emb":
        _, dim, nnz, batch = shape
        return {"bandwidth": float(batch * nnz * dim * 4)}  # fp32 rows gathered
    layers, width_in, hidden, width_out, batch = shape
    sizes = [width_in] + [hidden] * layers + [width_out]
    return {"tflops": 6.0 * batch * sum(a * b for a, b in pairwise(sizes)), "qps": float(batch)}


COORDS = {"gemm": ("m", "n", "k"), "emb": ("features", "dim", "nnz", "batch"),
          "linear": ("layers", "input", "hidden", "output", "batch")}
UNITS = {"tflops": ("TFLOP/s", 1e12), "bandwidth": ("GB/s", 1e9), "qps": ("samples/s", 1.0)}
