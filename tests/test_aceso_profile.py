"""Aceso's op profiler end to end: GPT ops really run on 1 and 2 gloo ranks, their rows become the
reference's database files, and the performance model and search read them back."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import reproflow

from reproflow.families.aceso.costmodel import CostModel
from reproflow.families.aceso.database import AFTER_TRAINING, OP_COLUMNS, read_database, write_from_rows
from reproflow.families.aceso.models import model
from reproflow.families.aceso.plans import best_feasible, megatron_plans
from reproflow.families.aceso.transformer_ops import GPT_OPS as OPS
from reproflow.families.aceso.transformer_ops import T5_OPS
from reproflow.reporting.report import load_results

pytestmark = pytest.mark.distributed

SUITE = """
[launch]
backend = "gloo"
device = "cpu"
time_limit = "00:10:00"
[[experiment]]
name = "tp1"
family = "aceso"
launch = { procs_per_node = 1 }
params = { model = "gpt", size = "tiny", seq_len = 64, warmup = 1, repeats = 2 }
matrix = { mbs = [1, 2], algo = [0, 1] }
[[experiment]]
name = "tp2"
family = "aceso"
launch = { procs_per_node = 2 }
params = { model = "gpt", size = "tiny", seq_len = 64, warmup = 1, repeats = 2 }
matrix = { mbs = [1, 2], algo = [0, 1] }
[[experiment]]
name = "resnet"
family = "aceso"
launch = { procs_per_node = 2 }
params = { model = "resnet", size = "tiny", seq_len = 32, warmup = 1, repeats = 1, mbs = 8 }
matrix = { algo = [0, 1] }
[[experiment]]
name = "t5"
family = "aceso"
launch = { procs_per_node = 2 }
params = { model = "t5", size = "tiny", seq_len = 32, warmup = 1, repeats = 1, mbs = 1 }
[[experiment]]
name = "comm"
family = "aceso"
launch = { procs_per_node = 2 }
params = { model = "gpt", size = "tiny", warmup = 1, repeats = 2, sizes_mb = "0-2,4", p2p_max_mb = 4 }
matrix = { kind = ["collectives", "p2p"] }
"""


@pytest.mark.timing
def test_profiled_database_round_trip(write_suite, tmp_path: Path) -> None:
    results, db = tmp_path / "results", tmp_path / "db"
    run = reproflow("run", str(write_suite(SUITE)), "--results", str(results))
    assert run.returncode == 0, run.stderr[-3000:]
    made = reproflow("aceso", "database", "--results", str(results), "--out", str(db))
    assert made.returncode == 0, made.stderr
    resnet = list(csv.reader((db / "resnet_tiny_mbs8_tp2_algo1.csv").open()))
    assert len(resnet) == 1 + 4 + 4 * 8 + 2 and resnet[-1][0] == "fc"  # stem, 4 blocks, avgpool + fc
    conv = {r[0]: float(r[5]) for r in resnet[1:]}
    # block-0-0-conv2: 3x3, 16 -> 32 channels, input channels split over 2 ranks (algo 1): 32x8x3x3 fp32
    assert conv["block-0-0-conv2"] == pytest.approx(32 * 8 * 9 * 4 / 2**20, abs=1e-3)
    t5 = [r[0] for r in list(csv.reader((db / "t5_tiny_mbs1_tp2_algo0.csv").open()))[1:]]
    assert t5 == list(T5_OPS) and len(t5) == 39  # as the reference's T5 files
    files = sorted(p.name for p in db.glob("gpt_tiny_*.csv"))
    assert files == sorted(f"gpt_tiny_mbs{m}_tp{t}_algo{a}.csv" for m in (1, 2) for t in (1, 2) for a in (0, 1))
    for prim in ("all_gather", "all_reduce", "reduce_scatter", "all_to_all"):
        table = list(csv.reader((db / f"prim_gpt_tiny_{prim}_2gpus.csv").open()))
        assert table[0] == ["data_size(MB)", "time(ms)"] and [r[0] for r in table[1:]] == ["0", "1", "2", "4"]
        assert all(float(r[1]) > 0 for r in table[1:])
    sizes, bandwidth = list(csv.reader((db / "p2p_intra_node.csv").open()))
    assert sizes == ["1", "2", "4"] and all(float(b) > 0 for b in bandwidth)
    header, (link, latency) = list(csv.reader((db / "p2p_latency.csv").open()))
    assert header == ["link", "latency(us)"] and link == "intra" and float(latency) > 0
    rows = list(csv.reader((db / "gpt_tiny_mbs2_tp1_algo0.csv").open()))
    assert tuple(rows[0]) == OP_COLUMNS and [r[0] for r in rows[1:]] == list(OPS)
    values = {r[0]: [float(x) for x in r[1:]] for r in rows[1:]}
    assert all(v[0] > 0 and v[1] > 0 for v in values.values())  # forward and backward were timed
    # Sizes (MB, float32 on CPU): hidden [64, 2, 256] = 0.125 MB; qkv weights 3 x 256 x 256 + bias.
    assert values["enc-1st-layernorm"][2] == pytest.approx(0.125)  # input
    assert values["enc-1st-layernorm"][3] == pytest.approx(0.25)  # output + the residual it carries
    assert values["enc-attention-qkv"][4] == pytest.approx((3 * 256 * 256 + 3 * 256) * 4 / 2**20, abs=1e-3)
    tp2 = {r[0]: float(r[5]) for r in list(csv.reader((db / "gpt_tiny_mbs2_tp2_algo0.csv").open()))[1:]}
    assert tp2["enc-MLP-GEMM-1"] == pytest.approx(values["enc-MLP-GEMM-1"][4] / 2, abs=1e-3)  # weights split
    # The rows of a profile taken again right after a training (newer) make a database of their own and
    # never replace the one a search read.
    frame = load_results(results)
    later = frame.assign(suite=frame["suite"] + AFTER_TRAINING + "-20", value=frame["value"] * 2,
                         timestamp="2099-01-01T00:00:00+00:00")
    write_from_rows(pd.concat([frame, later]), tmp_path / "again")
    name = "gpt_tiny_mbs2_tp1_algo0.csv"
    assert (tmp_path / "again" / name).read_text() == (db / name).read_text()
    write_from_rows(pd.concat([frame, later]), tmp_path / "after", after_training=True)
    doubled = {r[0]: float(r[1]) for r in list(csv.reader((tmp_path / "after" / name).open()))[1:]}
    assert doubled["enc-MLP-GEMM-1"] == pytest.approx(2 * values["enc-MLP-GEMM-1"][0], rel=1e-3)

    m = model("gpt", "tiny")
    database = read_database(db, m, [1, 2], 2)
    assert database.intra_band and database.collective_ms("all_gather", 2, 1.2) < 100000
    cost = CostModel(database, 2, 10000)
    plan = best_feasible(megatron_plans(cost, m.full_op_list(database.ops), 16, 2, 2, range(1, 3)), 10000)
    assert plan is not None and plan.prediction.iteration_ms > 0
    # The runtime model adds each stage's gradient all-reduce and optimizer step (profiled per op) to the pipeline.
    steps = {r[0]: float(r[1]) for r in list(csv.reader((db / "opt_gpt_tiny_tp1.csv").open()))[1:]}
    assert steps["enc-MLP-GEMM-1"] > 0 and steps["enc-attention-softmax"] == 0  # no weights, no step
    runtime = CostModel(database, 2, 10000, kind="runtime").predict(plan.config)
    assert all(ms > 0 for ms in runtime.outside_ms)
    assert runtime.iteration_ms == pytest.approx(plan.prediction.iteration_ms + max(runtime.outside_ms), rel=0.2)
    assert runtime.iteration_ms > plan.prediction.iteration_ms
    search = reproflow("aceso", "search", "--model-name", "gpt", "--model-size", "tiny", "--global-batch-size", "16",
                       "--micro-batch-size", "1", "2", "--num-nodes", "1", "--num-gpus-per-node", "2",
                       "--memory-limit", "10000", "--profiled-time-path", str(db), "--config-save-path",
                       str(tmp_path / "configs"), "--budget-cases", "300")
    assert search.returncode == 0, search.stderr
    assert "at least as fast as the uniform plan" in search.stdout


def test_profiler_rejects_what_it_cannot_profile(write_suite, tmp_path: Path) -> None:
    proc = reproflow("run", str(write_suite(SUITE.replace("procs_per_node = 2", "procs_per_node = 3"))),
                     "--results", str(tmp_path), "-e", "tp2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "heads (4) does not split over 3 TP ranks" in proc.stderr


def test_profile_command_writes_the_database(tmp_path: Path) -> None:
    args = ["aceso", "profile", "--prof-model-name", "resnet", "--prof-model-size", "tiny", "--prof-seq-len", "32",
            "--prof-mbs-list", "8", "--prof-tp-size", "1", "--prof-warmup-times", "1", "--prof-repeat-times", "1",
            "--results", str(tmp_path / "results"), "--prof-path", str(tmp_path / "db")]
    dry = reproflow(*args, "--dry-run")
    assert dry.returncode == 0 and "mbs=8,algo=0" in dry.stdout and not (tmp_path / "db").exists()
    proc = reproflow(*args)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "db").glob("*.csv")) == [
        "opt_resnet_tiny_tp1.csv", "resnet_tiny_mbs8_tp1_algo0.csv", "resnet_tiny_mbs8_tp1_algo1.csv"]
    again = reproflow(*args)
    assert again.returncode == 0 and "0 to run, 2 already done" in again.stdout


def test_profile_on_two_emulated_hosts_times_their_link(tmp_path: Path) -> None:
    """--prof-num-nodes 2 with --network: the ops on both hosts, then P2P between them, written as the
    inter-node table, which the shaped link bounds."""
    from reproflow.launch.network import EmulatedNetwork

    why = EmulatedNetwork.unavailable()
    if why:
        pytest.skip(why)
    db = tmp_path / "db"
    proc = reproflow("aceso", "profile", "--prof-model-name", "resnet", "--prof-model-size", "tiny",
                     "--prof-seq-len", "32", "--prof-mbs-list", "8", "--prof-tp-size", "1", "--prof-warmup-times", "1",
                     "--prof-repeat-times", "1", "--prof-num-nodes", "2", "--network", "200mbit",
                     "--results", str(tmp_path / "results"), "--prof-path", str(db))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 ranks on" in proc.stdout and "200 Mbit/s per host" in proc.stdout
    assert not (db / "p2p_intra_node.csv").exists()
    sizes, gbps = list(csv.reader((db / "p2p_inter_node.csv").open()))
    assert sizes[0] == "1" and all(0 < float(x) <= 0.026 for x in gbps), gbps  # 200 Mbit/s = 0.025 GB/s
    assert [row[0] for row in csv.reader((db / "p2p_latency.csv").open())] == ["link", "inter"]


def test_backward_starts_from_what_an_op_computes() -> None:
    """An input handed on unchanged (a residual, the encoder's output) is not where an op's timed
    backward starts: training passes its gradient through for free."""
    from reproflow.families.aceso.profile import computed

    x, residual, ids = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True), torch.arange(3)
    y = x * 2
    starts = computed((y, residual, ids), [x, residual])
    assert len(starts) == 1 and starts[0] is y
    assert computed((residual,), [x]) == [residual]  # an input of another op is not handed on by this one


def test_the_small_setting_measures_its_one_link_once(tmp_path: Path) -> None:
    """Every model of the small setting runs on the same two emulated hosts: their link's P2P is profiled
    with the first model only, and the shared database keeps it for the others."""
    proc = reproflow("aceso", "reproduce", "small", "--dry-run", "--results", str(tmp_path / "r"),
                     "--log-path", str(tmp_path / "l"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("==== ") == 4 and proc.stdout.count("--experiment p2p-inter-node") == 1, proc.stdout
    assert proc.stdout.index("--experiment p2p-inter-node") < proc.stdout.index("==== t5 tiny")


def test_a_global_batch_of_ones_own_is_checked_against_every_micro_batch(tmp_path: Path) -> None:
    """--global-batch-size: each model's micro-batches must divide it (the error names the multiple to
    give); the searches on a profiled database keep the artifact's batch."""
    folders = ["--results", str(tmp_path / "r"), "--log-path", str(tmp_path / "l")]
    proc = reproflow("aceso", "reproduce", "small", "--models", "resnet", "--global-batch-size", "24", "--dry-run",
                     *folders)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--global-batch-size 24: resnet's micro-batches 4, 8, 16 must each divide it; give a multiple of 16" \
        in proc.stderr, proc.stderr
    proc = reproflow("aceso", "reproduce", "large", "--profiled-time-path", str(tmp_path), "--global-batch-size",
                     "64", *folders)
    assert proc.returncode == 2 and "keep the artifact's batch" in proc.stderr, proc.stderr
    proc = reproflow("aceso", "reproduce", "small", "--models", "resnet", "--global-batch-size", "32", "--dry-run",
                     *folders)
    assert proc.returncode == 0, proc.stderr
