"""nccl-tests as the third param comms implementation: parsers on output recorded on an NVIDIA H200
(tests/data/nccl-tests/README.md), damaged output, flags, and where it refuses to run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from reproflow.families.param_comms import FAMILY, table
from reproflow.families.param_comms.nccl_tests import (
    BINARY,
    argv,
    parse_json,
    parse_text,
    reduced_maximum,
    runtime_check,
    sweep_length,
)
from reproflow.rank.tools import ToolOutputError
from reproflow.spec.errors import ParamError
from reproflow.spec.family import Measurement
from reproflow.spec.params import resolve

DATA = ROOT / "tests" / "data" / "nccl-tests"
ALL_REDUCE = (DATA / "all_reduce_perf.txt").read_text()


@pytest.mark.parametrize("binary", sorted(BINARY.values()))
def test_every_recorded_binary_parses_whole(binary):
    run = parse_text((DATA / f"{binary}.txt").read_text())
    sizes = [r.size_bytes for r in run.rows]
    assert sizes[1:] == [8 * 2**i for i in range(1, 28)]  # -b 8 -e 1G -f 2
    # all_gather, reduce_scatter and alltoall round the 8-byte first size down to an empty buffer.
    assert sizes[0] == (0 if binary in ("all_gather_perf", "reduce_scatter_perf", "alltoall_perf") else 8)
    assert run.version == "2.19.6 (NCCL 2.28.9)"
    for row in run.rows:
        for t in row.timings.values():
            assert t.time_us > 0 and t.wrong in (0.0, None)


def test_columns_land_where_nccl_tests_prints_them():
    last = parse_text(ALL_REDUCE).rows[-1]  # 1073741824 268435456 float sum -1 503.10 2134.2 0.00 0 0.63 2e+06 0.00 0
    assert (last.size_bytes, last.count, last.dtype, last.redop, last.root) == (2**30, 2**28, "float", "sum", -1)
    assert (last.timings["out_of_place"].time_us, last.timings["out_of_place"].algbw) == (503.10, 2134.2)
    assert last.timings["in_place"].algbw == 2e6 and last.timings["in_place"].wrong == 0
    # One GPU: all_reduce's busBW factor 2(n-1)/n is 0, broadcast's is 1.
    assert all(t.busbw == 0 for r in parse_text(ALL_REDUCE).rows for t in r.timings.values())
    bcast = parse_text((DATA / "broadcast_perf.txt").read_text())
    assert all(r.timings["out_of_place"].busbw == r.timings["out_of_place"].algbw for r in bcast.rows)


def test_unchecked_columns_read_as_none():
    # alltoall prints #wrong N/A in place (it has no in-place form).
    run = parse_text((DATA / "alltoall_perf.txt").read_text())
    assert {r.timings["in_place"].wrong for r in run.rows} == {None}


@pytest.mark.parametrize("binary", ["all_reduce_perf", "all_gather_perf"])
def test_json_output_gives_the_rows_of_the_text(binary):
    text, doc = parse_text((DATA / f"{binary}.txt").read_text()), parse_json((DATA / f"{binary}.json").read_text())
    assert doc.version == "NCCL 2.28.9"
    assert [(r.size_bytes, r.count, r.dtype) for r in doc.rows] == [(r.size_bytes, r.count, r.dtype) for r in text.rows]
    for j, t in zip(doc.rows, text.rows, strict=True):  # the text rounds what the JSON holds
        for p in ("out_of_place", "in_place"):
            assert j.timings[p].time_us == pytest.approx(t.timings[p].time_us, abs=0.006)


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda t: t[: t.index("  1073741824")], "truncated"),                   # last row missing
        (lambda t: t[: t.index("  1073741824") + 60], "expected 13 columns"),    # cut inside the last row
        (lambda t: t.replace("503.10", "5o3.10"), "not a number"),
        (lambda t: t.replace("# Avg bus bandwidth", "# Avg bus"), "did not finish"),
        (lambda t: t.replace("# nThread", "# nthread"), "not nccl-tests output"),
        (lambda t: (ROOT / "tests" / "data" / "param" / "comms_all_reduce_w2_gloo.txt").read_text(),
         "not nccl-tests output"),
        (lambda t: "", "not nccl-tests output"),
    ],
)
def test_damaged_text_gives_a_clear_error_and_no_rows(damage, words):
    with pytest.raises(ToolOutputError, match=words):
        parse_text(damage(ALL_REDUCE))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda t: t[: len(t) // 2], "not complete JSON"),
        (lambda t: json.dumps(json.loads(t) | {"results": json.loads(t)["results"][:-1]}), "truncated"),
        (lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "config"}), "lacks or garbles"),
    ],
)
def test_damaged_json_gives_a_clear_error(damage, words):
    with pytest.raises(ToolOutputError, match=words):
        parse_json(damage((DATA / "all_reduce_perf.json").read_text()))


LOWERED = 268435456  # a top below the 1G asked for, as where the GPU cannot hold the sweep (-e 8G on 24 GB)
ALL_REDUCE_JSON = (DATA / "all_reduce_perf.json").read_text()


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.split() and line.split()[0].isdigit()]


def _lowered_text(text: str) -> str:
    """The run as nccl-tests prints it when it lowers the sweep's top for memory (common.cu): the header
    still announces 1G, then the '# Reducing maxBytes' line, and the rows stop at the new top."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "# nThread" in line) + 1
    lines[at:at] = ["#", f"# Reducing maxBytes to {LOWERED} due to memory limitation"]
    return "\n".join(x for x in lines if not (x.split() and x.split()[0].isdigit() and int(x.split()[0]) > LOWERED))


def _lowered_json(text: str) -> str:
    doc = json.loads(text)
    return json.dumps(doc | {"results": [r for r in doc["results"] if r["size"] <= LOWERED]})


def test_a_sweep_lowered_for_memory_is_a_complete_run():
    text = parse_text(_lowered_text(ALL_REDUCE))
    assert text.rows[-1].size_bytes == LOWERED and len(text.rows) == len(_rows(ALL_REDUCE)) - 2
    doc = parse_json(_lowered_json(ALL_REDUCE_JSON), reduced_maximum(_lowered_text(ALL_REDUCE)))
    assert [r.size_bytes for r in doc.rows] == [r.size_bytes for r in text.rows]
    with pytest.raises(ToolOutputError, match="lowered the sweep for memory, which only its text output says"):
        parse_json(_lowered_json(ALL_REDUCE_JSON))


def _each_row_twice(text: str, other: str = "") -> str:
    """Every row again after the sweep: a second dtype (-d all) when `other` names it, else a second cycle."""
    rows = _rows(text)
    again = [r.replace(" float ", f" {other} ") if other else r for r in rows]
    return text.replace(rows[-1], "\n".join([rows[-1], *again]))


@pytest.mark.parametrize(("form", "words"), [
    (lambda t: _each_row_twice(t, "half"), r"2 data types or operations \(float/sum, half/sum: -d all or -o all\)"),
    (_each_row_twice, r"its sizes repeat: the sweep ran several times \(-N, or two runs in one log\)"),
    (lambda t: "\n".join("0: " + x for x in t.splitlines()), "srun --label prefixes"),
    (lambda t: t.replace("  time   algbw", "  cputime   algbw"), "a -C 1 run"),
    (lambda t: t.replace("503.10", "nan", 1), "'nan' is not a finite number"),
    (lambda t: t.replace("503.10", "inf", 1), "'inf' is not a finite number"),
])
def test_text_of_another_run_shape_is_refused_saying_what(form, words):
    with pytest.raises(ToolOutputError, match=words):
        parse_text(form(ALL_REDUCE))


def _json_with(text: str, change) -> str:
    doc = json.loads(text)
    change(doc["results"])
    return json.dumps(doc)


@pytest.mark.parametrize(("form", "words"), [
    (lambda t: _json_with(t, lambda rs: rs[3]["out_of_place"].update(time="nan")),
     r"results\[3\]\.out_of_place\.time is 'nan', not a finite number"),
    (lambda t: _json_with(t, lambda rs: rs[3]["in_place"].update(bus_bw=float("inf"))), "not a finite number"),
    (lambda t: _json_with(t, lambda rs: [r[p].update(cpu_time=r[p].pop("time")) for r in rs
                                         for p in ("out_of_place", "in_place")]), "a -C 1 run"),
    (lambda t: _json_with(t, lambda rs: rs.extend(json.loads(t)["results"])), "its sizes repeat"),
])
def test_json_of_another_run_shape_is_refused_saying_what(form, words):
    with pytest.raises(ToolOutputError, match=words):
        parse_json(form(ALL_REDUCE_JSON))


@pytest.mark.parametrize(("change", "words"), [
    (lambda t: t.replace("#wrong", " error"), "an older or other tool's table"),
    (lambda t: t.replace("#wrong", "#wrong", 1).replace("busbw  #wrong \n", "busbw  errors \n"), "older or other"),
    (lambda t: t.replace("Out of bounds values : 0 OK", "Out of bounds values : 12 FAILED"), "check failed"),
])
def test_a_table_read_by_its_header_and_a_failed_check_refused(change, words):
    """The check columns are read only where the header names them #wrong, and nccl-tests' own verdict on
    its check is honoured."""
    text = change(ALL_REDUCE)
    assert text != ALL_REDUCE
    with pytest.raises(ToolOutputError, match=words):
        parse_text(text)


def test_sweep_length_follows_the_tools_loop():
    assert sweep_length(8, 1 << 30, 2, 0) == 28
    assert sweep_length(1024, 4096, 1, 1024) == 4
    assert sweep_length(5, 4, 2, 0) == 0


@settings(max_examples=300, deadline=None)
@given(minimum=st.integers(-4, 1 << 62), maximum=st.integers(0, 1 << 62), factor=st.integers(0, 8),
       step=st.integers(-2, 1 << 40))
def test_sweep_length_is_the_loops_count_or_says_the_sweep_never_ends(minimum, maximum, factor, step):
    """Any header's sweep, up to 2^62 bytes: the count nccl-tests' loop reaches, computed at once; a sweep
    whose size never grows is an error, never a loop without end."""
    try:
        n = sweep_length(minimum, maximum, factor, step)
    except ToolOutputError as exc:
        assert "never grows" in str(exc)
        assert minimum <= maximum and ((factor > 1 and minimum <= 0) or (factor <= 1 and step <= 0))
        return
    if minimum > maximum:
        assert n == 0
        return
    grow = (lambda size: size * factor) if factor > 1 else (lambda size: size + step)
    sizes = [minimum + (n - 1) * step] if factor <= 1 else [minimum * factor ** (n - 1)]
    assert sizes[0] <= maximum < grow(sizes[0])


def test_options_map_to_nccl_tests_flags():
    params = resolve(FAMILY.params, {"collective": "reduce", "begin_size": "1M", "end_size": "64M", "step_factor": 4,
                                     "iters": 7, "warmup_iters": 2, "blocking": True, "dtype": "bfloat16",
                                     "root": 1, "check": False, "implementation": "nccl-tests"})
    cmd = argv(params, 8, Path("/opt/nccl-tests/build/reduce_perf"), "/tmp/r.json")
    assert cmd[0] == "/opt/nccl-tests/build/reduce_perf"
    assert dict(zip(cmd[1::2], cmd[2::2], strict=True)) == {
        "-b": "1048576", "-e": "67108864", "-f": "4", "-g": "8", "-w": "2", "-n": "7", "-c": "0", "-z": "1",
        "-d": "bfloat16", "-r": "1", "-J": "/tmp/r.json"}
    stepped = argv(resolve(FAMILY.params, {"step_bytes": "1M", "implementation": "nccl-tests"}), 2, Path("x"), "j")
    assert stepped[stepped.index("-f") + 1] == "1" and stepped[stepped.index("-i") + 1] == "1048576"


def _ctx(device: str, hosts: list[str]) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device(device), hosts=lambda: hosts)


def test_refuses_cpus_several_nodes_and_missing_binaries(monkeypatch, tmp_path):
    params = resolve(FAMILY.params, {"implementation": "nccl-tests"})
    with pytest.raises(ParamError, match="needs GPUs"):
        runtime_check(params, _ctx("cpu", ["node1"]))
    with pytest.raises(ParamError, match=r"spans 2.*srun --mpi=pmix"):
        runtime_check(params, _ctx("cuda", ["node1", "node2"]))
    monkeypatch.setenv("NCCL_TESTS_DIR", str(tmp_path))
    with pytest.raises(ParamError, match="NCCL_TESTS_DIR"):
        runtime_check(params, _ctx("cuda", ["node1", "node1"]))


def test_table_shows_the_mean_time_and_no_percentiles():
    coords = {"size_bytes": 1024, "elements_per_rank": 256}
    rows = [Measurement("time_us", 4.5, "us", coords), Measurement("algbw", 0.2, "GB/s", coords),
            Measurement("busbw", 0.0, "GB/s", coords)]
    text = table(resolve(FAMILY.params, {"implementation": "nccl-tests"}), rows)
    assert "(nccl-tests," in text and "Time(us):mean" in text and "4.5" in text and " - " in text
