"""Nothing measured is lost: atomic point files, skip-done reruns, failed and crashed points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import reproflow

from reproflow.results import atomic_write

pytestmark = pytest.mark.distributed

SUITE = """
[launch]
backend = "gloo"
device = "cpu"
timeout_s = 60
time_limit = "00:05:00"
[[experiment]]
name = "c"
family = "param_comms"
launch = { procs_per_node = 2 }
params = { begin_size = "1K", end_size = "2K", warmup_iters = 1, iters = 2 }
matrix = { collective = ["all_reduce", "broadcast", "reduce", "send_recv"] }
"""


def _files(results: Path) -> dict[str, Path]:
    return {p.name.split("-w")[0]: p for p in (results / "tiny" / "c").glob("*.csv")}


def test_atomic_write_replaces_whole_files(tmp_path):
    target = tmp_path / "a" / "x.csv"
    atomic_write(target, "one\n")
    atomic_write(target, "two\n")
    assert target.read_text() == "two\n"
    assert [p.name for p in target.parent.iterdir()] == ["x.csv"]


def test_rerun_skips_done_points_and_force_measures_again(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    first = reproflow("run", str(suite), "--results", str(results))
    assert first.returncode == 0, first.stderr
    stamps = {k: p.stat().st_mtime_ns for k, p in _files(results).items()}
    assert len(stamps) == 4
    second = reproflow("run", str(suite), "--results", str(results))
    assert second.returncode == 0 and "0 to run, 4 already done" in second.stdout
    assert {k: p.stat().st_mtime_ns for k, p in _files(results).items()} == stamps
    third = reproflow("run", str(suite), "--results", str(results), "--force")
    assert third.returncode == 0 and "4 to run" in third.stdout
    assert all(p.stat().st_mtime_ns != stamps[k] for k, p in _files(results).items())


def test_a_failed_point_leaves_the_others_intact(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "collective=broadcast:raise:1"})
    assert proc.returncode == 3, proc.stderr
    assert set(_files(results)) == {"collective=all_reduce", "collective=reduce", "collective=send_recv"}
    failed = list((results / "tiny" / "c").glob("*.failed.json"))
    assert len(failed) == 1 and "rank 1: injected fault" in json.loads(failed[0].read_text())["error"]
    status = reproflow("status", "--results", str(results))
    assert "tiny/c: 3 point(s) measured, 1 failed" in status.stdout
    again = reproflow("run", str(suite), "--results", str(results))
    assert again.returncode == 0 and "1 to run, 3 already done" in again.stdout
    assert len(_files(results)) == 4 and not list((results / "tiny" / "c").glob("*.failed.json"))


def test_a_crashed_rank_keeps_finished_points_and_a_rerun_resumes(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "collective=reduce:exit:1"})
    assert proc.returncode not in (0, 3)
    assert set(_files(results)) == {"collective=all_reduce", "collective=broadcast"}
    assert not [p for p in (results / "tiny" / "c").iterdir() if p.name.startswith(".")]
    again = reproflow("run", str(suite), "--results", str(results))
    assert again.returncode == 0 and "2 to run, 2 already done" in again.stdout
    assert len(_files(results)) == 4
