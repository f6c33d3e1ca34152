"""A results folder shared by a team: files get the umask's modes, so a group with umask 002 reads and
writes what each member measured and reported."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from reproflow.store.files import append_line, atomic_write, umask


@pytest.mark.parametrize("mask", [0o002, 0o022, 0o077])
def test_files_get_the_umasks_mode(mask: int, tmp_path: Path) -> None:
    old = os.umask(mask)
    try:
        assert umask() == mask
        atomic_write(tmp_path / "whole.csv", "a\n")
        append_line(tmp_path / "lines.txt", "a")
    finally:
        os.umask(old)
    for name in ("whole.csv", "lines.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name


@pytest.mark.distributed
def test_a_team_reads_and_writes_a_results_folder_written_under_umask_002(tmp_path: Path) -> None:
    """A run and its report written with umask 002: every file and folder is group-readable and writable."""
    results, reports = tmp_path / "results", tmp_path / "reports"
    script = (f"umask 002 && {sys.executable} -m reproflow.app.cli run smoke -e comms --results {results} && "
              f"{sys.executable} -m reproflow.app.cli report --results {results} --out {reports}")
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    paths = [p for root in (results, reports) for p in root.rglob("*")]
    assert any(p.suffix == ".csv" for p in paths) and any(p.suffix == ".md" for p in paths)
    private = [f"{p.relative_to(tmp_path)} {stat.filemode(p.stat().st_mode)}" for p in paths
               if not p.is_symlink() and p.stat().st_mode & 0o060 != 0o060]
    assert not private, private
