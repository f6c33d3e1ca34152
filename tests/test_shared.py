"""A results folder shared by a team: files get the umask's modes, so a group with umask 002 reads and
writes what each member measured and reported."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ONE_COLLECTIVE, ROOT

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


def test_a_second_run_into_a_folder_being_written_is_refused_naming_the_first(tmp_path: Path) -> None:
    """While a run holds a suite's results, another run of that suite into that folder stops before it
    runs anything, naming the first; the first one's rows are left as they were."""
    from reproflow.store.files import held
    from reproflow.store.results import writer_lock

    suite = tmp_path / "one.toml"
    suite.write_text(ONE_COLLECTIVE % 2)
    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)  # the first run's manifest folder
    with held(writer_lock(results, "one"), "run 20261207-000000-abcdef (pid 1 on node7, since now)"):
        second = subprocess.run([sys.executable, "-m", "reproflow.app.cli", "run", str(suite), "--results",
                                 str(results)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 2, second.stderr
    assert "is being written by run 20261207-000000-abcdef (pid 1 on node7, since now)" in second.stderr
    assert not list(results.glob("one/*/*.csv"))


def test_a_submit_into_a_folder_being_written_is_refused_before_it_submits(tmp_path: Path) -> None:
    """`submit` holds the suite's results while it submits (and waits, with --wait): one while a run
    writes them stops before sbatch, naming the run."""
    from reproflow.store.files import held
    from reproflow.store.results import writer_lock

    suite = tmp_path / "one.toml"
    suite.write_text(ONE_COLLECTIVE % 2)
    results = tmp_path / "results"
    with held(writer_lock(results, "one"), "run 20261207-000000-abcdef (pid 1 on node7, since now)"):
        submit = subprocess.run([sys.executable, "-m", "reproflow.app.cli", "submit", str(suite), "--results",
                                 str(results), "--wait"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                                env=dict(os.environ, PATH="/nonexistent"))  # no sbatch: it must not get that far
    assert submit.returncode == 2, submit.stderr
    assert "is being written by run 20261207-000000-abcdef (pid 1 on node7, since now)" in submit.stderr
    assert not list(results.glob("one/jobs/*"))


def test_a_refusal_names_a_holder_that_has_just_taken_the_lock(tmp_path: Path) -> None:
    """The holder writes its line just after it takes the lock: a run refused in between waits for the
    line rather than saying 'another process'; a released lock names nobody; a lock released just after
    its line was emptied is taken."""
    import fcntl
    import threading

    from reproflow.spec.errors import ReproflowError
    from reproflow.store.files import held

    lock = tmp_path / "one" / ".writer.lock"
    lock.parent.mkdir()
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        late = threading.Timer(0.3, os.pwrite, (fd, b"run 20261208-000000-abcdef", 0))
        late.start()
        with pytest.raises(ReproflowError, match="is being written by run 20261208-000000-abcdef"), \
                held(lock, "run second"):
            pass
        late.join()
    finally:
        os.close(fd)
    with held(lock, "run third"):
        assert lock.read_text() == "run third"
    assert lock.read_text() == ""
    ending = os.open(lock, os.O_RDWR)  # a holder ending: its line emptied, the lock released just after
    fcntl.flock(ending, fcntl.LOCK_EX)
    threading.Timer(0.3, os.close, (ending,)).start()
    with held(lock, "run fourth"):
        assert lock.read_text() == "run fourth"


@pytest.mark.distributed
def test_two_runs_at_once_into_one_folder_keep_one_runs_rows(tmp_path: Path) -> None:
    """Two runs of one suite started together into one folder: one measures, the other is refused or
    finds the points measured; every row names the run that measured it and that run completed."""
    suite = tmp_path / "one.toml"
    suite.write_text(ONE_COLLECTIVE % 200)
    results = tmp_path / "results"
    command = [sys.executable, "-m", "reproflow.app.cli", "run", str(suite), "--results", str(results)]
    runs = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [r.communicate(timeout=300) for r in runs]
    codes = sorted(r.returncode for r in runs)
    refused = [err for (_, err), r in zip(outs, runs, strict=True) if r.returncode == 2]
    assert codes in ([0, 0], [0, 2]), outs
    assert all("is being written by run " in err for err in refused), refused
    import csv
    import json

    ids = {row["run_id"] for f in results.glob("one/c/*.csv") for row in csv.DictReader(f.open())}
    states = {json.loads(p.read_text())["run_id"]: json.loads(p.read_text())["state"]
              for p in (results / "runs").glob("*.json")}
    assert len(ids) == 1 and states[ids.pop()] == "completed", (ids, states)


def test_a_results_folder_is_judged_by_its_layout_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """New, empty, or holding only a starting run's lock: writable. A home-like tree is judged without
    walking it: a whole point file deeper than <suite>/<experiment>/ does not make it a results folder,
    and no file deeper than that is opened."""
    from reproflow.store import results as store
    from reproflow.store.results import not_a_results_folder, writer_lock

    assert not_a_results_folder(tmp_path / "new") == ""
    lock = writer_lock(tmp_path / "starting", "one")
    lock.parent.mkdir(parents=True)
    lock.touch()
    assert not_a_results_folder(tmp_path / "starting") == ""
    suite, measured = tmp_path / "one.toml", tmp_path / "measured"
    suite.write_text(ONE_COLLECTIVE % 2)
    subprocess.run([sys.executable, "-m", "reproflow.app.cli", "run", str(suite), "--results", str(measured)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    point = next(measured.glob("one/c/*.csv"))
    deep = tmp_path / "home" / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (deep / point.name).write_bytes(point.read_bytes())
    (tmp_path / "home" / "a" / "b" / "notes.csv").write_text("not a point file\n")
    opened: list[Path] = []
    monkeypatch.setattr(store, "point_file_problem", lambda path, real=store.point_file_problem:
                        opened.append(path) or real(path))
    assert "is not a results folder" in not_a_results_folder(tmp_path / "home")
    assert opened == [tmp_path / "home" / "a" / "b" / "notes.csv"]
    assert not_a_results_folder(measured) == ""
