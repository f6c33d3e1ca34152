"""The gpu image's compiled parts, checked on a GPU against torch's own kernels on the same inputs.

    python benchmarks/gpu_compiled.py --builds BUILDS.csv --nccl-tests OUTPUT.txt --out compiled.csv

apex's fused layer norm (forward and input/weight gradients, float32 and bfloat16) against
torch.nn.functional.layer_norm; apex's and DeepSpeed's fused Adam against torch.optim.Adam after the
same steps on the same gradients (largest parameter difference); nccl-tests' all_reduce_perf output
parsed by param comms' parser (rows, wrong elements, best algBW). BUILDS.csv (part, seconds, status)
is what the build script measured; a part whose build or import failed is a failed row with the reason.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

# Layer norm: the fused kernel's error against a float64 computation from the same inputs may be at most
# twice torch's own kernel's (two summation orders over 4096 rows differ by more than torch.testing's
# element-wise defaults, which fit apex's small test shapes). Adam: torch.testing's float32 defaults
# (apex's Adam tests allow 1e-3).
LAYER_NORM_ERROR_RATIO = 2.0
LAYER_NORM_TENSORS = ("output", "input gradient", "weight gradient", "bias gradient")
ADAM = (1.3e-6, 1e-5)  # rtol, atol


def of_tolerance(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> tuple[float, float]:
    """The largest |actual - expected|, and the largest share of its element's allowance it takes (<= 1 passes)."""
    diff = (actual.float() - expected.float()).abs()
    return diff.max().item(), (diff / (atol + rtol * expected.float().abs())).max().item()


def layer_norm_difference(fused: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                          dtype: torch.dtype, device: str,
                          shape: tuple[int, int] = (4096, 2048)) -> tuple[float, float]:
    """The largest |fused - torch| over the output and the input, weight and bias gradients, and the largest
    ratio of fused's error to torch's error (both against float64 from the same inputs) over the allowed 2."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(shape, generator=gen).to(device, dtype)
    w = (1 + 0.1 * torch.randn(shape[1], generator=gen)).to(device, dtype)
    b = (0.1 * torch.randn(shape[1], generator=gen)).to(device, dtype)
    grad = torch.randn(shape, generator=gen).to(device, dtype)

    def native(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (shape[1],), w, b, 1e-5)

    results = []
    for fn, as_type in ((fused, dtype), (native, dtype), (native, torch.float64)):
        leaves = [t.detach().to(as_type).requires_grad_() for t in (x, w, b)]
        out = fn(*leaves)
        out.backward(grad.to(as_type))
        # A kernel that gives a leaf no gradient is as wrong as can be.
        results.append([out.detach()] + [torch.full_like(t, float("inf")) if t.grad is None else t.grad
                                         for t in leaves])
    largest, ratios = 0.0, {}
    for name, got, ours, exact in zip(LAYER_NORM_TENSORS, *results, strict=True):
        largest = max(largest, (got.double() - ours.double()).abs().max().item())
        error = (got.double() - exact).abs().max().item()
        baseline = (ours.double() - exact).abs().max().item()
        ratios[name] = error / max(baseline, torch.finfo(dtype).tiny) / LAYER_NORM_ERROR_RATIO
    print(f"layer norm {dtype}: fused error / (2 x torch's) " + ", ".join(f"{k} {v:.3g}" for k, v in ratios.items()))
    return largest, max(ratios.values())


def adam_difference(make: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer], device: str,
                    steps: int = 10, size: int = 1 << 20) -> tuple[float, float]:
    """`of_tolerance` of fused against torch.optim.Adam over the parameters after `steps` steps on the same
    gradients (L2 weight decay, as torch's Adam applies it)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    start = [torch.randn(size, generator=gen), torch.randn(size // 4, 3, generator=gen)]
    grads = [[torch.randn(t.shape, generator=gen) for t in start] for _ in range(steps)]
    finals = []
    for build in (make, lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01)):
        params = [torch.nn.Parameter(t.clone().to(device)) for t in start]
        opt = build(params)
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.to(device)
            opt.step()
        finals.append([p.detach() for p in params])
    got = [of_tolerance(a, e, *ADAM) for a, e in zip(*finals, strict=True)]
    return max(g[0] for g in got), max(g[1] for g in got)


def nccl_tests_check(path: Path) -> tuple[str, float]:
    """all_reduce_perf's output parsed: what it holds, and its wrong elements in all (0 expected)."""
    from reproflow.families.param_comms.nccl_tests import parse_text

    run = parse_text(path.read_text())
    wrong = sum(t.wrong or 0 for r in run.rows for t in r.timings.values())
    # Out of place only: at one GPU an in-place all_reduce moves nothing, and its algBW is size / launch time.
    best = max(r.timings["out_of_place"].algbw for r in run.rows)
    return f"{len(run.rows)} rows parsed, {run.version}, out-of-place algBW up to {best:.1f} GB/s", float(wrong)


def _checks(device: str) -> list[tuple[str, str, Callable[[], tuple[float, float]]]]:
    """(part, what, measure) for every kernel checked; imports happen inside measure."""

    def apex_ln(dtype: torch.dtype) -> Callable[[], tuple[float, float]]:
        def measure() -> tuple[float, float]:
            from apex.normalization.fused_layer_norm import fused_layer_norm_affine
            return layer_norm_difference(lambda x, w, b: fused_layer_norm_affine(x, w, b, (x.shape[1],), 1e-5),
                                         dtype, device)
        return measure

    def apex_adam() -> tuple[float, float]:
        from apex.optimizers import FusedAdam
        return adam_difference(lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01, adam_w_mode=False), device)

    def deepspeed_adam() -> tuple[float, float]:
        from deepspeed.ops.adam import FusedAdam
        return adam_difference(lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01, adam_w_mode=False), device)

    return [("apex", "fused layer norm float32 (output, input/weight/bias gradients)", apex_ln(torch.float32)),
            ("apex", "fused layer norm bfloat16 (output, input/weight/bias gradients)", apex_ln(torch.bfloat16)),
            ("apex", "FusedAdam, 10 steps, float32", apex_adam),
            ("deepspeed", "FusedAdam, 10 steps, float32", deepspeed_adam)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builds", type=Path, required=True, help="CSV of part,seconds,status from the builds")
    parser.add_argument("--nccl-tests", type=Path, help="all_reduce_perf -g 1 text output")
    parser.add_argument("--out", type=Path, required=True, help="the table, as CSV")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", default="", help="only the checks whose description holds this text")
    args = parser.parse_args()
    builds = {row["part"]: row for row in csv.DictReader(args.builds.open())}
    rows = []
    for part, what, measure in _checks(args.device):
        if args.only not in what:
            continue
        built = builds.get(part, {"seconds": "", "status": "not built"})
        if built["status"] != "ok":
            rows.append((part, built["seconds"], what, "", "", f"fail: build {built['status']}"))
            continue
        try:
            diff, share = measure()
        except Exception as exc:  # the table records why a part did not run
            rows.append((part, built["seconds"], what, "", "", f"fail: {type(exc).__name__}: {exc}"[:300]))
            continue
        rows.append((part, built["seconds"], what, f"{diff:.3g}", f"{share:.3g}", "pass" if share <= 1 else "fail"))
    if args.nccl_tests:
        built = builds.get("nccl-tests", {"seconds": "", "status": "not built"})
        try:
            what, wrong = nccl_tests_check(args.nccl_tests)
            verdict = "pass" if built["status"] == "ok" and wrong == 0 else "fail"
            rows.append(("nccl-tests", built["seconds"], f"all_reduce_perf -g 1: {what}", f"{wrong:g} wrong", "",
                         verdict))
        except Exception as exc:
            rows.append(("nccl-tests", built["seconds"], "all_reduce_perf -g 1", "", "",
                         f"fail: {type(exc).__name__}: {exc}"[:300]))
    header = ("part", "built_s", "ran", "largest_difference", "of_allowance", "result")
    with args.out.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    for row in rows:
        print(" | ".join(str(c) for c in row))
    return 0 if all(r[-1] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
