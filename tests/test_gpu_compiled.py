"""The GPU check of the image's compiled parts, checked on CPU with torch's kernels standing in."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_compiled", ROOT / "benchmarks" / "gpu_compiled.py")
gpu_compiled = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_compiled)


def test_layer_norm_difference_tells_a_wrong_kernel_from_a_right_one() -> None:
    # torch's composite layer norm (a different summation from the fused ATen kernel) is within tolerance;
    # a kernel that drops the bias is not.
    def composite(x, w, b):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * w + b

    right = gpu_compiled.layer_norm_difference(composite, torch.float32, "cpu", (64, 128))
    wrong = gpu_compiled.layer_norm_difference(lambda x, w, b: F.layer_norm(x, (128,), w, None, 1e-5),
                                               torch.float32, "cpu", (64, 128))
    assert right[1] <= 1 < wrong[1] and wrong[0] == float("inf")


def test_adam_difference_tells_decoupled_decay_from_l2() -> None:
    same = gpu_compiled.adam_difference(lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01, foreach=False),
                                        "cpu", steps=3, size=1024)
    decoupled = gpu_compiled.adam_difference(lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
                                             "cpu", steps=3, size=1024)
    assert same[1] <= 1 < decoupled[1]


def test_nccl_tests_output_recorded_on_a_gpu_parses_with_no_wrong_elements() -> None:
    what, wrong = gpu_compiled.nccl_tests_check(ROOT / "tests" / "data" / "nccl-tests" / "all_reduce_perf.txt")
    assert wrong == 0 and "rows parsed" in what and "out-of-place algBW up to" in what


def test_a_part_that_did_not_build_or_import_is_a_failed_row(tmp_path: Path, monkeypatch) -> None:
    def missing() -> tuple[float, float]:
        import apex_is_not_here  # noqa: F401
        return 0.0

    monkeypatch.setattr(gpu_compiled, "_checks", lambda device: [
        ("apex", "fused layer norm", lambda: (0.0, 0.0)), ("deepspeed", "FusedAdam", missing)])
    builds = tmp_path / "builds.csv"
    builds.write_text("part,seconds,status\napex,12.5,exit 1\ndeepspeed,30.0,ok\n")
    out = tmp_path / "compiled.csv"
    monkeypatch.setattr("sys.argv", ["gpu_compiled", "--builds", str(builds), "--out", str(out), "--device", "cpu"])
    assert gpu_compiled.main() == 1
    text = out.read_text()
    # The build's exit is the reason, and an import that fails is named, not a traceback.
    assert "apex,12.5,fused layer norm,,,fail: build exit 1" in text
    assert "fail: ModuleNotFoundError: No module named 'apex_is_not_here'" in text
