"""The run catalog: every `reproflow run` gets an id its rows carry and a manifest written by the invoking
process; `reproflow runs` lists them newest first from an index rebuilt from the files; compare takes
their ids."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import reproflow

pytestmark = pytest.mark.distributed

SUITE = """
[suite]
description = "two collectives, two ranks"
[launch]
backend = "gloo"
device = "cpu"
timeout_s = 60
repeats = 3
[[experiment]]
name = "c"
family = "param_comms"
launch = {{ procs_per_node = 2 }}
params = {{ begin_size = "1K", end_size = "4K", step_factor = 4, warmup_iters = 1, iters = 3 }}
matrix = {{ collective = {collectives} }}
"""


def rows(results: Path) -> pd.DataFrame:
    return pd.concat(pd.read_csv(p) for p in sorted(results.rglob("*.csv")))


def test_runs_are_recorded_listed_and_compared_by_id(tmp_path: Path, write_suite) -> None:
    suite = write_suite(SUITE.format(collectives='["all_reduce", "broadcast"]'), "pair")
    first, second = tmp_path / "first", tmp_path / "second"
    assert reproflow("run", str(suite), "--results", str(first)).returncode == 0
    # A run opened around this one (as `reproflow reproduce` opens one around its steps): joined, no manifest.
    joined = reproflow("run", str(suite), "--results", str(second), env={"REPROFLOW_RUN_ID": "outer-run"})
    assert joined.returncode == 0, joined.stderr
    assert not (second / "runs").exists() and set(rows(second)["run_id"]) == {"outer-run"}

    (manifest,) = (first / "runs").glob("*.json")
    record = json.loads(manifest.read_text())
    assert record["state"] == "completed" and record["exit_code"] == 0 and record["suites"] == [str(suite)]
    assert record["command"][:2] == ["reproflow", "run"] and record["end"] >= record["start"]
    assert set(rows(first)["run_id"]) == {record["run_id"]}

    # A run whose point fails (an injected exception): its manifest says failed, the catalog counts it.
    broken = write_suite(SUITE.format(collectives='["reduce"]'), "broken")
    failed = reproflow("run", str(broken), "--results", str(first), env={"REPROFLOW_INJECT_FAULT": "reduce:raise"})
    assert failed.returncode != 0
    states = sorted(json.loads(p.read_text())["state"] for p in (first / "runs").glob("*.json"))
    assert states == ["completed", "failed"], states

    # Input refused before anything ran: no run recorded, nothing left behind.
    refused = reproflow("run", str(suite), "-e", "nowhere", "--results", str(tmp_path / "refused"))
    assert refused.returncode == 2 and not (tmp_path / "refused").exists()

    listed = reproflow("runs")
    assert listed.returncode == 0, listed.stderr
    ids = [line.split()[0] for line in listed.stdout.splitlines() if not line.startswith((" ", "reproflow:"))]
    assert ids[-1] == record["run_id"] and len(ids) == 2  # newest first; the joined run's folder is not recorded
    assert "2 point(s), 0 failed" in listed.stdout and "param_comms busbw" in listed.stdout
    assert "failed" in listed.stdout.splitlines()[0] and "0 point(s), 1 failed" in listed.stdout
    assert "outer-run" in reproflow("runs", "--results", str(second)).stdout
    only = reproflow("runs", "--suite", "bro*")
    assert only.stdout.count("suites: broken") == 1 and record["run_id"] not in only.stdout
    assert "reproflow: 0 run(s)" in reproflow("runs", "--since", "2999-01-01").stdout
    bad = reproflow("runs", "--since", "yesterday")
    assert bad.returncode == 2 and "--since 'yesterday': give a date as YYYY-MM-DD" in bad.stderr

    # Compared by id (its start is enough) with the joined run's folder: the same points, matched.
    out = tmp_path / "out"
    compared = reproflow("compare", record["run_id"][:17], str(second), "--out", str(out))
    assert compared.returncode == 0, compared.stderr
    assert "0 point(s) in one run only" in compared.stdout
    unknown = reproflow("compare", "20990101-000000", str(second), "--out", str(out))
    assert unknown.returncode == 2 and "not a results folder, an archive or one run's id" in unknown.stderr


def test_a_family_command_that_measured_nothing_leaves_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A family's command that ran no suite (a search on a database) leaves no run and no folder behind; one
    that wrote under its results, and `run` always, keep theirs."""
    from reproflow.store.runs import RUN_ID_ENV, recorded_run

    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    idle = tmp_path / "a" / "results"
    with recorded_run(idle, ["aceso", "search"], suites=[], cluster="c", executor="local", keep_empty=False):
        pass
    assert not (tmp_path / "a").exists()
    busy = tmp_path / "b"
    with recorded_run(busy, ["cfp", "all"], suites=[], cluster="c", executor="local", keep_empty=False):
        (busy / "s" / "e").mkdir(parents=True)
        (busy / "s" / "e" / "p.csv").write_text("x\n")
    (kept,) = (busy / "runs").glob("*.json")
    assert json.loads(kept.read_text())["state"] == "completed"
    with recorded_run(tmp_path / "c", ["run", "s"], suites=["s"], cluster="c", executor="local"):
        pass
    assert len(list((tmp_path / "c" / "runs").glob("*.json"))) == 1
