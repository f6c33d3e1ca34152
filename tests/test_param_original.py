"""The original param comms.py as an implementation: its parser, its flags, and runs beside reproflow."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, reproflow

from reproflow.families.param_comms import FAMILY
from reproflow.families.param_comms.original import argv, parse_comms, runtime_check
from reproflow.rank.tools import ToolOutputError
from reproflow.spec.errors import ParamError, SuiteError
from reproflow.spec.params import resolve
from reproflow.spec.suite import load_suite

DATA = ROOT / "tests" / "data" / "param"
ALL_REDUCE = (DATA / "comms_all_reduce_w2_gloo.txt").read_text()
ALL_TO_ALL = (DATA / "comms_all_to_allv_w4_blocking_gloo.txt").read_text()


def test_parses_recorded_param_output():
    rows = parse_comms(ALL_REDUCE)
    assert [r.size_bytes for r in rows] == [1048576, 2097152, 4194304]
    first = rows[0]
    assert (first.collective, first.dtype, first.elements_per_rank) == ("all_reduce", "float32", 262144)
    assert first.stats_us["latency_p50_us"] == 1536.6 and first.stats_us["latency_max_us"] == 1612.3
    assert (first.algbw, first.busbw) == (0.718, 0.718)  # 2 ranks: all_reduce factor 2(n-1)/n = 1


def test_param_busbw_uses_the_same_factor_as_reproflow():
    for row in parse_comms(ALL_TO_ALL):  # 4 ranks, all_to_allv: (n-1)/n
        assert row.busbw == pytest.approx(row.algbw * 3 / 4, abs=1.5e-3)


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda t: t[: t.rindex("COMMS-RES-")], "truncated"),                     # last result line missing
        (lambda t: t[: t.rindex("COMMS-RES-") + 40], "expected 9 numbers"),      # cut inside the last line
        (lambda t: t.replace("1536.6", "15x6.6"), "non-numeric"),
        (lambda t: t.replace("allSizes", "allSizez"), "no 'allSizes"),
        (lambda t: (DATA / "compute_gemm_C_cpu.txt").read_text(), "not comms.py output"),
        (lambda t: "", "no 'allSizes"),
    ],
)
def test_damaged_output_gives_a_clear_error_and_no_rows(damage, words):
    with pytest.raises(match=words):
        parse_comms(damage(ALL_REDUCE))


def _pair_mode(text: str) -> str:
    """The recorded run as comms.py prints it with --pair: nElementsPairPerRank after nElementsPerRank."""
    out = []
    for line in text.splitlines():
        if "COMMS-RES " in line:
            line = line.replace("size (B)", "total-size (B)").replace("nElementsPerRank", "nElementsPerRank"
                                                                         "  nElementsPairPerRank")
        elif "COMMS-RES-" in line:
            head, size, elements, *rest = line.split()
            line = "\t".join([head, size, elements, str(int(elements) * 2), *rest])
        out.append(line)
    return "\n".join(out)


def _with_tflops(text: str) -> str:
    """The recorded run as comms-compute mode prints it: a TFlops column at the end."""
    return "\n".join(line + ("   TFlops" if "COMMS-RES " in line else "   0.01234" if "COMMS-RES-" in line else "")
                     for line in text.splitlines())


@pytest.mark.parametrize("form", [_pair_mode, _with_tflops, lambda t: _with_tflops(_pair_mode(t))],
                         ids=["pair", "comms-compute", "pair-comms-compute"])
def test_other_modes_columns_are_read_by_their_header(form):
    rows = parse_comms(form(ALL_REDUCE))
    assert [(r.size_bytes, r.elements_per_rank, r.algbw, r.busbw) for r in rows] == \
        [(r.size_bytes, r.elements_per_rank, r.algbw, r.busbw) for r in parse_comms(ALL_REDUCE)]
    assert rows[0].stats_us["latency_p50_us"] == 1536.6 and rows[0].stats_us["latency_max_us"] == 1612.3


@pytest.mark.parametrize(("damage", "words"), [
    (lambda t: _pair_mode(t).replace("nElementsPairPerRank", ""), r"expected 9 numbers .* got 10"),
    (lambda t: t.replace("1574.4", "nan"), "not a finite number"),
    (lambda t: t.replace("0.730       0.730", "inf       inf"), "not a finite number"),
    (lambda t: t.replace("Latency(us):p50", "pingLatency(us):p50"), "a pt2pt run"),
    (lambda t: "\n".join(x for x in t.splitlines() if "COMMS-RES " not in x), "no 'COMMS-RES  size"),
])
def test_a_wrong_mode_or_value_is_refused_saying_what(damage, words):
    with pytest.raises(ToolOutputError, match=words):
        parse_comms(damage(ALL_REDUCE))


def test_options_map_to_params_own_flags():
    params = resolve(FAMILY.params, {"collective": "all_gather", "begin_size": "1M", "end_size": "4M",
                                     "iters": 7, "warmup_iters": 2, "blocking": True, "dtype": "int64",
                                     "implementation": "param"})
    cmd = argv(params, "gloo", "cpu", Path("comms.py"))
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert flags == {"--master-ip": "{MASTER_ADDR}", "--master-port": "{MASTER_PORT}", "--backend": "gloo",
                     "--device": "cpu", "--collective": "all_gather_base", "--b": "1048576", "--e": "4194304",
                     "--f": "2", "--sb": "0", "--w": "2", "--n": "7", "--z": "1", "--data-type": "long",
                     "--root": "0", "--c": "1"}
    assert "--num-iters" not in cmd  # not a param flag: param would ignore it silently


def test_options_param_cannot_honour_are_rejected(write_suite, tmp_path, monkeypatch):
    path = write_suite("""
        [[experiment]]
        name = "c"
        family = "param_comms"
        launch = { procs_per_node = 2 }
        params = { collective = "send_recv", implementation = "param" }
    """)
    with pytest.raises(SuiteError, match=r"param's comms\.py has no 'send_recv'"):
        load_suite(path)
    checked = resolve(FAMILY.params, {"collective": "reduce", "implementation": "param"})
    with pytest.raises(ParamError, match="cannot check reduce data in non-blocking mode"):
        FAMILY.check(checked, 2)
    params = resolve(FAMILY.params, {"dtype": "bfloat16", "implementation": "param"})
    monkeypatch.setenv("PARAM_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ParamError, match="needs \\$PARAM_DIR"):
        runtime_check(params, "gloo")
    script = tmp_path / "param" / "train" / "comms" / "pt" / "comms.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    monkeypatch.setenv("PARAM_DIR", str(tmp_path / "param"))
    with pytest.raises(ParamError, match="refuses bfloat16 with gloo"):
        runtime_check(params, "gloo")


SUITE = """
[launch]
backend = "gloo"
device = "cpu"
time_limit = "00:05:00"
[[experiment]]
name = "c"
family = "param_comms"
launch = { procs_per_node = 2 }
params = { iters = 2, warmup_iters = 1, check = false }
zip = { begin_size = ["1M", "2M"], end_size = ["1M", "2M"] }
matrix = { collective = ["all_reduce"], implementation = ["reproflow", "param"] }
"""


@pytest.mark.distributed
def test_without_a_param_checkout_param_points_fail_clearly_and_the_rest_run(write_suite, tmp_path):
    results = tmp_path / "r"
    proc = reproflow("run", str(write_suite(SUITE)), "--results", str(results), env={"PARAM_DIR": ""})
    assert proc.returncode == 3
    assert len(list(results.rglob("*.csv"))) == 2 and len(list(results.rglob("*.failed.json"))) == 2
    assert "needs $PARAM_DIR" in proc.stdout


@pytest.mark.distributed
@pytest.mark.skipif(not os.environ.get("PARAM_DIR"), reason="set PARAM_DIR to a param checkout (commit "
                    "6236487e8969838822b52298c2a2318f6ac47bbd) to run the original comms.py here")
def test_original_comms_runs_beside_reproflow_in_one_job(write_suite, tmp_path):
    results = tmp_path / "r"
    proc = reproflow("run", str(write_suite(SUITE)), "--results", str(results))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = pd.concat(pd.read_csv(p) for p in results.rglob("*.csv"))
    assert rows["job_id"].nunique() == 1  # one job, same allocation
    busbw = rows[rows["metric"] == "busbw"]
    assert set(busbw["implementation"]) == {"reproflow", "param"}
    original = busbw[busbw["implementation"] == "param"]
    assert original["command"].str.contains("comms.py").all()
    assert original["command"].str.contains("--collective all_reduce").all()
    assert original["tool_version"].str.len().eq(40).all()
    assert sorted(original["size_bytes"]) == [2**20, 2**21]
    order = [line for line in proc.stdout.splitlines() if "] collective=" in line]
    assert "implementation=reproflow" in order[0] and "implementation=param" in order[1]  # alternating per size
    assert "begin_size=1048576" in order[0] and "begin_size=1048576" in order[1]
