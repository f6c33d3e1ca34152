"""`reproflow history`: a year of generated nights with known changes, each found with its date, size and
what differs across it; none in a year without one; the page in a browser; --fail-on-change."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import chromium_tab, reproflow

from reproflow.reporting import catalog
from reproflow.reporting.history import Selection, changes, series
from reproflow.spec.family import Measurement
from reproflow.store.files import atomic_write
from reproflow.store.provenance import Provenance
from reproflow.store.results import make_rows, point_path, rows_to_csv
from reproflow.store.runs import manifest_path

START = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Change:
    """From `night` on, busBW is `factor` times what it was, and one provenance field reads `value`."""

    night: int
    factor: float
    field: str
    value: str


# A 5 % drop with a new commit, a faster NCCL, a slow node joining the job.
CHANGES = (Change(100, 0.95, "git_commit", "b" * 40), Change(200, 1.08, "nccl_version", "2.29.1"),
           Change(300, 0.94, "nodelist", "node1,node7"))


def write_year(root: Path, changes_made: tuple[Change, ...], seed: int, nights: int = 365) -> list[Path]:
    """A results folder per night, each a comms point of 8 repeats (2 % run-to-run noise, 1 % within) and
    its run manifest, started one night after the other."""
    rng = np.random.default_rng(seed)
    folders = []
    for night in range(nights):
        fields = {"git_commit": "a" * 40, "nccl_version": "2.28.9", "nodelist": "node1,node2"}
        level = 10.0
        for change in changes_made:
            if night >= change.night:
                level *= change.factor
                fields[change.field] = change.value
        run_level = level * float(np.exp(rng.normal(0, 0.02)))
        run_id = f"night-{night:03d}"
        prov = Provenance("7", fields["nodelist"], 2, "gloo", "cpu", "a CPU", "2.13.0", fields["nccl_version"],
                          fields["git_commit"], "", "", run_id=run_id)
        measured = [(r, Measurement("busbw", run_level * float(np.exp(rng.normal(0, 0.01))), "GB/s",
                                    {"size_bytes": 1048576})) for r in range(8)]
        folders.append(write_night(root, night, {"suite": "comms", "experiment": "c", "family": "param_comms",
                                                 "point": "collective=all_reduce"}, {"collective": "all_reduce"},
                                   measured, prov))
    return folders


def write_night(root: Path, night: int, head: dict[str, str], params: dict[str, str],
                measured: list[tuple[int, Measurement]], prov: Provenance) -> Path:
    """Night `night`'s results folder under `root`: the point's rows and its run's manifest (started that
    night at 02:00)."""
    folder = root / f"n{night:03d}"
    rows = make_rows(head, params, measured, prov)
    atomic_write(point_path(folder, head["suite"], head["experiment"], "point"), rows_to_csv(rows))
    start = (START + dt.timedelta(days=night)).isoformat(timespec="seconds")
    atomic_write(manifest_path(folder, prov.run_id), json.dumps({"run_id": prov.run_id, "start": start,
                                                                 "cluster": "c"}))
    return folder


def found(root: Path, folders: list[Path]):
    index = catalog.connect(root / "index.sqlite")
    catalog.refresh(index, folders)
    rows = series(index, folders, Selection(suite="comms"))
    assert rows["run"].nunique() == len(folders)
    return changes(rows)


def test_a_year_with_three_changes_finds_each_with_its_date_size_and_cause(tmp_path):
    points = found(tmp_path, write_year(tmp_path, CHANGES, seed=1))
    assert len(points) == len(CHANGES), points
    for (_, point), change in zip(points.iterrows(), CHANGES, strict=True):
        at = (dt.datetime.fromisoformat(point["at"]) - START).days
        assert abs(at - change.night) <= 1, (point["at"], change)
        assert point["low"] <= change.factor <= point["high"] and abs(point["ratio"] - change.factor) < 0.02
        assert f"{change.field}: " in point["what_differs"] and change.value in point["what_differs"]
        assert point["change"] == ("worse" if change.factor < 1 else "better")


def test_a_year_without_a_change_has_no_change_point(tmp_path):
    assert found(tmp_path, write_year(tmp_path, (), seed=2)).empty


def test_the_command_writes_the_page_and_fails_on_a_worse_change(tmp_path):
    folders = write_year(tmp_path / "year", (Change(40, 0.9, "git_commit", "c" * 40),), seed=3, nights=80)
    given = [a for f in folders for a in ("--results", str(f))]
    out = tmp_path / "out"
    proc = reproflow("history", *given, "--suite", "comms", "--out", str(out), "--fail-on-change")
    assert proc.returncode == 1 and "1 change(s) made a series worse" in proc.stderr, proc.stdout + proc.stderr
    assert "1 series over 80 runs (2026-01-01 to 2026-03-21); 1 change point(s)" in proc.stdout
    assert "git_commit: " + "a" * 40 + " -> " + "c" * 40 in (out / "change_points.csv").read_text()
    with chromium_tab() as (tab, errors):
        tab.goto((out / "history.html").as_uri(), wait_until="load")
        assert tab.title() == "reproflow history"
        images = tab.evaluate("[...document.images].map(i => i.complete && i.naturalWidth > 0)")
        assert images == [True] and tab.locator("table").count() == 1 and errors == []
    quiet = reproflow("history", *given, "--suite", "comms", "--until", "2026-02-01", "--out", str(out),
                      "--fail-on-change")
    assert quiet.returncode == 0 and "0 change point(s)" in quiet.stdout
    for args, words in [(["--since", "01/02/2026"], "--since '01/02/2026': give a date as YYYY-MM-DD"),
                        (["--suite", "nothing"], "no run in the catalog measured the series asked for")]:
        bad = reproflow("history", *given, *args, "--out", str(out))
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("noise", [0.005, 0.05])
def test_the_noise_scale_is_the_series_own(noise):
    """The same 5 % drop is found in a quiet series and not invented in a noisy one of the same length."""
    from reproflow.reporting.history import change_points

    rng = np.random.default_rng(4)
    logs = rng.normal(0, noise, 200)
    logs[120:] += np.log(0.95)
    cuts = change_points(logs)
    assert (cuts == [120]) if noise < 0.01 else (len(cuts) <= 1)


def test_a_series_is_chosen_by_globs_as_the_shell_reads_them(tmp_path):
    """Suite, point and coordinates are selected by shell globs ([!...] included), in the index's query."""
    folders = write_year(tmp_path, (), seed=3)[:4]
    index = catalog.connect(tmp_path / "index.sqlite")
    catalog.refresh(index, folders)
    for chosen, runs in ((Selection(suite="co?ms", point="collective=all_*"), 4), (Selection(suite="[!c]*"), 0),
                         (Selection(coords="*1048576*"), 4), (Selection(coords="*65536*"), 0),
                         (Selection(coords="size_bytes=1048576"), 4), (Selection(coords="size_bytes=104857"), 0),
                         (Selection(coords="size_bytes=1048576,dtype=x"), 0),
                         (Selection(suite="comms", metric="latency"), 0)):
        assert series(index, folders, chosen)["run"].nunique() == runs, chosen


def test_a_size_given_exactly_is_not_found_inside_a_larger_one(tmp_path):
    """`--coords size_bytes=1048576` is the 1 MiB series alone; the glob `*1048576*` also takes 10485760."""
    root = tmp_path / "r"
    prov = Provenance("7", "node1,node2", 2, "gloo", "cpu", "a CPU", "2.13.0", "", "a" * 40, "", "", run_id="one")
    measured = [(r, Measurement("busbw", 5.0 + r, "GB/s", {"size_bytes": size}))
                for size in (1048576, 10485760) for r in range(3)]
    folder = write_night(root, 0, {"suite": "comms", "experiment": "c", "family": "param_comms",
                                   "point": "collective=all_reduce"}, {"collective": "all_reduce"}, measured, prov)
    index = catalog.connect(tmp_path / "index.sqlite")
    catalog.refresh(index, [folder])
    assert len(series(index, [folder], Selection(coords="*1048576*"))) == 2
    (exact,) = series(index, [folder], Selection(coords="size_bytes=1048576"))["coords"]
    assert json.loads(exact) == {"size_bytes": "1048576"}


def test_pelt_segments_as_ruptures_does():
    """The change-point search gives ruptures' KernelCPD (linear kernel, PELT) segmentation on generated
    series with and without steps, normal and heavy-tailed, short and a year and more long."""
    import ruptures

    from reproflow.reporting.history import pelt

    rng = np.random.default_rng(7)
    for trial in range(120):
        n = int(rng.integers(6, 1200))
        z = rng.standard_t(3, n) if trial % 2 else rng.normal(0, 1, n)
        for _ in range(int(rng.integers(0, 4))):
            z[int(rng.integers(0, n)):] += rng.normal(0, 3)
        penalty = 6 * np.log(n) * rng.uniform(0.2, 1.5)
        fit = ruptures.KernelCPD(kernel="linear", min_size=3, jump=1).fit(z.reshape(-1, 1))
        assert pelt(z, penalty, 3) == fit.predict(pen=penalty)[:-1], (trial, n)


def test_a_series_too_short_for_a_change_says_so(tmp_path):
    """Two runs cannot hold two segments of MIN_RUNS: `history` says the series is too short, not only
    that it found no change."""
    folders = write_year(tmp_path / "two", (), seed=4, nights=2)
    given = [a for f in folders for a in ("--results", str(f))]
    proc = reproflow("history", *given, "--suite", "comms", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "0 change point(s)" in proc.stdout and "1 of 1 series have fewer than 6 runs, too few to find a change in" \
        in proc.stdout, proc.stdout



def test_a_night_whose_busbw_is_zero_is_shown_not_valid_and_judges_nothing(tmp_path):
    """A night that moved no bytes (busBW 0 in every row) is in `history`'s table and page with its reason,
    out of the change points (a quiet year keeps none), and `runs` flags it instead of a headline of 0."""
    folders = write_year(tmp_path / "year", (), seed=5, nights=40)
    prov = Provenance("7", "node1,node2", 2, "gloo", "cpu", "a CPU", "2.13.0", "2.28.9", "a" * 40, "", "",
                      run_id="night-020")
    write_night(tmp_path / "year", 20, {"suite": "comms", "experiment": "c", "family": "param_comms",
                                        "point": "collective=all_reduce"}, {"collective": "all_reduce"},
                [(r, Measurement("busbw", 0.0, "GB/s", {"size_bytes": 1048576})) for r in range(8)], prov)
    given = [a for f in folders for a in ("--results", str(f))]
    out = tmp_path / "out"
    proc = reproflow("history", *given, "--suite", "comms", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "0 change point(s)" in proc.stdout and "1 run(s) of a series not valid" in proc.stdout, proc.stdout
    assert "night-020 (2026-01-21): its busbw is 0 in every row" in proc.stdout, proc.stdout
    table = (out / "history.csv").read_text().splitlines()
    assert len(table) == 41 and any("night-020" in row and "its busbw is 0 in every row" in row for row in table)
    runs = reproflow("runs", "--results", str(folders[20]), "--results", str(folders[21]))
    assert runs.returncode == 0, runs.stderr
    night = runs.stdout.split("night-020")[1].split("night-0")[0]
    assert "NOT VALID: 1 point(s): its busbw is 0 in every row" in night and "busbw 0 GB/s" not in night, runs.stdout


def test_a_field_that_varies_every_night_is_no_cause_and_a_change_is_dated_by_its_first_run(tmp_path):
    """An operator's year: the job lands on another pair of nodes every night, a 20-night slowdown no field
    explains, and an NCCL upgrade with a 5 % drop. The node list is said to vary, never a cause; the
    slowdown's change points say nothing recorded explains them; the upgrade names NCCL, dated by the
    first night that ran it."""
    rng = np.random.default_rng(11)
    folders = []
    for night in range(300):
        nccl = "2.29.1" if night >= 200 else "2.28.9"
        level = 10.0 * (0.95 if night >= 200 else 1.0) * (0.85 if 100 <= night < 120 else 1.0)
        nodes = f"node{(3 * night) % 16 + 1},node{(3 * night + 5) % 16 + 1}"
        prov = Provenance("7", nodes, 2, "gloo", "cpu", "a CPU", "2.13.0", nccl, "a" * 40, "", "",
                          run_id=f"night-{night:03d}")
        value = level * float(np.exp(rng.normal(0, 0.02)))
        measured = [(r, Measurement("busbw", value * float(np.exp(rng.normal(0, 0.01))), "GB/s",
                                    {"size_bytes": 1048576})) for r in range(8)]
        folders.append(write_night(tmp_path, night, {"suite": "comms", "experiment": "c", "family": "param_comms",
                                                     "point": "collective=all_reduce"}, {"collective": "all_reduce"},
                                   measured, prov))
    points = found(tmp_path, folders)
    assert len(points) == 3, points[["at", "ratio", "what_differs"]]
    assert all("nodelist vary from run to run: not a difference" in w and "nodelist:" not in w
               for w in points["what_differs"])
    down, up, upgrade = (points.iloc[i] for i in range(3))
    assert down["what_differs"].startswith("nothing the rows record") and up["what_differs"].startswith("nothing")
    assert "nccl_version: 2.28.9 -> 2.29.1 (first in night-200, 2026-07-20" in upgrade["what_differs"], upgrade


def test_a_night_is_judged_against_its_clusters_own_history(tmp_path):
    """The nightly gate on a generated year: a quiet year raises about the stated false alarms (0.01 a
    night); a night 15 % slower is worse, a night with zero busBW not valid (exit 1), and runs on another
    node count or cluster are never in the interval."""
    from reproflow.reporting.nightly import judge

    folders = write_year(tmp_path / "year", (), seed=12, nights=200)
    index = catalog.connect(tmp_path / "index.sqlite")
    catalog.refresh(index, folders)
    rows = series(index, folders, Selection(suite="comms"))
    verdicts = [judge(rows, f"night-{n:03d}")["verdict"].iloc[0] for n in range(200)]
    assert verdicts[:8] == ["too few runs"] * 8
    alarms = sum(v != "normal" for v in verdicts[8:])
    assert alarms <= 8, alarms  # 192 quiet nights at 0.01: about 2
    head = {"suite": "comms", "experiment": "c", "family": "param_comms", "point": "collective=all_reduce"}
    for night, level, nodes, run in ((200, 8.5, "node1,node2", "slow"), (201, 0.0, "node1,node2", "zero"),
                                     (202, 5.0, "node1,node2,node3,node4", "four")):
        prov = Provenance("7", nodes, 2, "gloo", "cpu", "a CPU", "2.13.0", "2.28.9", "a" * 40, "", "", run_id=run)
        folders.append(write_night(tmp_path / "year", night, head, {"collective": "all_reduce"},
                                   [(r, Measurement("busbw", level, "GB/s", {"size_bytes": 1048576}))
                                    for r in range(8)], prov))
    catalog.refresh(index, folders)
    rows = series(index, folders, Selection(suite="comms"))
    slow = judge(rows, "slow").iloc[0]
    assert slow["verdict"] == "worse" and slow["runs_used"] == 20 and slow["last_used"] == "night-199", slow
    assert slow["low"] < 10 < slow["high"] and slow["value"] < slow["low"]
    assert judge(rows, "four").iloc[0]["verdict"] == "too few runs"  # no run before on four nodes
    given = [a for f in folders[-40:] for a in ("--results", str(f))]
    proc = reproflow("history", *given, "--judge", "zero", "--out", str(tmp_path / "out"))
    assert proc.returncode == 1 and "its busbw is 0 in every row" in proc.stdout, proc.stdout + proc.stderr
    assert "0 normal, 0 worse, 0 better, 1 not valid, 0 too few runs" in proc.stdout
    assert (tmp_path / "out" / "judge.csv").is_file()
    # compare --against-history: the same judgement over the catalog's folders
    home = tmp_path / "catalog"
    home.mkdir()
    (home / "folders.txt").write_text("".join(f"{f.resolve()}\n" for f in folders[-40:]))
    compared = reproflow("compare", "slow", "--against-history", "--out", str(tmp_path / "c"),
                         env={"REPROFLOW_CATALOG": str(home)})
    assert compared.returncode == 1 and "0 normal, 1 worse" in compared.stdout, compared.stdout + compared.stderr


def test_long_work_says_what_it_is_doing_and_short_work_says_nothing(monkeypatch, capsys):
    """A command that runs nothing answers fast or shows progress: a line on stderr every 2 s, none before."""
    now = [100.0]
    monkeypatch.setattr(catalog.time, "monotonic", lambda: now[0])
    tick = catalog.Ticker("series searched and drawn")
    tick(1, 50)
    now[0] += 1.9
    tick(2, 50)
    assert capsys.readouterr().err == ""
    now[0] += 0.2
    tick(3, 50)
    assert capsys.readouterr().err == "reproflow: series searched and drawn: 3 of 50 (2 s)\n"
