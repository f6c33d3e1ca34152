"""The resharding family end to end on gloo with emulated hosts: every case of both suites in every
configuration passes the tile check, the seed's single-case command, plans, and bad input."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, reproflow

from reproflow.launch.local import run_ranks

pytestmark = pytest.mark.distributed
# Smallest scale every case divides into (dim 0 of 1024 / 128 = 8 rows); 2 runs, 1 dropped.
TINY = ["--set", "scale=128", "--set", "runs=2", "--set", "warmup_runs=1"]


def test_both_suites_pass_the_tile_check_in_every_configuration(tmp_path: Path) -> None:
    results, reports = tmp_path / "results", tmp_path / "reports"
    proc = reproflow("run", "resharding", "--results", str(results), *TINY, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    points = 7 * 4 + 9 * 8
    assert proc.stdout.count("tiles correct") == points
    files = list((results / "resharding").rglob("*.csv"))
    assert len(files) == points and not list((results / "resharding").rglob("*.failed.json"))
    rows = pd.concat(pd.read_csv(f) for f in files)
    assert (rows[rows["metric"] == "wrong_elements"]["value"] == 0).all()
    assert len(rows[rows["metric"] == "run_time"]) == points * 2
    means = rows[rows["metric"] == "exec_time_mean"]
    assert len(means) == points and (means["value"] > 0).all()
    # exec_time_mean is the mean of the kept runs (the second of two here).
    kept = rows[(rows["metric"] == "run_time") & (rows["kept"].astype(str) == "True")]
    assert sorted(kept["value"].round(12)) == sorted(means["value"].round(12))

    report = reproflow("report", "--results", str(results), "--out", str(reports))
    assert report.returncode == 0, report.stderr
    one = json.loads((reports / "resharding_1_to_m_result.json").read_text())
    many = json.loads((reports / "resharding_n_to_m_result.json").read_text())
    assert len(one) == 7 * 4 and len(many) == 9 * 8
    assert {r["resharding_mode"] for r in one} == {"send_recv", "ring_broadcast", "broadcast"}
    assert set(many[0]) == {"src_mesh_shape", "dst_mesh_shape", "src_sharding_spec", "dst_sharding_spec",
                            "tensor_shape", "resharding_mode", "use_local_allgather", "resharding_loadbalance_mode",
                            "exec_time_mean", "exec_time_var"}
    for name in ("resharding_1_to_m.png", "resharding_n_to_m.png", "resharding_n_to_m_speedup.md",
                 "resharding_1_to_m_ratios.md"):
        assert (reports / name).stat().st_size > 0
    speedup = pd.read_csv(reports / "resharding_n_to_m_speedup.csv")
    assert list(speedup["case"]) == [f"case{i}" for i in range(1, 10)]
    ratios = pd.read_csv(reports / "resharding_1_to_m_ratios.csv")
    assert len(ratios) == 7 * 2 and (ratios["low"] <= ratios["send_recv_over"]).all()

    # The claims alone, again from the rows: the six cases with 2+ receivers, the ring against each send/recv;
    # each step up in receiving hosts of 2 devices; the nine n-to-m cases, no load balancing against by order.
    again = reproflow("report", "--results", str(results), "--out", str(reports), "--claims-only")
    assert again.returncode == 0, again.stderr
    for statement in ("broadcast resharding is faster", "broadcast's advantage over send/recv grows",
                      "load balancing by order is at least"):
        assert re.search(rf"^(holds|does not hold|inconclusive|not applicable here) +resharding +{statement}",
                         again.stdout, re.M)
    claims = pd.read_csv(reports / "claims.csv")
    claims = claims[claims["family"] == "resharding"].set_index("claim")
    faster, grows, order = (claims.loc[claims.index.str.startswith(s)].iloc[0] for s in
                            ("broadcast resharding", "broadcast's advantage", "load balancing"))
    cases = {name: c["cases"].split("; ") for name, c in (("faster", faster), ("grows", grows), ("order", order))}
    assert len(cases["faster"]) == 12 and cases["faster"][0].startswith("1-to-1x2 against send_recv ")
    assert [re.match(r"(1-to-\S+ over 1-to-\S+) ", c)[1] for c in cases["grows"]] == [
        "1-to-2x2 over 1-to-1x2", "1-to-3x2 over 1-to-2x2", "1-to-4x2 over 1-to-3x2"]
    assert len(cases["order"]) == 9 and {c["threshold"] for c in (faster, grows, order)} == {">= 1"}


def test_seed_command_runs_one_case_and_skips_it_next_time(tmp_path: Path) -> None:
    args = ["resharding", "--suite", "1-to-m", "--n-nodes", "1", "--gpu-per-node", "4", "--resharding-mode",
            "send_recv", "--resharding-loadbalance-mode", "normal", "--use-local-allgather", "--nodes", "2",
            "--results", str(tmp_path), "--set", "scale=1024"]
    first = reproflow(*args)
    assert first.returncode == 0, first.stderr
    assert "1-to-1x4" in first.stdout and "+ local all-gather" in first.stdout
    (path,) = (tmp_path / "resharding" / "1-to-m").glob("*.csv")
    rows = pd.read_csv(path)
    assert set(rows["case"]) == {"1-to-1x4"} and set(rows["use_local_allgather"]) == {True}
    assert rows[rows["metric"] == "unit_tasks"]["value"].item() == 4  # a quarter to each receiver
    again = reproflow(*args)
    assert again.returncode == 0 and "0 to run, 1 already done" in again.stdout


def test_too_few_hosts_fails_the_point_and_says_how_many(tmp_path: Path) -> None:
    proc = reproflow("resharding", "--suite", "n-to-m", "--case", "case1", "--resharding-mode", "broadcast",
                     "--resharding-loadbalance-mode", "no_loadbalance", "--nodes", "1", "--results", str(tmp_path),
                     *TINY)
    assert proc.returncode == 3
    (failure,) = (tmp_path / "resharding" / "n-to-m").glob("*.failed.json")
    assert "needs 4 hosts (2 source + 2 destination); the job has 1" in json.loads(failure.read_text())["error"]


@pytest.mark.parametrize("mode", ["send_recv", "broadcast", "ring_broadcast"])
def test_the_tile_check_finds_misplaced_tiles(tmp_path: Path, capfd: pytest.CaptureFixture[str], mode: str) -> None:
    probe = [sys.executable, str(ROOT / "tests" / "resharding_probe.py")]
    assert run_ranks([*probe, "exact", mode], 6, tmp_path / "a", host_size=2) == 0
    assert "runs=2 wrong=0" in capfd.readouterr().out
    assert run_ranks([*probe, "swap", mode], 6, tmp_path / "b", host_size=2) == 0
    # Ranks 2 and 4 each hold 24 elements of the other half.
    assert "runs=2 wrong=48" in capfd.readouterr().out


@pytest.mark.parametrize("chunk", [20, 8, 4])
def test_ring_broadcast_delivers_every_slice_exactly_in_uneven_chunks(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                                      chunk: int) -> None:
    # 8x6 replicated on 4 ranks of 2 hosts: two column halves of 24 elements, each down a chain of 4
    # receivers into a non-contiguous part of their tile, in chunks of 5 (the last 4), 2 or 1 elements.
    probe = [sys.executable, str(ROOT / "tests" / "resharding_probe.py"), "exact", "ring_broadcast", str(chunk), "R,R"]
    assert run_ranks(probe, 6, tmp_path, host_size=2) == 0
    assert "runs=2 wrong=0" in capfd.readouterr().out


def test_explain_prints_every_plan_without_running() -> None:
    proc = reproflow("run", "resharding", "--explain")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n  case ") == 7 * 4 + 9 * 8 and "cannot plan" not in proc.stdout
    assert "unit tasks: 64 = 64 x (1 -> 1, 256 KiB)" in proc.stdout  # case4 at the local scale


@pytest.mark.parametrize(("args", "message"), [
    (["--suite", "1-to-m", "--n-nodes", "2", "--gpu-per-node", "3"], "no destination mesh 2x3"),
    (["--suite", "n-to-m", "--case", "case10"], "--case case10 is not an n-to-m case"),
    (["--suite", "n-to-m"], "--case (missing)"),
    (["--suite", "1-to-m", "--case", "case1"], "--case belongs to --suite n-to-m"),
])
def test_seed_command_rejects_bad_options_without_a_traceback(args: list[str], message: str) -> None:
    proc = reproflow("resharding", *args, "--resharding-mode", "send_recv", "--resharding-loadbalance-mode",
                     "normal", "--explain")
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
