"""Helpers of the tests that talk to the test Slurm cluster (tests/slurm/start.sh): submit, wait, read."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

# The CPU image make test builds (tests/cpu-image.sh), and Pyxis with Enroot (tests/enroot-pyxis.sh).
IMAGE = os.environ.get("REPROFLOW_CPU_IMAGE", "")
NEEDS_IMAGE = pytest.mark.skipif(not IMAGE or not Path(IMAGE).is_file(),
                                 reason="no CPU image: make test builds it (tests/cpu-image.sh) and sets "
                                        "REPROFLOW_CPU_IMAGE")
PYXIS_PLUGIN = Path("/usr/local/lib/slurm/spank_pyxis.so")
# Installed, the test cluster loads Pyxis (tests/slurm/start.sh): a test that needs it fails if it does not.
NEEDS_PYXIS = pytest.mark.skipif(not PYXIS_PLUGIN.is_file() or shutil.which("enroot") is None,
                                 reason="Enroot and Pyxis are not installed: tests/enroot-pyxis.sh builds them from "
                                        "source (make test runs it) and says why it could not")
SMOKE = ROOT / "sbatch" / "smoke.sbatch"
SMALL = "end_size=4K iters=2 warmup_iters=1"
SLOW = "end_size=8M iters=20 warmup_iters=1"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


@pytest.fixture(scope="module")
def cluster():
    """Skip unless the test cluster answers; after the module, cancel what its tests left running."""
    reason = os.environ.get("REPROFLOW_SLURM_UNAVAILABLE")
    if reason:
        pytest.skip(reason)
    if shutil.which("sbatch") is None:
        pytest.skip("Slurm is not installed here; `make test` installs and starts a test cluster")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        pytest.skip("no Slurm controller is running; `make test` starts one (tests/slurm/start.sh)")
    yield
    # A failed test must not leave jobs that hold nodes for the next one.
    subprocess.run(["scancel", "--user", "root"], capture_output=True)


def sbatch(*args: str, cwd: Path = ROOT) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.strip().split(";")[0]


def sacct(job: str) -> dict[str, dict[str, str]]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "JobID,State,Start,End,NodeList,Reason"],
                         capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        job_id, state, start, end, nodes, reason = line.split("|")
        rows[job_id] = {"state": state.split()[0], "start": start, "end": end, "nodes": nodes, "reason": reason}
    return rows


def wait(job: str, states: set[str] = FINAL, timeout: float = 180, count: int = 1) -> dict[str, dict[str, str]]:
    """sacct rows of `job` once `count` of them reached one of `states`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rows = sacct(job)
        if len(rows) >= count and sum(r["state"] in states | FINAL for r in rows.values()) >= count:
            return rows
        time.sleep(1)
    raise AssertionError(f"job {job} did not reach {states} in {timeout} s: {sacct(job)}")


def rows_of(results: Path) -> pd.DataFrame:
    files = sorted(results.rglob("*.csv"))
    assert files, f"no result files under {results}"
    return pd.concat([pd.read_csv(f, dtype={"rank": str, "job_id": str}) for f in files])


def submitted_ids(stdout: str) -> list[str]:
    return next(line for line in stdout.splitlines() if line.startswith("job ids:")).split(":", 1)[1].strip().split(",")


@contextlib.contextmanager
def folder_hidden_on(node: str, folder: str) -> Iterator[None]:
    """`folder` empty on `node` alone while the block runs: an empty tmpfs over it in that slurmd's own mount
    namespace (tests/slurm/start.sh), so its jobs' steps and Pyxis find nothing there. Afterwards the folder
    is back, and the node, if a job's epilog drained it meanwhile, resumed."""
    state = Path(os.environ.get("LOCAL_SLURM_DIR", ROOT / ".local-slurm"))
    pid = (state / "pids" / f"slurmd-{node}.pid").read_text().strip()
    enter = ["nsenter", "-t", pid, "-m"]
    subprocess.run([*enter, "mount", "-t", "tmpfs", "-o", "size=1m,mode=755", "reproflow-test", folder], check=True)
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", folder], check=True)
        # An epilog that ran without the folder drains the node: resumed once it has finished.
        end = time.monotonic() + 60
        while time.monotonic() < end:
            state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True).stdout
            if state.strip() == "idle":
                break
            if "drain" in state:
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
            time.sleep(0.5)
