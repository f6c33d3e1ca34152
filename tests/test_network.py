"""The emulated network of local runs: rates parsed with clear errors, and a real shaped link (network
namespaces, a bridge, tc) that bounds a transfer between two emulated hosts, recorded in every row."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import reproflow

from reproflow.launch.local import LocalExecutor
from reproflow.launch.network import OWNERS, PREFIX_ENV, UNSHAPED, EmulatedNetwork, parse_rate
from reproflow.spec.errors import ReproflowError
from reproflow.spec.suite import load_suite


@pytest.mark.parametrize(("text", "mbit"), [("1gbit", 1000.0), ("200mbit", 200.0), ("200", 200.0),
                                            ("1.5Gbit", 1500.0), ("500kbit", 0.5), ("100 Mbit/s", 100.0)])
def test_rates(text: str, mbit: float) -> None:
    assert parse_rate(text) == pytest.approx(mbit)


@pytest.mark.parametrize("text", ["fast", "0mbit", "-1gbit", "1 tbit", "100mbps", "1g"])
def test_a_bad_rate_names_the_field_and_the_fix(text: str) -> None:
    with pytest.raises(ReproflowError, match=r"launch.network \(or --network\) = .* is not a bandwidth.*'1gbit'"):
        parse_rate(text)


SUITE = """[suite]
description = "one sender, one receiver on another emulated host"
[launch]
nodes = 2
procs_per_node = 1
backend = "gloo"
device = "cpu"
[[experiment]]
name = "1-to-m"
family = "resharding"
params = { case = "1-to-1x1", scale = 256, runs = 3, warmup_runs = 1 }
"""


@pytest.mark.timing
@pytest.mark.distributed
def test_a_shaped_link_bounds_the_transfer_and_every_row_says_so(tmp_path: Path) -> None:
    why = EmulatedNetwork.unavailable()
    if why:
        pytest.skip(why)
    suite = tmp_path / "one.toml"
    suite.write_text(SUITE)
    bandwidth = {}
    for rate in ("", "80mbit"):
        results = tmp_path / (rate or "loopback")
        proc = reproflow("run", str(suite), "--results", str(results), "--network", rate, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        rows = pd.concat(pd.read_csv(f) for f in results.rglob("*.csv"))
        bandwidth[rate] = rows.loc[rows["metric"] == "effective_bw", "value"].item() * 8e3  # GB/s -> Mbit/s
        described = set(rows["network"])
        assert described == ({UNSHAPED} if not rate else
                             {"emulated: 2 hosts, 80 Mbit/s per host each way (tc tbf), latency unshaped"})
    # 4 MiB through an 80 Mbit/s link takes at least 0.42 s; over loopback a small fraction of that.
    assert 60 <= bandwidth["80mbit"] <= 82, bandwidth
    assert bandwidth[""] > 3 * bandwidth["80mbit"], bandwidth
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    # The runs' namespaces (rf<pid>h<host>) are gone with them; the test cluster's (rfslurmh<N>) stay.
    assert not re.search(r"\brf\d+h\d+", left), left


def test_what_a_killed_run_left_is_swept_and_what_another_namespace_runs_is_not() -> None:
    why = EmulatedNetwork.unavailable()
    if why:
        pytest.skip(why)
    dead, foreign, alive = (subprocess.Popen(["true"]) for _ in range(3))
    for proc in (dead, foreign, alive):
        proc.wait()  # three pids no process here has: killed, or of another PID namespace
    OWNERS.mkdir(parents=True, exist_ok=True)
    (OWNERS / str(dead.pid)).touch()  # its run died holding no lock
    held = open(OWNERS / str(alive.pid), "w")  # noqa: SIM115 - its run lives (in another PID namespace)
    fcntl.flock(held, fcntl.LOCK_EX)
    tags = (dead.pid, foreign.pid, alive.pid)
    try:
        for tag in tags:
            subprocess.run(["ip", "netns", "add", f"rf{tag}h0"], check=True)
            subprocess.run(["ip", "link", "add", f"rf{tag}br", "type", "bridge"], check=True)
        with EmulatedNetwork(1, 100.0):
            names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            names += subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
            assert f"rf{dead.pid}" not in names and f"rf{os.getpid()}h0" in names
            assert {f"rf{foreign.pid}h0", f"rf{foreign.pid}br", f"rf{alive.pid}h0", f"rf{alive.pid}br"} <= \
                set(re.findall(r"rf\d+(?:h0|br)", names))
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"rf{os.getpid()}" not in names and not (OWNERS / str(os.getpid())).exists()
    finally:
        held.close()
        (OWNERS / str(alive.pid)).unlink(missing_ok=True)
        for tag in tags:
            subprocess.run(["ip", "netns", "del", f"rf{tag}h0"], capture_output=True)
            subprocess.run(["ip", "link", "del", f"rf{tag}br"], capture_output=True)


def test_where_it_cannot_be_built_the_run_says_why_and_goes_unshaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    suite_file = tmp_path / "one.toml"
    suite_file.write_text(SUITE)
    (exp,) = load_suite(suite_file).experiments
    executor = LocalExecutor(tmp_path, tmp_path, network="1gbit")
    mpi = replace(exp, launch=replace(exp.launch, launcher="mpi"))
    with contextlib.ExitStack() as stack:
        assert executor._network(mpi, stack) is None
        monkeypatch.setattr("os.geteuid", lambda: 1000)
        assert executor._network(exp, stack) is None
    out = capsys.readouterr().out
    assert "not mpirun's; it runs on loopback, unshaped (1gbit not applied)" in out
    assert "emulating a network needs root" in out
    assert LocalExecutor(tmp_path, tmp_path, network="")._network(exp, contextlib.ExitStack()) is None


def test_a_dry_run_says_what_a_real_run_changes_on_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --dry-run` and `--explain` of a suite with an emulated network name the namespaces, bridge and
    rate limits a real run makes (or why it would not), and how to run changing nothing."""
    proc = reproflow("run", "resharding", "-e", "1-to-m", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    if EmulatedNetwork.unavailable():
        assert "it would run on loopback, unshaped (1gbit not applied), changing nothing" in proc.stdout
    else:
        assert ("5 network namespaces (one per emulated host), a bridge and tc rate limits of 1gbit each way, all "
                "removed when it ends; --network '' runs on loopback and changes nothing") in proc.stdout
    explained = reproflow("run", "resharding", "-e", "1-to-m", "--explain")
    assert explained.returncode == 0 and "network: " in explained.stdout, explained.stderr
    quiet = reproflow("run", "resharding", "-e", "1-to-m", "--dry-run", "--network", "")
    assert quiet.returncode == 0 and "network:" not in quiet.stdout


def test_the_emulated_subnet_overlaps_no_route_of_the_machine(monkeypatch):
    """A /24 taken by a route (a live run's network, or a real one) is passed over; a bad prefix is refused."""
    listing = subprocess.run(["ip", "-o", "-4", "route", "show"], capture_output=True, text=True).stdout
    taken = [m for m in re.findall(r"^(\d+)\.(\d+)\.(\d+)\.0/24", listing, re.M) if int(m[2]) < 250]
    if not taken:
        pytest.skip("no /24 route on this machine to avoid")
    a, b, c = taken[0]
    monkeypatch.setenv(PREFIX_ENV, f"{a}.{b}")
    chosen = EmulatedNetwork(1, 100.0, tag=c)._free_subnet()
    assert chosen.startswith(f"{a}.{b}.") and chosen != f"{a}.{b}.{c}"
    monkeypatch.setenv(PREFIX_ENV, "10.300")
    with pytest.raises(ReproflowError, match=r"REPROFLOW_NETWORK_PREFIX='10\.300': give the first two octets"):
        EmulatedNetwork(1, 100.0)._free_subnet()


def test_a_named_network_outlives_its_builder_and_down_removes_it() -> None:
    """The test cluster's form: `up NAME` builds hosts that stay after the command, `down NAME` removes them."""
    why = EmulatedNetwork.unavailable()
    if why:
        pytest.skip(why)
    command = [sys.executable, "-m", "reproflow.launch.network"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    up = subprocess.run([*command, "up", "rftest", "--hosts", "2", "--rate", "100mbit"], capture_output=True,
                        text=True, env=env)
    try:
        assert up.returncode == 0, up.stderr
        built = dict(line.split("=", 1) for line in up.stdout.splitlines())
        assert built["namespaces"] == "'rfrftesth0 rfrftesth1'" and built["gateway"].endswith(".254")
        assert built["description"] == "'emulated: 2 hosts, 100 Mbit/s per host each way (tc tbf), latency unshaped'"
        first = built["addresses"].strip("'").split()[0]
        inside = subprocess.run(["ip", "netns", "exec", "rfrftesth0", "ip", "-o", "-4", "addr", "show", "eth0"],
                                capture_output=True, text=True).stdout
        assert f"{first}/24" in inside
        shaped = subprocess.run(["tc", "qdisc", "show", "dev", "rfrftestv1"], capture_output=True, text=True).stdout
        assert "tbf" in shaped and "rate 100Mbit" in shaped, shaped
    finally:
        down = subprocess.run([*command, "down", "rftest"], capture_output=True, text=True, env=env)
    assert down.returncode == 0, down.stderr
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "rfrftest" not in left, left
    bad = subprocess.run([*command, "up", "node1"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "name 'node1': give 1-8 lowercase letters" in bad.stderr
