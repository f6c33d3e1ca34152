"""The original param driver.py as a compute implementation: parser, flags, and a run beside reproflow."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, reproflow

from reproflow.families.param_compute import FAMILY
from reproflow.families.param_compute.datasets import DATASETS
from reproflow.families.param_compute.original import argv, parse_compute
from reproflow.spec.errors import SuiteError
from reproflow.spec.params import resolve
from reproflow.spec.suite import load_suite

DATA = ROOT / "tests" / "data" / "param"
GEMM_C = (DATA / "compute_gemm_C_cpu.txt").read_text()
EMB_B = (DATA / "compute_emb_B_cpu.txt").read_text()
LINEAR_A = (DATA / "compute_linear_A_cpu.txt").read_text()


def test_parses_recorded_gemm_and_emb_output():
    gemm = parse_compute(GEMM_C, "gemm", DATASETS["gemm"]["C"])
    assert [s for s, _ in gemm] == DATASETS["gemm"]["C"] and all(t > 0 for _, t in gemm)
    emb = parse_compute(EMB_B, "emb", DATASETS["emb"]["B"])
    assert emb[0] == ((4800000, 56, 34, 2048), 0.000990)
    linear = parse_compute(LINEAR_A, "linear", DATASETS["linear"]["A"])
    assert linear[0] == ((18, 1024, 1024, 1024, 128), 0.179936)  # param prints 20 = 18 layers + in + out


@pytest.mark.parametrize(
    ("text", "kernel", "words"),
    [
        (GEMM_C.rstrip()[: GEMM_C.rstrip().rindex("\n")], "gemm", "truncated"),   # last line missing
        (GEMM_C.rstrip()[:-12], "gemm", "expected 5 numbers"),                      # cut inside the last line
        (GEMM_C.replace("0.002", "0.0x2", 1), "gemm", "non-numeric"),
        (EMB_B, "gemm", "not param driver.py output for 'gemm'"),
        ((DATA / "comms_all_reduce_w2_gloo.txt").read_text(), "emb", "not param driver.py output"),
    ],
)
def test_damaged_output_gives_a_clear_error_and_no_rows(text, kernel, words):
    with pytest.raises(match=words):
        parse_compute(text, kernel, DATASETS[kernel]["C" if kernel == "gemm" else "B"])


def test_options_map_to_the_drivers_flags():
    linear = resolve(FAMILY.params, {"kernel": "linear", "steps": 7, "warmups": 2, "optimizer": "adagrad",
                                     "implementation": "param"})
    assert argv(linear, "cuda", Path("driver.py"))[2:] == [
        "--steps", "7", "--warmups", "2", "--device", "gpu", "linear", "--dataset", "A", "--dtype", "float",
        "--optimizer", "--optimizer-type", "adagrad"]
    gemm = resolve(FAMILY.params, {"dtype": "tf32", "implementation": "param"})
    assert argv(gemm, "cpu", Path("driver.py"))[-4:] == ["--dataset", "A", "--dtype", "tf32"]


@pytest.mark.parametrize(("params", "words"), [
    ('kernel = "gemm", shapes = [[64, 64, 64]]', "datasets only"),
    ('kernel = "gemm", dataset = "S"', "dataset 'S' is reproflow's"),
    ('kernel = "linear", dtype = "tf32"', "no tf32"),
])
def test_options_the_driver_cannot_honour_are_rejected(write_suite, params, words):
    path = write_suite(f"""
        [[experiment]]
        name = "c"
        family = "param_compute"
        params = {{ {params}, implementation = "param" }}
    """)
    with pytest.raises(SuiteError, match=words):
        load_suite(path)


NEEDS_PARAM = pytest.mark.skipif(not os.environ.get("PARAM_DIR"), reason="set PARAM_DIR to a param checkout "
                                 "(commit 6236487e8969838822b52298c2a2318f6ac47bbd) to run the original driver.py")


@NEEDS_PARAM
def test_datasets_are_params_own():
    spec = importlib.util.spec_from_file_location(
        "param_dataset", Path(os.environ["PARAM_DIR"]) / "train" / "compute" / "pt" / "dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DATASETS["gemm"]["A"] == module.gemm_A and DATASETS["gemm"]["B"] == module.gemm_B
    assert DATASETS["gemm"]["C"] == module.gemm_C and DATASETS["emb"]["A"] == module.emb_A
    assert DATASETS["emb"]["B"] == module.emb_B and DATASETS["linear"]["A"] == module.mlp_A


@pytest.mark.distributed
@NEEDS_PARAM
def test_original_driver_runs_beside_reproflow_in_one_job(write_suite, tmp_path):
    path = write_suite("""
        [launch]
        device = "cpu"
        [[experiment]]
        name = "gemm"
        family = "param_compute"
        params = { kernel = "gemm", dataset = "C", steps = 2, warmups = 1 }
        matrix = { implementation = ["reproflow", "param"] }
    """)
    proc = reproflow("run", str(path), "--results", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "r").rglob("*.csv"))
    tflops = rows[rows["metric"] == "tflops"]
    assert sorted(tflops["implementation"].value_counts().to_dict().items()) == [("param", 4), ("reproflow", 4)]
    original = tflops[tflops["implementation"] == "param"]
    assert original["command"].str.contains("driver.py").all() and original["command"].str.contains("gemm").all()
