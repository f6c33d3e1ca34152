"""`reproflow compare`: two runs' rows as written to disk, matched point by point, each metric judged
faster, slower or the same within noise, the page checked in a real browser."""

from __future__ import annotations

import json
import re
import sqlite3
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import archive_of, chromium_tab, reproflow

from reproflow.reporting import catalog
from reproflow.reporting.compare import (
    FASTER,
    NEITHER,
    NO_RATIO,
    NOT_MEASURED,
    NOT_VALID,
    ONE_SAMPLE,
    SAME,
    SLOWER,
    claims_side_by_side,
    compare,
    differences,
    only_in_one,
    open_run,
)
from reproflow.spec.family import Measurement
from reproflow.store.files import atomic_write
from reproflow.store.provenance import Provenance
from reproflow.store.results import make_rows, point_path, rows_to_csv

SIZES = (1024, 65536, 4194304)


def write_run(results: Path, seed: int, *, busbw: float, latency: float, commit: str, device: str,
              sizes: tuple[int, ...] = SIZES, run_id: str = "") -> None:
    """A comms point as a run writes it: per message size (a coordinate inside the point), 8 repeats of
    busBW and latency (spread 3 %) and an error count, one set-up time and one buffer size."""
    rng = np.random.default_rng(seed)
    prov = Provenance("7", "node[1-2]", 2, "gloo", "cpu", device, "2.13.0", "", commit, "", "", run_id=run_id)
    measured = []
    for size in sizes:
        noise = np.exp(rng.normal(0.0, 0.03, 8))
        measured += [(r, m) for r, n in enumerate(noise) for m in (
            Measurement("busbw", busbw * n * size / SIZES[-1], "GB/s", {"size_bytes": size}),
            Measurement("latency_p50_us", latency / n * (1 + size / 1e6), "us", {"size_bytes": size}),
            Measurement("wrong_elements", 0.0, "count", {"size_bytes": size}))]
        # Measured once a point: a set-up time (no interval) and a buffer size (neither a rate nor a time).
        measured += [(0, Measurement("setup_s", 2.0 * noise[0], "s", {"size_bytes": size})),
                     (0, Measurement("buffer_bytes", 2.0 * size, "B", {"size_bytes": size}))]
    rows = make_rows({"suite": "comms", "experiment": "c", "family": "param_comms", "point": "collective=all_reduce"},
                     {"collective": "all_reduce"}, measured, prov)
    atomic_write(point_path(results, "comms", "c", "all_reduce"), rows_to_csv(rows))


def size(n: int) -> str:
    """The coordinates of a message size, as the index keys them."""
    return json.dumps({"size_bytes": str(n)})


def test_each_metric_is_judged_against_the_first_run(tmp_path: Path) -> None:
    write_run(tmp_path / "a", 1, busbw=10.0, latency=100.0, commit="aaa", device="cpu A")
    write_run(tmp_path / "b", 2, busbw=13.0, latency=100.0, commit="bbb", device="cpu B", sizes=(*SIZES[1:], 2**24))
    index = catalog.connect(tmp_path / "index.sqlite")
    runs = [open_run(str(tmp_path / name), index, tmp_path) for name in ("a", "b")]
    table = compare(*runs).set_index(["coords", "metric"])
    # busBW 1.3x: faster, its interval around 1.3; each message size judged on its own 8 repeats; the
    # latency unchanged: the same within noise.
    busbw = table.loc[(size(65536), "busbw")]
    assert busbw["verdict"] == FASTER and busbw["low"] < 1.3 < busbw["high"] and busbw["n_a"] == busbw["n_b"] == 8
    assert set(table.xs("latency_p50_us", level="metric")["verdict"]) == {SAME}
    # An error count of zero is matched and listed: no ratio.
    assert table.loc[(size(65536), "wrong_elements")]["verdict"] == NO_RATIO
    # Message sizes in one run only are listed, never dropped.
    alone = only_in_one(*runs)
    assert alone[["coords", "only in"]].values.tolist() == [[size(1024), str(tmp_path / "a")],
                                                            [size(2**24), str(tmp_path / "b")]]
    # What differs between the runs is said: commit and CPU, not the backend.
    differ = differences(runs).set_index("provenance")
    assert differ.loc["git_commit"].tolist() == ["aaa", "bbb"] and "backend" not in differ.index
    # A run 1.5x slower in latency: slower, the speed below 1 with its whole interval.
    write_run(tmp_path / "c", 3, busbw=10.0, latency=150.0, commit="aaa", device="cpu A")
    slow = open_run(str(tmp_path / "c"), index, tmp_path)
    latency = compare(runs[0], slow).set_index(["coords", "metric"]).loc[(size(65536), "latency_p50_us")]
    assert latency["verdict"] == SLOWER and latency["speed_high"] < 0.75
    # Measured once a side: the ratio, no interval, no verdict; a size: no verdict either.
    setup, buffer = table.loc[(size(65536), "setup_s")], table.loc[(size(65536), "buffer_bytes")]
    assert setup["verdict"] == ONE_SAMPLE and setup["ratio"] > 0 and setup["low"] != setup["low"]
    assert buffer["verdict"] == NEITHER and buffer["ratio"] == 1.0


def test_the_index_follows_the_files_and_matches_the_claims_statistics(tmp_path: Path) -> None:
    """The index is read again where a file changed or went, never trusted over the files; its interval
    is the one the claims compute from the raw samples."""
    from reproflow.reporting.intervals import ratio_interval
    from reproflow.store.results import read_point_file

    write_run(tmp_path / "a", 1, busbw=10.0, latency=100.0, commit="aaa", device="cpu A")
    write_run(tmp_path / "b", 2, busbw=13.0, latency=100.0, commit="aaa", device="cpu A")
    index = catalog.connect(tmp_path / "index.sqlite")
    assert catalog.refresh(index, [tmp_path / "a", tmp_path / "b"]) == 2
    assert catalog.refresh(index, [tmp_path / "a", tmp_path / "b"]) == 0
    runs = [open_run(str(tmp_path / name), index, tmp_path) for name in ("a", "b")]
    row = compare(*runs).set_index(["coords", "metric"]).loc[(size(65536), "busbw")]
    raw = [[float(r["value"]) for r in read_point_file(tmp_path / n / "comms/c/all_reduce.csv")[0]
            if r["metric"] == "busbw" and r["size_bytes"] == "65536"] for n in ("b", "a")]
    ratio, (low, high) = ratio_interval(*raw)
    assert np.allclose([row["ratio"], row["low"], row["high"]], [ratio, low, high])
    # The later run measured again, 2x slower: the index follows the file.
    write_run(tmp_path / "b", 4, busbw=5.0, latency=100.0, commit="aaa", device="cpu A")
    assert catalog.refresh(index, [tmp_path / "b"]) == 1
    later = open_run(str(tmp_path / "b"), index, tmp_path)
    assert compare(runs[0], later).set_index(["coords", "metric"]).loc[(size(65536), "busbw")]["verdict"] == SLOWER
    (tmp_path / "b/comms/c/all_reduce.csv").unlink()
    catalog.refresh(index, [tmp_path / "b"])
    assert catalog.samples(index, later.side).empty


def test_a_run_whose_busbw_is_zero_is_not_valid_never_slower(tmp_path: Path) -> None:
    """A run that moved nothing (busBW 0 in every row) is not valid, with the reason, in every metric of
    its point, and fails the nightly gate; so is one whose job failed its health gate."""
    write_run(tmp_path / "a", 1, busbw=10.0, latency=100.0, commit="aaa", device="cpu A")
    write_run(tmp_path / "zero", 2, busbw=0.0, latency=100.0, commit="aaa", device="cpu A")
    index = catalog.connect(tmp_path / "index.sqlite")
    runs = [open_run(str(tmp_path / name), index, tmp_path) for name in ("a", "zero")]
    table = compare(*runs)
    assert set(table["verdict"]) == {NOT_VALID}
    assert set(table["why"]) == {f"{tmp_path / 'zero'}: its busbw is 0 in every row."}
    gated = reproflow("compare", str(tmp_path / "a"), str(tmp_path / "zero"), "--out", str(tmp_path / "out"),
                      "--fail-below", "0.5")
    assert gated.returncode == 1 and "or not valid" in gated.stderr and "0 faster, 0 slower" in gated.stdout
    write_run(tmp_path / "gate", 3, busbw=10.0, latency=100.0, commit="aaa", device="cpu A")
    gate_point = next((tmp_path / "gate").rglob("*.csv"))
    frame = pd.read_csv(gate_point, dtype=str, keep_default_na=False).assign(health_gate="fail")
    atomic_write(gate_point, frame.to_csv(index=False))
    gated = compare(runs[0], open_run(str(tmp_path / "gate"), index, tmp_path))
    assert set(gated["verdict"]) == {NOT_VALID} and "failed its health gate" in gated["why"].iloc[0]


def test_the_command_writes_both_pages_and_gates_on_a_regression(tmp_path: Path) -> None:
    write_run(tmp_path / "a", 1, busbw=10.0, latency=100.0, commit="aaa", device="cpu A")
    write_run(tmp_path / "b", 2, busbw=7.0, latency=100.0, commit="aaa", device="cpu A")
    # The baseline as an archive, the later run as a folder.
    archive = archive_of(tmp_path / "a", tmp_path / "a.tar.gz")
    out = tmp_path / "out"
    run = reproflow("compare", str(archive), str(tmp_path / "b"), "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert ("15 metrics matched: 0 faster, 3 slower, 3 same within noise, 3 one sample: no interval, 3 neither a rate "
            "nor a time, 3 no ratio: a zero or no value, 0 not valid; 0 point(s) in one run only") in run.stdout
    assert "The runs' provenance (commit, image, hardware, versions, nodes) is the same." in run.stdout
    # The terminal gets the summary and the metrics decided, slower first; the full tables go to the files,
    # sizes in numeric order.
    assert "  slower: c collective=all_reduce" in run.stdout and "busbw: speed 0.7" in run.stdout
    assert "one sample: no interval" not in run.stdout.split("in one run only.")[1]
    assert len(run.stdout.splitlines()) < 20 < len((out / "compare.md").read_text().splitlines())
    table = (out / "compare.md").read_text()
    assert table.index('"1024"') < table.index('"65536"') < table.index('"4194304"')
    gated = reproflow("compare", str(archive), str(tmp_path / "b"), "--out", str(out), "--fail-below", "0.8")
    assert gated.returncode == 1 and "3 metric(s) slower than 0.8 of the first run's" in gated.stderr
    assert reproflow("compare", str(archive), str(tmp_path / "b"), "--out", str(out),
                     "--fail-below", "0.6").returncode == 0
    # Bad input: a clear error naming what to give, never a traceback.
    for args, words in [((str(archive),), "compare needs two runs or more"),
                        ((str(archive), str(tmp_path / "nowhere")), "not a results folder, an archive or one run's id"),
                        ((str(archive), str(tmp_path / "b"), "--fail-below", "2"), "--fail-below 2.0")]:
        bad = reproflow("compare", *args, "--out", str(out))
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_the_comparison_page_in_a_browser(tmp_path: Path) -> None:
    """compare.html in a real headless Chromium: it loads, the overlaid curves (busBW and latency against
    the message size) decode, no console error."""
    write_run(tmp_path / "a", 1, busbw=10.0, latency=100.0, commit="aaa", device="cpu A")
    write_run(tmp_path / "b", 2, busbw=7.0, latency=100.0, commit="bbb", device="cpu A")
    out = tmp_path / "out"
    assert reproflow("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)).returncode == 0
    with chromium_tab() as (tab, errors):
        tab.goto((out / "compare.html").as_uri(), wait_until="load")
        assert tab.title() == "reproflow compare"
        images = tab.evaluate("[...document.images].map(i => [i.alt, i.complete && i.naturalWidth > 0])")
        assert sorted(alt for alt, ok in images if ok) == ["compare_comms_c_busbw", "compare_comms_c_latency_p50_us"]
        assert tab.locator("table").count() >= 1 and errors == []


def write_gemm(results: Path, tflops: float, repeats: int = 3) -> None:
    """This machine's GEMM point as param-demo writes it: TFLOP/s of three shapes, a few repeats."""
    prov = Provenance("9", "vm", 1, "gloo", "cpu", "a CPU", "2.13.0", "", "ccc", "", "")
    shapes = [(1024, 4096, 4096), (128, 4096, 4096), (4096, 4096, 1024)]
    measured = [(r, Measurement("tflops", tflops * (1 + 0.01 * r), "TFLOP/s", {"m": m, "n": n, "k": k}))
                for r in range(repeats) for m, n, k in shapes]
    for dtype in ("bfloat16", "float32"):
        rows = make_rows({"suite": "param-demo", "experiment": "gemm", "family": "param_compute",
                          "point": f"dtype={dtype}"},
                         {"kernel": "gemm", "dtype": dtype, "implementation": "reproflow"}, measured, prov)
        atomic_write(point_path(results, "param-demo", "gemm", dtype), rows_to_csv(rows))


def test_other_hardware_is_matched_by_parameters_and_set_against_its_limit(tmp_path: Path) -> None:
    """This machine's GEMM rows against the H200 rows kept in benchmarks/results/gpu: other suites, other
    settings, matched by kernel, dtype, implementation and shape; the GPU said at the top; each GPU rate
    also a fraction of the H200's dense peak for its dtype (limits.toml), none for the CPU."""
    from conftest import ROOT

    from reproflow.reporting.limits import limits

    write_gemm(tmp_path / "here", 1.0)
    index = catalog.connect(tmp_path / "index.sqlite")
    match = ("kernel", "dtype", "implementation", "m", "n", "k")
    here = open_run(str(tmp_path / "here"), index, tmp_path, match)
    gpu = open_run(str(ROOT / "benchmarks/results/gpu"), index, tmp_path, match)
    table = compare(here, gpu).set_index("match")
    row = table.loc["kernel=gemm,dtype=bfloat16,implementation=reproflow,m=1024,n=4096,k=4096"]
    peak = limits().gpu("NVIDIA H200").limits["dense_tflops"]["bfloat16"]
    assert row["median_b"] > 100 and np.isclose(row["of_limit_b"], row["median_b"] / peak)
    # The GPU rows have one repeat a shape: the interval is this side's spread alone, the GPU far faster.
    assert np.isnan(row["of_limit_a"]) and row["verdict"] == FASTER and row["ratio"] > 100
    assert len(table) == 6 and set(table["metric"]) == {"tflops"}
    differ = differences([here, gpu]).set_index("provenance")
    assert differ.loc["device_name"].tolist() == ["a CPU", "NVIDIA H200"]


def test_runs_against_a_published_figure_and_the_table_checked(tmp_path: Path) -> None:
    write_gemm(tmp_path / "here", 10.0, repeats=4)
    out = tmp_path / "out"
    run = reproflow("compare", "--reference", "param-gemm-fp32-gpu", str(tmp_path / "here"), "--out", str(out))
    assert run.returncode == 0, run.stderr
    # Three float32 shapes are in the published table: 4 repeats against one exact value each, judged.
    assert "3 metrics matched: 0 faster, 3 slower" in run.stdout and "aws-samples/awsome-distributed" in run.stdout
    unknown = reproflow("compare", "--reference", "nowhere", str(tmp_path / "here"), "--out", str(out))
    assert unknown.returncode == 2 and "Published figures there: " in unknown.stderr
    from reproflow.reporting.limits import load_limits
    from reproflow.spec.errors import ParamError

    bad = tmp_path / "limits.toml"
    bad.write_text('version = 1\n[[gpu]]\nname = "X"\nmatch = "X"\nsource = "s"\n')
    with pytest.raises(ParamError, match="'gpu\\[0\\]match' must be a list"):
        load_limits(bad)


def test_the_report_sets_each_bounded_rate_against_its_limit(tmp_path: Path) -> None:
    """The H200 rows kept in benchmarks/results/gpu: GEMM TFLOP/s against the dense peak of its dtype,
    EmbeddingBag GB/s against the memory bandwidth; one rank's busBW is bounded by no link."""
    import shutil

    from conftest import ROOT

    from reproflow.reporting.report import against_limits, load_results

    (tmp_path / "r").mkdir()
    for name in ("param_compute_rows.csv", "param_comms_rows.csv"):
        shutil.copy(ROOT / "benchmarks/results/gpu" / name, tmp_path / "r" / name)
    table = against_limits(load_results(tmp_path / "r")).set_index("limit_is")
    assert set(table.index) == {"H200 SXM bfloat16 dense_tflops", "H200 SXM float32 dense_tflops",
                                "H200 SXM tf32 dense_tflops", "H200 SXM memory_gbs"}
    bf16 = table.loc["H200 SXM bfloat16 dense_tflops"]
    assert bf16["limit"] == 989.5 and 0.5 < bf16["fraction"] < 1
    assert np.isclose(bf16["fraction"], bf16["median"] / 989.5)


def test_the_report_sets_the_results_against_published_figures(tmp_path: Path) -> None:
    """`reproflow report --reference`: the H200's GEMM rows kept in benchmarks/results/gpu against PARAM's
    published float32 rates (PARAM's point and reproflow's each against every value, each also a fraction
    of the H200's float32 peak), and a figure none of whose values was measured, listed as such."""
    import shutil

    import pandas as pd
    from conftest import ROOT

    from reproflow.reporting.limits import limits

    (tmp_path / "r").mkdir()
    shutil.copy(ROOT / "benchmarks/results/gpu/param_compute_rows.csv", tmp_path / "r")
    out = tmp_path / "report"
    run = reproflow("report", "--results", str(tmp_path / "r"), "--out", str(out),
                    "--reference", "param-gemm-fp32-gpu,p5-2node")
    assert run.returncode == 0, run.stderr
    gemm = pd.read_csv(out / "reference_param-gemm-fp32-gpu.csv")
    assert len(gemm) == 30 and set(gemm["measured_at"]) == {
        f"gpu-one/gemm/dtype=float32,implementation={name}" for name in ("param", "reproflow")}
    assert (gemm["verdict"] == ONE_SAMPLE).all() and np.allclose(gemm["ratio"], gemm["measured"] / gemm["published"])
    peak = limits().gpu("NVIDIA H200").limits["dense_tflops"]["float32"]
    assert np.allclose(gemm["of_limit_b"], gemm["measured"] / peak) and (gemm["of_limit_b"] < 1).all()
    p5 = pd.read_csv(out / "reference_p5-2node.csv")
    assert list(p5["verdict"]) == [NOT_MEASURED] * 2 and "measured" not in p5
    page = (out / "report.md").read_text()
    assert "15 of 15 published value(s) measured here, by 2 point(s) on NVIDIA H200" in page
    assert "0 of 2 published value(s) measured here." in page
    assert 'id="family-against-p5-2node"' in (out / "report.html").read_text()
    # compare --reference sets each of the two points against each value too, naming it.
    compared = reproflow("compare", "--reference", "param-gemm-fp32-gpu", str(tmp_path / "r"), "--out",
                         str(tmp_path / "compare"))
    assert compared.returncode == 0, compared.stderr
    assert "30 metrics matched" in compared.stdout
    assert "implementation=param |" in (tmp_path / "compare" / "compare.md").read_text()
    both = reproflow("report", "--results", str(tmp_path / "r"), "--reference", "p5-2node", "--claims-only")
    assert both.returncode == 2 and "--claims-only does not write" in both.stderr


def test_the_index_lists_only_folders_whose_time_changed(tmp_path: Path) -> None:
    """A folder with its indexed time is not listed again (its files taken as indexed); one that gained a
    file is; a file edited in place, which leaves its folder's time, is found by a rescan."""
    import os

    write_run(tmp_path / "a", 1, busbw=10.0, latency=5.0, commit="c", device="a CPU")
    past = 1_700_000_000
    for folder, _, _ in os.walk(tmp_path / "a"):
        os.utime(folder, (past, past))
    index = catalog.connect(tmp_path / "index.sqlite")
    first = catalog.refresh(index, [tmp_path / "a"])
    assert first > 0 and catalog.refresh(index, [tmp_path / "a"]) == 0
    (point,) = [p for p in (tmp_path / "a").rglob("*.csv")][:1]
    with point.open("a") as fh:  # in place: the folder keeps its time
        fh.write("")
    os.utime(point, (past + 10, past + 10))
    assert catalog.refresh(index, [tmp_path / "a"]) == 0
    assert catalog.refresh(index, [tmp_path / "a"], rescan=True) == 1
    (point.parent / "new.csv").write_bytes(point.read_bytes())  # a file added: the folder's time changes
    assert catalog.refresh(index, [tmp_path / "a"]) == 1
    point.unlink()
    catalog.refresh(index, [tmp_path / "a"])
    assert str(point) not in {p for (p,) in index.execute("SELECT path FROM files")}


def index_rows(con: sqlite3.Connection, table: str) -> list[str]:
    """A table of the index as sorted rows, each point named by its file, not by its row id (which the order
    points were written in sets)."""
    if table in ("samples", "ranks"):
        query = f"SELECT p.path, p.point, t.* FROM {table} t JOIN points p ON t.pid = p.id"
    else:
        query = f"SELECT * FROM {table}"
    rows = [row[:2] + row[3:] if table in ("samples", "ranks") else row[1:] if table == "points" else row
            for row in con.execute(query)]
    return sorted(map(repr, rows))


def test_an_index_read_by_a_pool_is_the_one_read_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold index read by a process per core holds what one read in this process holds, the runs are
    listed from its per-folder summaries, and a file removed is taken off them."""
    for i, name in enumerate(("a", "b", "c")):
        write_run(tmp_path / name, i + 1, busbw=10.0 + i, latency=5.0, commit=f"c{i}", device="a CPU")
    folders = [tmp_path / n for n in ("a", "b", "c")]
    here = catalog.connect(tmp_path / "here.sqlite")
    read = catalog.refresh(here, folders)
    monkeypatch.setattr(catalog, "_POOL_FILES", 1)
    monkeypatch.setattr(catalog.os, "sched_getaffinity", lambda _: {0, 1})
    pooled = catalog.connect(tmp_path / "pooled.sqlite")
    assert catalog.refresh(pooled, [*folders, folders[0]]) == read == 3  # a folder named twice is read once
    for table in ("files", "manifests", "points", "samples", "ranks", "runs_in"):
        assert index_rows(here, table) == index_rows(pooled, table), table
    # One job's rows in three folders: one run, its points and commits put together from each folder's.
    listed = catalog.runs_table(pooled, folders).iloc[0]
    assert (listed["run"], listed["points"], listed["commit"]) == ("job-7", 3, "c0,c1,c2")
    next(iter((tmp_path / "b").rglob("*.csv"))).unlink()
    catalog.refresh(pooled, folders)
    listed = catalog.runs_table(pooled, folders).iloc[0]
    assert (listed["points"], listed["commit"]) == (2, "c0,c2")


def test_point_files_parsed_together_are_indexed_as_the_store_reads_each(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Point files parsed together hold in the index what the result store's reader makes of each one:
    of one parse, only the files with a short line or a row missing are left out (a file of two jobs' rows
    is two points); a line break inside a
    field or a value not a number sends its parse to the reader one file at a time, CRLF lines and a cut
    last line go there alone."""
    from reproflow.store import frames
    from reproflow.store.results import read_point_file

    for name in ("r", "r2"):
        write_run(tmp_path / name, 1, busbw=10.0, latency=5.0, commit="c", device="a CPU")
    (good,) = (tmp_path / "r").rglob("*.csv")
    (good2,) = (tmp_path / "r2").rglob("*.csv")
    text = good.read_text()
    head, first, *rest = text.splitlines(keepends=True)
    fields = first.split(",")
    value = fields[head.split(",").index("value")]
    job = head.split(",").index("job_id")
    other_job = "".join(",".join([*f[:job], "8", *f[job + 1:]]) for f in (line.split(",") for line in [first, *rest]))
    variants = {good: {"short": head + ",".join(fields[:-2] + fields[-1:]) + "".join(rest),
                       "row": head + "".join(rest), "crlf": text.replace("\n", "\r\n"), "cut": text[:-5],
                       "jobs": text + other_job},
                good2: {"newline": text.replace("a CPU", '"a\nCPU"'),
                        "word": head + first.replace(f",{value},", ",fast,", 1) + "".join(rest)}}
    for beside, files in variants.items():
        for name, body in files.items():
            (beside.parent / f"{name}.csv").write_bytes(body.encode())
    parsed = []
    real = frames._parse_together
    monkeypatch.setattr(frames, "_parse_together",
                        lambda head, files, per_point: parsed.append(real(head, files, per_point)) or parsed[-1])
    together = catalog.connect(tmp_path / "together.sqlite")
    for name in ("r", "r2"):  # a parse each (one refresh parses its folders' files with one header together)
        catalog.refresh(together, [tmp_path / name])
    assert [None if frame is None else sorted(frame.rows["@file"].map(lambda f: Path(f).stem).unique())
            for frame in parsed] == [["all_reduce", "jobs"], None]
    monkeypatch.setattr(frames, "_parse_together", lambda head, files, per_point: None)
    alone = catalog.connect(tmp_path / "alone.sqlite")
    catalog.refresh(alone, [tmp_path / "r", tmp_path / "r2"])
    for table in ("files", "points", "samples", "ranks", "runs_in"):
        assert index_rows(together, table) == index_rows(alone, table), table
    indexed = {str(Path(p).relative_to(tmp_path)) for (p,) in together.execute("SELECT path FROM points")}
    whole = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.csv") if not read_point_file(p)[1]}
    assert indexed == whole and {Path(p).stem for p in whole} == {"all_reduce", "crlf", "newline", "jobs"}
    # Two jobs' rows in one file: two points, in both ways of reading.
    assert len([p for (p,) in together.execute("SELECT path FROM points") if p.endswith("jobs.csv")]) == 2


def test_a_run_compared_by_id_brings_only_its_own_folder_up_to_date(tmp_path: Path) -> None:
    """A year of nightly folders in the catalog: comparing two runs by id reads those two runs' folders,
    not every folder the catalog knows."""
    from reproflow.store.runs import recorded_run

    ids = []
    for night in range(3):
        with recorded_run(tmp_path / f"night{night}", ["run", "comms"], suites=["comms"], cluster="c",
                          executor="local") as record:
            write_run(tmp_path / f"night{night}", night, busbw=10.0, latency=5.0, commit="c", device="a CPU",
                      run_id=record["run_id"])
            ids.append(record["run_id"])
    index = catalog.connect(catalog.index_path())
    runs = [open_run(run_id, index, tmp_path) for run_id in (ids[0], ids[2])]
    assert compare(*runs)["verdict"].eq(SAME).any()
    read = {Path(folder).name for (folder,) in index.execute("SELECT DISTINCT folder FROM files")}
    assert read == {"night0", "night2"}
    assert catalog.folders_of("job-") == [] and catalog.folders_of(ids[1]) == [(tmp_path / "night1").resolve()]


@pytest.mark.parametrize("filters", [True, False], ids=["tarfile-filters", "python-before-3.11.4"])
def test_an_archive_is_unpacked_only_as_its_manifest_lists_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filters: bool) -> None:
    """With tarfile's extraction filters and without them (Debian 12's Python 3.11.2): an archive
    `reproflow archive` wrote is compared; one with a member its MANIFEST.json does not list (leading out,
    a link), a member changed after, or no MANIFEST.json first is refused naming it; the manifest's count
    and size are judged before a second member is read."""
    from reproflow.spec.errors import ReproflowError
    from reproflow.store import archive

    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    write_run(tmp_path / "a", 1, busbw=10.0, latency=5.0, commit="c", device="a CPU")
    good = archive_of(tmp_path / "a", tmp_path / "good.tar.gz")
    index = catalog.connect(tmp_path / "index.sqlite")
    (tmp_path / "scratch").mkdir()
    assert len(open_run(str(good), index, tmp_path / "scratch").samples) > 0
    with tarfile.open(good) as tar:
        point = next(m for m in tar if m.name.endswith(".csv"))
    changed = tarfile.TarInfo(point.name.replace("good/", "bad/", 1))
    changed.size = point.size
    for member, words in [(tarfile.TarInfo("../../outside.csv"), "which is not a file its MANIFEST.json lists"),
                          (tarfile.TarInfo("bad/results/x"), "which is not a file its MANIFEST.json lists"),
                          (tarfile.TarInfo("bad/results/new.csv"), "which is not a file its MANIFEST.json lists"),
                          (changed, "its SHA-256 differs")]:
        if member.name == "bad/results/x":
            member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
        bad = archive_of(tmp_path / "a", tmp_path / "bad" / "bad.tar.gz", member, b"9" * member.size)
        with pytest.raises(ReproflowError, match=re.escape(words)):
            open_run(str(bad), index, tmp_path / "scratch")
    assert not (tmp_path / "outside.csv").exists()
    # Not led by its MANIFEST.json (a folder packed by hand, an archive of an older reproflow): refused.
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.add(tmp_path / "a", arcname="reproflow-archive/results")
    with pytest.raises(ReproflowError, match=re.escape("not <name>/MANIFEST.json, so it is not an archive")):
        open_run(str(plain), index, tmp_path / "scratch")
    # Too many members, or too many bytes in all, by its MANIFEST.json: refused at its first member.
    headers: list[int] = []
    header = tarfile.TarInfo.fromtarfile.__func__
    monkeypatch.setattr(tarfile.TarInfo, "fromtarfile", classmethod(lambda c, t: headers.append(1) or header(c, t)))
    for limit, value in (("MAX_MEMBERS", 1), ("MAX_BYTES", 10)):  # it holds one file, of some KiB
        headers.clear()
        with monkeypatch.context() as patch:
            patch.setattr(archive, limit, value)
            with pytest.raises(ReproflowError, match=r"lists more than .* files or .* GiB"):
                archive.unpack_results(good, tmp_path / f"limit-{limit}")
        assert len(headers) == 1 and not list((tmp_path / f"limit-{limit}").rglob("*.csv"))
    (tmp_path / "junk").write_bytes(b"garbage, not gzip")
    with pytest.raises(ReproflowError, match=r"not a readable \.tar\.gz archive"):
        archive.unpack_results(tmp_path / "junk", tmp_path / "j")


def test_claims_of_two_runs_side_by_side(tmp_path: Path) -> None:
    """Each run's claims.csv in one table: verdicts and ratios per run, the claims whose verdicts differ
    marked; a file that is not a claims table is refused with the fix."""
    from reproflow.spec.errors import ReproflowError

    columns = ["family", "claim", "status", "measured", "low", "high"]
    first, later = tmp_path / "a.csv", tmp_path / "b.csv"
    pd.DataFrame([["resharding", "ring faster", "holds", 2.44, 2.36, 2.52],
                  ["spatial", "tiles faster", "not applicable here", None, None, None]], columns=columns).to_csv(first)
    pd.DataFrame([["resharding", "ring faster", "inconclusive", 1.1, 0.9, 1.3],
                  ["spatial", "tiles faster", "not applicable here", None, None, None]], columns=columns).to_csv(later)
    side = claims_side_by_side([first, later], ["local", "slurm"])
    na = "not applicable here"
    assert side[["claim", "local", "slurm", "differ"]].values.tolist() == [
        ["ring faster", "holds", "inconclusive", "yes"], ["tiles faster", na, na, ""]]
    assert side["local ratio"].tolist() == ["2.44 [2.36, 2.52]", ""]
    (tmp_path / "bad.csv").write_text("family,claim\nx,y\n")
    with pytest.raises(ReproflowError, match=r"--claims .*bad.csv: no column high, low, measured, status; give the "):
        claims_side_by_side([first, tmp_path / "bad.csv"], ["local", "slurm"])


def test_a_point_with_fewer_samples_than_it_asked_for_is_not_valid() -> None:
    """Resharding asks for `runs` timed runs, one run_time row each: with 3 of 8 the point is not valid."""
    from reproflow.spec.family import families

    resharding = families()["resharding"]
    rows = pd.DataFrame([{"point": "short", "metric": "run_time", "value": "0.1", "@value": 0.1, "rank": "all",
                          "repeat": "0", "runs": "8", "run": str(i), "health_gate": "pass"} for i in range(3)])
    whole = pd.concat([rows] * 3, ignore_index=True)[:8].assign(point="whole", run=[str(i) for i in range(8)])
    why = catalog.invalid(pd.concat([rows, whole]), resharding.headline, resharding.samples, by="point")
    assert why.to_dict() == {"short": "3 of the 8 samples it asked for (runs) measured (run_time)", "whole": ""}


def test_files_parsed_in_parts_of_bounded_bytes_give_the_same_rows(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Point files of any size are parsed at most PARSE_BYTES at a time (memory bounded by bytes, not by a
    count of files): the rows are those of one parse of them all."""
    from reproflow.store import frames

    files = []
    for seed in range(5):
        write_run(tmp_path / f"r{seed}", seed, busbw=10.0, latency=5.0, commit="c", device="a CPU",
                  sizes=tuple(2 ** k for k in range(10, 10 + 3 * (seed + 1))))
        files += [(tmp_path / f"r{seed}", str(p)) for p in (tmp_path / f"r{seed}").rglob("*.csv")]

    def rows() -> pd.DataFrame:
        found = pd.concat([f.rows for f in frames.read_point_frames(files)])
        return found.drop(columns="@pid").sort_values(["@file", "metric", "repeat", "size_bytes"])

    whole = rows()
    monkeypatch.setattr(frames, "PARSE_BYTES", 1)
    parts = []
    real = frames._parse_together
    monkeypatch.setattr(frames, "_parse_together",
                        lambda head, found, per_point: parts.append(len(found)) or real(head, found, per_point))
    assert rows().reset_index(drop=True).equals(whole.reset_index(drop=True)) and parts == [1] * len(files)
