"""param compute family on one gloo rank: the rates are work / measured time."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import reproflow

from reproflow.families import param_compute
from reproflow.spec.errors import NotApplicable
from reproflow.spec.params import resolve

pytestmark = pytest.mark.distributed

SUITE = """
[launch]
device = "cpu"
time_limit = "00:05:00"
[[experiment]]
name = "gemm"
family = "param_compute"
params = { kernel = "gemm", shapes = [[64, 128, 32], [256, 256, 256]], steps = 3, warmups = 1 }
matrix = { dtype = ["float32", "bfloat16"] }
[[experiment]]
name = "emb"
family = "param_compute"
params = { kernel = "emb", shapes = [[10000, 16, 4, 64]], steps = 3, warmups = 1 }
[[experiment]]
name = "mlp"
family = "param_compute"
params = { kernel = "linear", shapes = [[2, 64, 128, 32, 16]], steps = 3, warmups = 1, optimizer = "adagrad" }
"""


def test_gemm_emb_and_mlp_rates_follow_from_time(write_suite, tmp_path):
    results = tmp_path / "results"
    proc = reproflow("run", str(write_suite(SUITE)), "--results", str(results))
    assert proc.returncode == 0, proc.stderr
    assert "Rate(TF/s)" in proc.stdout and "BW(GB/s)" in proc.stdout
    rows = pd.concat(pd.read_csv(p, dtype={"rank": str}) for p in results.rglob("*.csv"))
    agg = rows[rows["rank"] == "all"]

    def metric(kernel, name):
        return agg[(agg["kernel"] == kernel) & (agg["metric"] == name)]

    gemm_t, gemm_r = metric("gemm", "time_p50_s"), metric("gemm", "tflops")
    # bfloat16 is measured only where the CPU has bfloat16 arithmetic; elsewhere the point says why not.
    native = bool(param_compute.cpu_flags() & set(param_compute.HALF_FLAGS["bfloat16"]))
    assert len(gemm_r) == (4 if native else 2)
    assert native or "dtype=bfloat16: not applicable here: bfloat16 matmuls on this CPU are emulated" in proc.stdout
    for (_, t), (_, r) in zip(gemm_t.iterrows(), gemm_r.iterrows(), strict=True):
        assert r["value"] * 1e12 * t["value"] == pytest.approx(2 * r["m"] * r["n"] * r["k"], rel=1e-9)
    emb = metric("emb", "bandwidth").iloc[0]
    assert emb["value"] * 1e9 * metric("emb", "time_p50_s").iloc[0]["value"] == pytest.approx(64 * 4 * 16 * 4)
    mlp = metric("linear", "tflops").iloc[0]
    flops = 6 * 16 * (64 * 128 + 128 * 128 + 128 * 32)
    assert mlp["value"] * 1e12 * metric("linear", "time_p50_s").iloc[0]["value"] == pytest.approx(flops)
    report = reproflow("report", "--results", str(results), "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "rep" / "param_compute_gemm_tflops.png").stat().st_size > 10_000
    assert (tmp_path / "rep" / "param_compute_linear.md").exists()


def test_dataset_and_shape_rules_fail_before_running(write_suite):
    bad = SUITE.replace('shapes = [[10000, 16, 4, 64]]', 'dataset = "C"')
    proc = reproflow("run", str(write_suite(bad)))
    assert proc.returncode == 2 and "dataset 'C' does not exist for kernel 'emb'" in proc.stderr


def test_half_precision_matmuls_are_not_applicable_on_cpus_without_them(monkeypatch):
    cpu = SimpleNamespace(device=SimpleNamespace(type="cpu"))
    params = resolve(param_compute.FAMILY.params, {"kernel": "gemm", "dtype": "bfloat16"})
    monkeypatch.setattr(param_compute, "cpu_flags", lambda: {"avx2", "fma"})
    with pytest.raises(NotApplicable, match="none of avx512_bf16, amx_bf16, avx_ne_convert"):
        param_compute.runtime_check(params, cpu)
    param_compute.runtime_check({**params, "dtype": "float32"}, cpu)
    param_compute.runtime_check(params, SimpleNamespace(device=SimpleNamespace(type="cuda")))
    monkeypatch.setattr(param_compute, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    param_compute.runtime_check(params, cpu)
