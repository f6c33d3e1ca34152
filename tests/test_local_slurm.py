"""The test cluster starts from nothing and trusts no file it did not write (tests/slurm/start.sh).

Each test stops the running test cluster, leaves /etc/slurm as a fresh machine or a stale one would
have it, starts the cluster again and checks that every file in /etc/slurm is one the start wrote;
afterwards /etc/slurm is put back as it was and the cluster is started again for the other tests.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT
from slurmtools import cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("cluster")]

SCRIPTS = ROOT / "tests" / "slurm"
ETC = Path("/etc/slurm")
STATE = Path(os.environ.get("LOCAL_SLURM_DIR", ROOT / ".local-slurm"))


def script(name: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(SCRIPTS / name)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture
def stopped():
    """The cluster stopped; afterwards /etc/slurm's files as they were and the cluster up again."""
    script("stop.sh")
    saved = {p.name: p.read_bytes() for p in ETC.iterdir() if p.is_file()}
    yield
    script("stop.sh")
    for path in ETC.iterdir():
        if path.is_file() and path.name not in saved:
            path.unlink()
    for name, data in saved.items():
        (ETC / name).write_bytes(data)
    script("start.sh")


def written_by_the_start() -> dict[str, str]:
    """Path -> SHA-256 of every file the last start says it wrote."""
    lines = (STATE / "system-files").read_text().splitlines()
    return {path: digest for digest, path in (line.split("  ", 1) for line in lines)}


def check_owned(start: subprocess.CompletedProcess) -> None:
    written = written_by_the_start()
    present = sorted(str(p) for p in ETC.iterdir())
    assert present == sorted(p for p in written if p.startswith("/etc/slurm/")), (present, written)
    subprocess.run(["sha256sum", "--check", "--status", str(STATE / "system-files")], check=True)
    for path in written:
        assert f"local-slurm:   {path}" in start.stdout, start.stdout
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    assert "ClusterName             = reproflowtest" in config
    # A job on both nodes, and its accounting record, through the files the start wrote.
    hosts = subprocess.run(["srun", "-N", "2", "hostname"], capture_output=True, text=True, timeout=60)
    assert sorted(hosts.stdout.split()) == ["node1", "node2"], hosts.stderr


def test_starts_on_a_machine_that_never_had_a_slurm_configuration(stopped):
    assert not (ETC / "slurm.conf").exists() and not (ETC / "slurmdbd.conf").exists()
    check_owned(script("start.sh"))


def test_stale_files_are_replaced_or_set_aside_never_read(stopped):
    stale = {
        # Another cluster's configuration: commands reading it would wait for hosts that do not exist.
        "slurm.conf": "ClusterName=stale\nSlurmctldHost=nowhere(192.0.2.1)\nAccountingStorageType="
                      "accounting_storage/slurmdbd\nAccountingStorageHost=192.0.2.1\n",
        "slurmdbd.conf": "DbdHost=nowhere\nStorageHost=192.0.2.1\n",
        # A SPANK plugin that is gone: srun fails while this file is read.
        "plugstack.conf": "required /nonexistent/stale-spank.so\n",
        "cgroup.conf": "CgroupPlugin=cgroup/v9\n",
    }
    ETC.mkdir(exist_ok=True)
    for name, text in stale.items():
        (ETC / name).write_text(text)
    start = script("start.sh")
    check_owned(start)
    assert "moved aside until stop.sh: " in start.stdout
    assert {"plugstack.conf", "cgroup.conf"} <= {p.name for p in (STATE / "aside").iterdir()}
    # stop.sh puts back what was set aside and removes what the start wrote.
    script("stop.sh")
    assert (ETC / "cgroup.conf").read_text() == stale["cgroup.conf"]
    assert not (ETC / "slurm.conf").exists()
