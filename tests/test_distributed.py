"""End to end through real torch.distributed (gloo) process groups started by reproflow."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT, reproflow
from hypothesis import given
from hypothesis import strategies as st

from reproflow.families.param_comms.sweep import COLLECTIVES, bus_factor
from reproflow.launch.local import run_ranks

pytestmark = pytest.mark.distributed

SUITE = """
[suite]
description = "every collective at three small sizes"
[launch]
backend = "gloo"
device = "cpu"
time_limit = "00:05:00"
timeout_s = 60
[[experiment]]
name = "c"
family = "param_comms"
launch = {{ procs_per_node = {world} }}
params = {{ begin_size = "1K", end_size = "16K", step_factor = 4, warmup_iters = 1, iters = 3 }}
matrix = {{ collective = {collectives} }}
"""


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[int, pd.DataFrame]:
    """Run every collective at world sizes 2, 3 and 4; rows per world size."""
    out = {}
    for world in (2, 3, 4):
        base = tmp_path_factory.mktemp(f"w{world}")
        suite = base / f"w{world}.toml"
        suite.write_text(SUITE.format(world=world, collectives=json.dumps(list(COLLECTIVES))))
        proc = reproflow("run", str(suite), "--results", str(base / "results"))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        files = sorted((base / "results" / f"w{world}" / "c").glob("*.csv"))
        assert len(files) == len(COLLECTIVES)
        out[world] = pd.concat([pd.read_csv(f, dtype={"rank": str}) for f in files])
        out[world].attrs["results"] = base / "results"
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_busbw_uses_the_nccl_tests_factor(sweeps, world):
    rows = sweeps[world]
    assert set(rows["world_size"]) == {world}
    agg = rows[rows["rank"] == "all"].pivot_table(index=["collective", "size_bytes"], columns="metric",
                                                  values="value")
    assert len(agg) == len(COLLECTIVES) * 3
    for (collective, size), r in agg.iterrows():
        assert r["algbw"] == pytest.approx(size / (r["latency_p50_us"] * 1e-6) / 1e9, rel=1e-9)
        assert r["busbw"] == pytest.approx(r["algbw"] * bus_factor(collective, world), rel=1e-9)
        assert r["wrong_elements"] == 0, (collective, size)
        assert r["latency_min_us"] <= r["latency_p50_us"] <= r["latency_p95_us"] <= r["latency_max_us"]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_latency_percentiles_are_across_ranks(sweeps, world):
    rows = sweeps[world]
    for (_, _), group in rows.groupby(["collective", "size_bytes"]):
        per_rank = group[group["metric"] == "time_us"]
        assert sorted(per_rank["rank"].astype(int)) == list(range(world))
        p50 = group[(group["metric"] == "latency_p50_us")]["value"].item()
        assert p50 == pytest.approx(per_rank["value"].median(), rel=1e-9)
        assert (per_rank["value"] > 0).all()


def test_rows_carry_schema_and_provenance(sweeps):
    rows = sweeps[2]
    for column in ("schema_version", "suite", "experiment", "family", "point", "collective", "begin_size",
                   "metric", "value", "unit", "repeat", "rank", "job_id", "nodelist", "world_size", "backend",
                   "device", "torch_version", "git_commit", "image", "timestamp"):
        assert column in rows.columns, column
    assert rows["job_id"].str.startswith("local-").all()
    assert set(rows["backend"]) == {"gloo"} and rows["torch_version"].str.startswith("2.13").all()
    assert rows["nodelist"].notna().all()


def test_report_writes_tables_and_figures(sweeps, tmp_path):
    results = sweeps[3].attrs["results"]
    proc = reproflow("report", "--results", str(results), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "param_comms_table.csv")
    assert set(table["collective"]) == set(COLLECTIVES)
    for collective in COLLECTIVES:
        png = tmp_path / f"param_comms_busbw_{collective}.png"
        assert png.stat().st_size > 10_000 and (tmp_path / f"param_comms_busbw_{collective}.pdf").exists()
    assert "| collective |" in (tmp_path / "param_comms_table.md").read_text()


def test_timed_loop_matches_an_independent_bare_loop(tmp_path):
    """reproflow's latency is the time of real collectives: close to a bare torch.distributed loop."""
    cmd = [sys.executable, str(ROOT / "tests" / "rank_timing_probe.py"), str(1 << 20), "10", "5"]
    proc = subprocess.run([sys.executable, "-c", "import sys, json; from pathlib import Path; "
                           "from reproflow.launch.local import run_ranks; "
                           f"sys.exit(run_ranks({cmd!r}, 2, Path({str(tmp_path)!r})))"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # A 1 MiB all_reduce over gloo takes milliseconds; timing nothing would give microseconds.
    assert got["bare"] > 1e-4 and got["bare_blocking"] > 1e-4
    assert 0.33 < got["ours"] / got["bare"] < 3.0, got
    assert 0.33 < got["ours_blocking"] / got["bare_blocking"] < 3.0, got


def test_run_ranks_stops_the_others_when_one_rank_fails(tmp_path):
    code = run_ranks([sys.executable, "-c", "import os, sys, time; r = int(os.environ['RANK']); "
                      "sys.exit(5) if r == 1 else time.sleep(60)"], 3, tmp_path, limit_s=50)
    assert code == 5


def test_the_rank_a_signal_killed_is_named_before_a_rank_seen_failing_first(tmp_path, capfd):
    """Rank 0 exits 1 (as a rank whose peer vanished mid-collective does) before rank 1 is killed by
    SIGSEGV: the signal is the cause, its exit code returned and its rank named, rank 0 as failing too."""
    ready = tmp_path / "rank1-started"
    code = run_ranks([sys.executable, "-c", "import os, signal, sys, time; from pathlib import Path; "
                      f"ready = Path({str(ready)!r}); r = int(os.environ['RANK'])\n"
                      "if r == 0:\n    while not ready.exists(): time.sleep(0.01)\n    sys.exit(1)\n"
                      "ready.touch(); time.sleep(0.2); os.kill(os.getpid(), signal.SIGSEGV)"],
                     2, tmp_path / "logs", limit_s=50)
    err = capfd.readouterr().err
    assert code == -signal.SIGSEGV, err
    assert re.search(r"rank 1 on \S+ \(pid \d+\) failed, with signal 11 \(SIGSEGV\)", err), err
    # Rank 0 exited before the SIGSEGV; on a loaded machine it may still be seen running, then stopped.
    assert "; rank 0 failed too, with exit code 1; " in err or "rank(s) [0] were still running" in err, err


@given(st.lists(st.sampled_from([1, 2, 17, -6, -9, -11]), min_size=1, max_size=8))
def test_the_cause_is_the_first_failed_rank_a_signal_killed_else_the_first_seen(codes: list[int]) -> None:
    """Exit codes in the order the ranks were seen failing: every one is kept, the first negative (a
    signal) leads, the rest keep their order."""
    from types import SimpleNamespace

    from reproflow.launch.local import _cause_first

    procs = [SimpleNamespace(returncode=c) for c in codes]
    order = _cause_first(procs, list(range(len(codes))))
    signalled = [i for i, c in enumerate(codes) if c < 0]
    assert order[0] == (signalled[0] if signalled else 0)
    assert order[1:] == [i for i in range(len(codes)) if i != order[0]]


@pytest.mark.parametrize(("startup_s", "code"), [(None, 124), (3.0, 125)])
def test_ranks_that_record_no_stage_meet_the_start_up_bound_only_where_one_is_given(tmp_path, startup_s, code):
    """A command that is not reproflow's worker records no stage: without startup_s only the time limit
    stops it (124); with one, it never reached a first point (125)."""
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert run_ranks(sleep, 2, tmp_path, limit_s=6, startup_s=startup_s) == code


def test_runners_timed_together_take_turns_each_round(tmp_path) -> None:
    """interleaved_steps: warm-up rounds, then one step of every runner a round, so a drift reaches all alike."""
    import torch
    import torch.distributed as dist

    from reproflow.rank.context import RunContext
    from reproflow.rank.timing import interleaved_steps

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ctx = RunContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo",
                         hostname="h", host_size=1)
        calls: list[str] = []
        clock = iter(range(1, 100))

        def runner(name: str):
            def step() -> float:
                calls.append(name)
                return float(next(clock))
            return step

        times = interleaved_steps(ctx, {"a": runner("a"), "b": runner("b")}, warmup=1, count=3)
        # A turn: one untimed step, then two timed (one where one is left); each round starts one runner later.
        assert calls == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["b"] * 2 + ["a"] * 2
        assert times == {"a": [4.0, 5.0, 12.0], "b": [7.0, 8.0, 10.0]}
        calls.clear()
        assert interleaved_steps(ctx, {"a": runner("a")}, warmup=1, count=3) == {"a": [14.0, 15.0, 16.0]}
        assert calls == ["a"] * 4  # alone: no untimed step but the warm-up
    finally:
        dist.destroy_process_group()


def test_profile_passes_go_on_until_their_seconds(tmp_path) -> None:
    """time_passes: `repeats` passes after `warmup`, or more until the timed ones take `seconds`."""
    import time

    import torch
    import torch.distributed as dist

    from reproflow.families.aceso.profile import Prepared, time_passes
    from reproflow.rank.context import RunContext

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ctx = RunContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo",
                         hostname="h", host_size=1)
        w, x = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
        calls: list[int] = []

        def forward() -> tuple[torch.Tensor, ...]:
            calls.append(1)
            time.sleep(0.01)
            return (x * w,)

        op = Prepared(forward, [x], [w], [torch.ones(3)], {})
        (plain,) = time_passes(ctx, [op], warmup=1, repeats=2)
        assert len(calls) == 3 and plain["forward-compute"] >= 10_000
        calls.clear()
        time_passes(ctx, [op], warmup=1, repeats=2, seconds=0.2)
        # Every timed pass sleeps 10 ms: at most 20 of them reach 0.2 s, and 2 do not.
        assert 3 < len(calls) <= 21, len(calls)
    finally:
        dist.destroy_process_group()
