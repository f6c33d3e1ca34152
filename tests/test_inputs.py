"""Bad input: generated hostile suite files (bytes that are not UTF-8, nesting and integers past the
parsers, non-finite numbers, huge sweeps), command-line values, Aceso configs, CFP profiles, results
folders (point files, failure, job and environment records, run manifests) fed to report, status, runs
and compare, archives, and the job script's container branches give one clear error (never a
traceback), run nothing, and inject nothing into the job scripts they render.

Every generated input is counted, by kind, in the fault-injection summary. Rendered scripts are run for real
in bash, with `srun` and `scontrol` replaced by shell functions that record their arguments: a
value that escaped its quoting would run `touch <marker>`; a value that kept it arrives at srun
byte for byte.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import BAD_INPUTS, OUTCOMES, ROOT, archive_of, reproflow
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reproflow.app import cli
from reproflow.families.aceso.layout import load_config, model_ops
from reproflow.families.aceso.models import model
from reproflow.families.aceso.plans import config_from_counts, read_config, write_json
from reproflow.families.cfp.passes import _segment_profile
from reproflow.launch.job import Job
from reproflow.launch.render import render_sbatch
from reproflow.launch.submit import SlurmExecutor
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.suite import LAUNCH_FIELDS, load_suite

MARK = Path(tempfile.gettempdir()) / f"reproflow-injected-{os.getpid()}"
PAYLOADS = [f"$(touch {MARK})", f"`touch {MARK}`", f"'; touch {MARK}; '", f'"; touch {MARK}; "',
            f"\ntouch {MARK}\n", f"x; touch {MARK}", f"x && touch {MARK} #", f"\r\ntouch {MARK}",
            f"${{IFS}}touch${{IFS}}{MARK}", f"|touch {MARK}", f"\u2028touch {MARK}", f"a\\\ntouch {MARK}",
            f"$'\\ntouch {MARK}'", f"*; touch {MARK}"]
SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

hostile = st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=24),
                    st.builds(lambda a, p, b: a + p + b, st.text(max_size=4), st.sampled_from(PAYLOADS),
                              st.text(max_size=4)))
scalar = st.one_of(st.booleans(), st.integers(-2**70, 2**70), st.floats(), hostile)
value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=6), inner, max_size=3), max_leaves=5)


# The tests that count bad inputs, and the one that checks the count, run on one pytest-xdist worker in
# file order (the count is per process).
COUNTED = pytest.mark.xdist_group("bad-inputs")


def _count(kind: str, *outcomes: str) -> None:
    """One generated input of `kind` (for the summary line), with what it did that it must not (OUTCOMES;
    an empty string for none)."""
    BAD_INPUTS["inputs"] += 1
    BAD_INPUTS[f"kind:{kind}"] = BAD_INPUTS.get(f"kind:{kind}", 0) + 1
    for outcome in filter(None, outcomes):
        BAD_INPUTS[outcome] += 1
    BAD_INPUTS["failed"] += any(outcomes)


@contextlib.contextmanager
def no_traceback(kind: str, *allowed: type[BaseException]):
    """Count one generated input; any exception but the `allowed` clear errors counts as a traceback."""
    try:
        yield
    except allowed:
        _count(kind)
    except BaseException:
        _count(kind, "tracebacks")
        raise
    else:
        _count(kind)


# ---- suite files -> rendered sbatch scripts, run in bash ------------------------------------------------

STUBS = """srun() { printf '%s\\0' "$@" >> "$ARGV_OUT"; printf 'END\\0' >> "$ARGV_OUT"; }
scontrol() { echo node1; }
"""


def run_script(text: str, where: Path) -> list[list[str]]:
    """Run a job script in bash with srun/scontrol recorded instead of run; every srun call's arguments."""
    script, stubs, argv = where / "job.sbatch", where / "stubs.sh", where / "argv"
    script.write_text(text)
    stubs.write_text(STUBS)
    argv.unlink(missing_ok=True)
    env = {"PATH": "/usr/bin:/bin", "BASH_ENV": str(stubs), "ARGV_OUT": str(argv), "HOME": str(where),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1",
           "SLURM_SUBMIT_DIR": str(where), "IMAGE": "", "REPROFLOW_CHECKOUT": str(ROOT)}
    subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=60)
    calls: list[list[str]] = [[]]
    for item in (argv.read_bytes().decode(errors="replace").split("\0")[:-1] if argv.exists() else []):
        if item == "END":
            calls.append([])
        else:
            calls[-1].append(item)
    return calls[:-1]


def _injected() -> bool:
    if MARK.exists():
        MARK.unlink()
        return True
    return False


class Raw(str):
    """TOML text written as it is: values a Python object cannot carry into the file (a 5000-digit integer)."""


# The inputs that break parsers rather than checks: nesting past any stack, integers past Python's
# conversion limit or 64 bits, non-finite numbers.
extreme = st.one_of(st.integers(33, 600).map(lambda d: Raw("[" * d + "1" + "]" * d)),
                    st.integers(4301, 6000).map(lambda n: Raw("9" * n)),
                    st.sampled_from([Raw("nan"), Raw("inf"), Raw("-inf"), Raw(str(2**64)), Raw("1e400")]))
# An experiment of four 100-value keys: 10^8 points, refused before one is built.
HUGE_SWEEP = {k: list(range(1, 101)) for k in ("iters", "warmup_iters", "step_factor", "root")}


def toml_value(v: object) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == -float("inf") else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_doc(doc: dict) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items()
             if not isinstance(v, dict) and not (k == "experiment" and isinstance(v, list))]
    for key, table in doc.items():
        if isinstance(table, dict):
            lines += [f"[{json.dumps(key)}]", *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items())]
    for exp in doc.get("experiment", []) if isinstance(doc.get("experiment"), list) else []:
        lines.append("[[experiment]]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in (exp.items() if isinstance(exp, dict) else [])]
    return "\n".join(lines) + "\n"


def base_suite() -> dict:
    return {"suite": {"name": "fuzz", "description": "generated"},
            "launch": {"backend": "gloo", "device": "cpu", "time_limit": "00:05:00"},
            "experiment": [{"name": "c", "family": "param_comms", "params": {"begin_size": "1K", "end_size": "2K"},
                            "matrix": {"collective": ["all_reduce"]}}]}


FIELDS = [("suite", "name"), ("suite", "description"), ("suite", "hardware"), ("suite", "expected"),
          ("suite", "container"), *[("launch", f) for f in LAUNCH_FIELDS], ("experiment", 0, "name"),
          ("experiment", 0, "family"), ("experiment", 0, "description"), ("experiment", 0, "params", "iters"),
          ("experiment", 0, "params", "dtype"), ("experiment", 0, "matrix", "collective"),
          ("experiment", 0, "launch", "partition"), ("experiment", 0, "launch", "procs_per_node"),
          ("experiment", 0, "zip"), ("suite",), ("launch",), ("experiment",), ("bogus",)]


@st.composite
def suites(draw) -> tuple[str, str | bytes]:
    """(directory name, suite text): a valid suite with 1-3 fields replaced by hostile values, or raw junk."""
    dirname = draw(st.one_of(st.just("plain"), hostile).filter(
        lambda s: s not in ("", ".", "..") and "/" not in s and "\0" not in s and len(s.encode("utf-8",
                                                                                             "replace")) < 100))
    if draw(st.integers(0, 9)) == 0:  # junk, bytes that are not UTF-8 among it
        return dirname, draw(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
    doc = base_suite()
    if draw(st.integers(0, 19)) == 0:
        doc["experiment"][0]["matrix"] |= HUGE_SWEEP
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(FIELDS))
        node: object = doc
        for key in path[:-1]:
            node = node[key] if isinstance(node, dict | list) and ((isinstance(node, dict) and key in node) or
                                                                   (isinstance(node, list) and len(node) > key)) \
                else None
        if isinstance(node, dict):
            node[path[-1]] = draw(st.one_of(value, extreme))
    text = toml_doc(doc)
    if draw(st.integers(0, 9)) == 0:  # a whole suite with bytes that are not UTF-8 in it
        at = draw(st.integers(0, len(text)))
        return dirname, text[:at].encode() + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + \
            text[at:].encode()
    return dirname, text


@COUNTED
@settings(SETTINGS, max_examples=400)
@given(case=suites())
def test_generated_suites_load_or_name_the_field_and_never_inject(case, tmp_path):
    dirname, text = case
    if dirname.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") != dirname:
        dirname = "surrogate"
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    where = folder / dirname
    where.mkdir()
    path = where / "fuzz.toml"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    try:
        suite = load_suite(path)
        script = render_sbatch(suite, ROOT)
    except ReproflowError as exc:
        message = str(exc)
        assert "field '" in message or "does not exist" in message, message
        _count("suite files")
        return
    except BaseException:
        _count("suite files", "tracebacks")
        raise
    calls = run_script(script, folder)
    injected = _injected()
    _count("suite files", "injections" if injected else "")
    assert not injected, script
    suites_seen = [c[c.index("--suite") + 1] for c in calls if "--suite" in c]
    assert suites_seen and set(suites_seen) == {str(path.resolve())}, calls


# ---- CLI values ------------------------------------------------------------------------------------------

# Values as a shell passes them: hostile text, option-like words, numbers no count or size takes.
arg = st.one_of(hostile, st.sampled_from(["-2", "0", "-", "--", "-x", "--help-me", "nan", "inf", "1e400", "9" * 5000,
                                          "1" * 30])).filter(lambda s: "\0" not in s)
options = st.lists(st.one_of(*(st.tuples(st.just(o), arg) for o in (
    "--set", "--procs", "--procs-per-node", "-e", "--results", "--partition", "--image", "--mounts", "--nodes",
    "--retries", "--max-parallel", "--after"))), max_size=3)


@COUNTED
@settings(SETTINGS, max_examples=300)
@given(command=st.sampled_from(["run", "submit", "list", "status", "report"]),
       suite=st.one_of(st.sampled_from(["param-demo", "resharding", "spatial-small"]), arg), opts=options)
def test_generated_cli_values_give_one_clear_error(command, suite, opts, tmp_path):
    argv = [command]
    if command in ("run", "submit", "list"):
        argv.append(suite)
    for name, val in opts:
        if command in ("run", "submit") or name == "--results":
            argv += [name, val]
    if command in ("run", "submit"):
        argv.append("--dry-run")
    if command in ("status", "report") and "--results" not in argv:
        argv += ["--results", str(tmp_path / "none")]
    if command == "report":
        argv += ["--out", str(tmp_path / "out")]
    err = io.StringIO()
    with no_traceback("command lines"), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse: usage and the option at fault
            code = exc.code
    assert code in (0, 2), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert err.getvalue().strip(), argv


@COUNTED
@pytest.mark.parametrize("command", [["run", "smoke"], ["submit", "smoke", "--dry-run"], ["runs"], ["history"],
                                     ["status"], ["report"], ["archive"], ["nodes"]])
@pytest.mark.parametrize("bad", [os.fsdecode(b"/tmp/r\xff\xfe"), "/tmp/r\ntouch x\n#", "/tmp/\x1b]0;title\x07",
                                 "/tmp/" + "r" * 5000])
def test_a_value_no_command_can_take_is_refused_before_anything_runs(command, bad, tmp_path, monkeypatch):
    """Bytes that are not UTF-8, control characters and overlong values, in any option of any command: one
    line naming the option, exit 2, nothing written (a run's manifest is never left running)."""
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with no_traceback("command lines"), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main([*command, "--results", bad])
    assert code == 2 and err.getvalue().startswith("reproflow: error: --results "), err.getvalue()
    assert len(err.getvalue().splitlines()) == 1 and not list(tmp_path.iterdir())


@COUNTED
@pytest.mark.parametrize("missing", ["/a/missing/path", "../up/there", "2026*", "[x]"])
def test_compare_of_what_is_neither_a_folder_nor_a_run_names_it(missing, tmp_path):
    err = io.StringIO()
    with no_traceback("command lines"), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["compare", missing, str(tmp_path), "--out", str(tmp_path / "out")])
    assert code == 2 and f"{missing}: not a results folder, an archive or one run's id" in err.getvalue()


@COUNTED
def test_render_refuses_a_script_sbatch_would_refuse_and_a_committed_name(tmp_path):
    """A description of 5 MB would make a job script longer than sbatch's 4 MB; a suite from elsewhere named
    like a committed one would overwrite that suite's script: both refused before anything is written."""
    committed = ROOT / "sbatch" / "smoke.sbatch"
    before = committed.read_bytes()
    big = tmp_path / "big.toml"
    big.write_text('[suite]\ndescription = "' + "x" * (5 * 2**20) + '"\n' + TINY.format(launch="", iters="2",
                                                                                       matrix=""))
    twin = tmp_path / "twin" / "smoke.toml"
    twin.parent.mkdir()
    twin.write_text(TINY.format(launch="", iters="2", matrix=""))
    for suite, words in ((big, "more than the 4,194,304 sbatch takes"), (twin, "not overwritten")):
        err = io.StringIO()
        with no_traceback("suites"), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = cli.main(["render", str(suite)])
        assert code == 2 and words in err.getvalue(), err.getvalue()
    assert committed.read_bytes() == before and not (ROOT / "sbatch" / "big.sbatch").exists()


def test_a_bad_experiment_stops_the_run_before_anything_runs(write_suite, tmp_path):
    suite = write_suite("""
        [launch]
        backend = "gloo"
        [[experiment]]
        name = "good"
        family = "param_comms"
        [[experiment]]
        name = "bad"
        family = "param_comms"
        params = { iters = "many" }
        """)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["run", str(suite), "--results", str(tmp_path / "r")])
    assert code == 2 and "field 'experiment[1].params'" in err.getvalue() and "'iters': 'many'" in err.getvalue()
    assert not (tmp_path / "r").exists()


# ---- the job scripts `reproflow submit` writes -----------------------------------------------------------

@COUNTED
@settings(SETTINGS, max_examples=100)
@given(image=hostile, mounts=hostile, partition=hostile, results=hostile, sets=st.lists(hostile, max_size=2))
def test_submitted_scripts_quote_every_value_and_refuse_line_breaks(image, mounts, partition, results, sets,
                                                                     tmp_path):
    """The image, the mounts, the partition, the results folder and the --set values reach the job script
    quoted, or are refused naming the option; the script run under bash injects nothing, and its job
    reads each value back as given."""
    suite = load_suite(ROOT / "workflows" / "param-demo.toml")
    where = tmp_path / ("results" + results)
    try:
        texts = [SlurmExecutor(results=where, root=ROOT, job=Job(image=image and "/" + image, mounts=mounts,
                                                                  partition=partition), retry_of=image,
                               sets=tuple(sets)).dry_run(suite, suite.experiments[0])]
    except ReproflowError as exc:
        options = ("--image", "--mounts", "--partition", "--results", "REPROFLOW_RETRY_OF")
        assert any(o in str(exc) for o in options), exc
        _count("submitted job scripts")
        return
    except BaseException:
        _count("submitted job scripts", "tracebacks")
        raise
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    calls = run_script(texts[0], folder)
    injected = _injected()
    _count("submitted job scripts", "injections" if injected else "")
    assert not injected, texts[0]
    if image:  # no such squash file: the job stops before any step, naming it as given
        assert not calls, calls
        return
    (step,) = [c for c in calls if "--results" in c]
    assert step[step.index("--results") + 1] == str(where.resolve()), step
    assert [step[i + 1] for i, a in enumerate(step) if a == "--set"] == list(sets), step


@COUNTED
@settings(SETTINGS, max_examples=60)
@given(results=hostile)
def test_run_dry_run_prints_a_command_a_shell_reads_back(results, tmp_path):
    """`run --dry-run` prints each rank's command quoted: a shell splits it back into the folder given, or
    the folder is refused before anything is printed."""
    folder = str(tmp_path / ("r" + results))
    out, err = io.StringIO(), io.StringIO()
    with no_traceback("command lines"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["run", "smoke", "--results", folder, "--dry-run"])
    if code == 2:
        assert err.getvalue().startswith("reproflow: error: --results "), err.getvalue()
        return
    assert code == 0, err.getvalue()
    line = next(x for x in out.getvalue().splitlines() if "-m reproflow.worker" in x)
    words = shlex.split(line)
    assert words[words.index("--results") + 1] == folder


# ---- Aceso configs and CFP profiles -------------------------------------------------------------------------

SEQ = 64


@pytest.fixture(scope="module")
def good_config(tmp_path_factory) -> dict:
    m = model("gpt", "tiny")
    n = 55
    ops = [o.name for o in model_ops(m.name, m.size, m.num_layers, 4, [0] * n, SEQ)]
    path = tmp_path_factory.mktemp("aceso") / "good.json"
    write_json(config_from_counts(m, 8, 4, ops, [30, 25], [2] * n, [1] * n, [0] * n, [0] * n), path)
    load_config(path, SEQ)
    return json.loads(path.read_text())


@st.composite
def mutated(draw, base: dict) -> str:
    doc = json.loads(json.dumps(base))
    how = draw(st.integers(0, 4))
    if how == 0:
        return json.dumps(doc)[: draw(st.integers(0, len(json.dumps(doc)) - 1))]  # torn
    keys = sorted(doc)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        if how == 1:
            doc.pop(key, None)
        elif how == 2 or not isinstance(doc.get(key), list) or not doc[key]:
            doc[key] = draw(value)
        else:
            outer = doc[key]
            i = draw(st.integers(0, len(outer) - 1))
            if isinstance(outer[i], list) and outer[i] and draw(st.booleans()):
                outer[i][draw(st.integers(0, len(outer[i]) - 1))] = draw(value)
            else:
                outer[i] = draw(value)
    return json.dumps(doc)


@COUNTED
@settings(SETTINGS, max_examples=200)
@given(data=st.data())
def test_generated_aceso_configs_load_or_name_the_field(data, good_config, tmp_path):
    text = data.draw(mutated(good_config))
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "config.json"
    path.write_text(text)
    with no_traceback("Aceso configs", ParamError):
        load_config(path, SEQ)


SEGMENT = {"segment": 0, "layer": "layers.0.0", "signature": "abc", "space": [2, 3], "seconds": 1.5,
           "entries": [{"combo": [1, 2], "time_s": 0.1, "memory_bytes": 10.0, "in": 0, "out": -1}]}


@COUNTED
@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_generated_cfp_profiles_load_or_name_the_field(data, tmp_path):
    text = data.draw(mutated(SEGMENT))
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "segment_0.json"
    path.write_text(text)
    with no_traceback("CFP profiles", ParamError):
        _segment_profile(path, "abc", [2, 3], "profile again")


TINY = """
[launch]
backend = "gloo"
device = "cpu"
{launch}
[[experiment]]
name = "c"
family = "param_comms"
launch = {{ procs_per_node = 1 }}
params = {{ begin_size = "1K", end_size = "1K", warmup_iters = 1, iters = {iters} }}
matrix = {{ collective = ["all_reduce"]{matrix} }}
"""
SEQUENCE = "[" + ", ".join(map(str, range(1, 101))) + "]"
LISTED = {  # name: (suite's [launch] lines, iters, more matrix keys, command after the suite, words of the error)
    "a list nested 500 deep": ("", "[" * 500 + "1" + "]" * 500, "", ["render"], "nested deeper than 32"),
    "a 5000-digit integer": ("", "1" * 5000, "", ["render"], "an integer of more than 4300 digits"),
    "--set of a 5000-digit integer": ("", "2", "", ["run", "--dry-run", "--set", "iters=" + "1" * 5000],
                                      "is longer than 4096 characters"),
    "launch.timeout_s = nan": ("timeout_s = nan", "2", "", ["render"], "'launch.timeout_s': nan is not a finite"),
    "--set iters=inf": ("", "2", "", ["run", "--dry-run", "--set", "iters=inf"], "'iters': inf has the wrong"),
    "an integer beyond 64 bits": ("", str(2**64), "", ["render"], "does not fit in a 64-bit integer"),
    "a sweep of 80,000 points": ("", "2", f", root = {SEQUENCE}, step_bytes = {SEQUENCE}, check = [true, false], "
                                 "dtype = ['float32', 'bfloat16'], blocking = [true, false]", ["render"],
                                 "makes 80,000 points (1 x 100 x 100 x 2 x 2 x 2), more than 10,000"),
    "--procs-per-node -2": ("", "2", "", ["run", "--procs-per-node", "-2"],
                            "argument --procs-per-node: '-2' is not a whole number >= 1"),
    "--nodes 0": ("", "2", "", ["run", "--nodes", "0"], "argument --nodes: '0' is not a whole number >= 1"),
    "--procs, renamed": ("", "2", "", ["run", "--procs", "2"],
                         "--procs is gone: give --nodes N and --procs-per-node P"),
    "--after with a line break": ("", "2", "", ["submit", "--dry-run", "--after", "12\n#SBATCH --export=ALL"],
                                  "--after '12\\n#SBATCH --export=ALL' holds a line break"),
}


@COUNTED
@pytest.mark.parametrize("name", LISTED)
def test_each_listed_bad_input_gets_one_line_naming_the_field(name, write_suite):
    """The inputs a security review fed to this project's commands, each to the command that reads it."""
    launch, iters, matrix, command, words = LISTED[name]
    suite = write_suite(TINY.format(launch=launch, iters=iters, matrix=matrix))
    verb, *rest = command
    proc = reproflow(verb, str(suite), *rest, timeout=120)
    _count("listed inputs", "tracebacks" if "Traceback" in proc.stderr else "")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and words in errors[0], proc.stderr[-2000:]


@COUNTED
def test_damaged_files_of_a_results_folder_and_the_catalog_are_set_aside(tmp_path):
    """A point file that is not UTF-8 is quarantined with the reason; a damaged index is built again; a
    generated suite's name leading out is refused before anything is written; a deep JSON config is
    refused naming the file."""
    results = tmp_path / "results"
    good = reproflow("run", str(_tiny(tmp_path)), "--results", str(results))
    assert good.returncode == 0, good.stderr
    (point,) = (results / "tiny").rglob("collective=all_reduce-*.csv")
    point.write_bytes(point.read_bytes().replace(b"all_reduce", b"all_r\xff\xfeuce", 1))
    report = reproflow("report", "--results", str(results), "--out", str(tmp_path / "out"))
    _count("results folders", "tracebacks" if "Traceback" in report.stderr else "")
    assert report.returncode == 0 and "(not UTF-8 text (byte" in report.stderr, report.stderr[-2000:]
    assert (results / "quarantine" / point.relative_to(results)).is_file()

    from reproflow.reporting import catalog

    index = catalog.index_path()
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_bytes(b"not a database, a file some crash left here" * 100)
    runs = reproflow("runs", "--results", str(results))
    _count("results folders", "tracebacks" if "Traceback" in runs.stderr else "")
    assert runs.returncode == 0 and "is damaged (file is not a database); removed, and built again" in runs.stderr
    assert "1 run(s) listed" in runs.stdout and index.name == f"index-v{catalog.INDEX_VERSION}.sqlite"

    mesh = reproflow("cfp", "all", "--model", "gpt", "--mesh", "../../x", "--results", str(tmp_path / "cfp" / "r"))
    _count("results folders", "tracebacks" if "Traceback" in mesh.stderr else "")
    assert mesh.returncode == 2 and "cannot name a file" in mesh.stderr and not (tmp_path / "cfp").exists()

    deep = tmp_path / "config.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    _count("Aceso configs")
    with pytest.raises(ParamError, match="nested deeper than 32"):
        read_config(deep)


def _tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(launch="", iters="2", matrix="").replace('["all_reduce"]', '["all_reduce", "reduce"]'))
    return path


def test_ranks_beyond_the_gpus_share_them_only_without_nccl():
    from reproflow.rank.context import gpu_of

    assert [gpu_of(r, 2, "nccl") for r in (0, 1)] == [0, 1]
    assert [gpu_of(r, 1, "gloo") for r in (0, 1, 2)] == [0, 0, 0]
    with pytest.raises(ReproflowError, match=r"no GPU of its own.*launch.backend = 'gloo'"):
        gpu_of(1, 1, "nccl")


# ---- results folders, run manifests and archives fed to report, status, runs and compare -------------------

@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A real results folder: two points of a 1-rank suite, its environment record and run manifest."""
    where = tmp_path_factory.mktemp("measured")
    proc = reproflow("run", str(_tiny(where)), "--results", str(where / "results"))
    assert proc.returncode == 0, proc.stderr
    return where / "results"


junk = st.one_of(st.binary(max_size=300), hostile.map(str.encode), extreme.map(str.encode),
                 st.sampled_from([b"\xff\xfe\x00", b'{"environment": {"A": 1}', b"[]", b"null", b'"x"', b"{}",
                                  b"schema_version,suite\n", b"[" * 5000, b"9" * 5000, b"nan", b'{"run_id": NaN}']))


@st.composite
def damaged_folder(draw) -> list[tuple[str, bytes, str]]:
    """Changes to a results folder: (glob of the file, new bytes or a change, how): replaced, cut, appended,
    a line changed, or a file added where reproflow looks (point CSV, failure record, job record, manifest)."""
    changes = []
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["tiny/c/*.csv", "tiny/env/*.json", "runs/*.json", "tiny/c/new.csv",
                                       "tiny/c/x.failed.json", "tiny/jobs.jsonl", "runs/new.json",
                                       "tiny/events.jsonl"]))
        how = draw(st.sampled_from(["replace", "cut", "append", "line"]))
        changes.append((target, draw(junk), how))
    return changes


def _damage(folder: Path, changes: list[tuple[str, bytes, str]]) -> None:
    for target, data, how in changes:
        found = sorted(folder.glob(target)) or [folder / target]
        path = found[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.read_bytes() if path.is_file() else b""
        if how == "replace" or not old:
            path.write_bytes(data)
        elif how == "cut":
            path.write_bytes(old[: len(data) % max(len(old), 1)])
        elif how == "append":
            path.write_bytes(old + data)
        else:  # one line of the file replaced: a row, a field of a record
            lines = old.split(b"\n")
            lines[len(data) % len(lines)] = data
            path.write_bytes(b"\n".join(lines))


@COUNTED
@settings(SETTINGS, max_examples=120)
@given(changes=damaged_folder(), command=st.sampled_from(["report", "status", "runs", "compare"]))
def test_generated_results_folders_give_a_report_or_one_clear_error(changes, command, measured, tmp_path):
    import shutil

    folder = Path(tempfile.mkdtemp(dir=tmp_path)) / "results"
    shutil.copytree(measured, folder)
    _damage(folder, changes)
    argv = {"report": ["report", "--results", str(folder), "--out", str(folder.parent / "out")],
            "status": ["status", "--results", str(folder)],
            "runs": ["runs", "--results", str(folder)],
            "compare": ["compare", str(measured), str(folder), "--out", str(folder.parent / "cmp")]}[command]
    err = io.StringIO()
    with no_traceback("results folders"), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code in (0, 1, 2), (argv, err.getvalue())


SECRET = b"secret-7f3a9c: a file outside the results folder"
# What a shared results folder may hold besides what reproflow wrote: (where, what it is).
PLANTED = {"fifo": ("tiny/c/fifo.csv", "fifo"), "zero": ("tiny/c/zero.csv", "/dev/zero"),
           "huge": ("tiny/c/huge.csv", "huge"), "secret-file": ("tiny/c/shadow.csv", "secret"),
           "secret-record": ("tiny/env/x.json", "secret"), "linked-folder": ("tiny/linked", "outside"),
           "runs-link": ("runs", "outside"), "quarantine-link": ("quarantine", "outside"),
           "not-results": ("", "outside"), "names-not-text": ("tiny/odd", "odd names")}
READERS = {"runs": lambda r, o: ["runs", "--results", str(r)], "status": lambda r, o: ["status", "--results", str(r)],
           "report": lambda r, o: ["report", "--results", str(r), "--out", str(o / "out")],
           "compare": lambda r, o: ["compare", str(r), str(r), "--out", str(o / "cmp")],
           "archive": lambda r, o: ["archive", "--results", str(r), "--reports", str(o / "none"), "--logs",
                                    str(o / "none"), "--out", str(o / "a.tar.gz")],
           "rerun": lambda r, o: ["run", str(_tiny(o)), "--results", str(r), "--force"]}


def _plant(folder: Path, outside: Path, kind: str) -> None:
    """Put one PLANTED thing into a copy of a results folder; `outside` holds the secret it may lead to."""
    import shutil

    where, what = PLANTED[kind]
    path = folder / where
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "fifo":
        os.mkfifo(path)
    elif what == "huge":  # past the size a reader takes (sparse: no disk used)
        with open(path, "wb") as file:
            file.truncate(256 * 2**20 + 1)
    elif what == "secret":
        path.symlink_to(outside / "shadow")
    elif what == "outside":
        path.symlink_to(outside, target_is_directory=True)
    elif what == "odd names":  # a folder and point files whose names are not one line of UTF-8 text
        point = next(folder.glob("tiny/c/collective=*.csv"))  # a point file the run wrote, not one planted
        for raw in (b"tiny/c/\xff\xfe.csv", b"tiny/c/a\nb.csv", b"tiny/\xff/x.csv", b"tiny/c\n/x.csv"):
            target = os.path.join(os.fsencode(folder), raw)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(point, target)
    else:
        path.symlink_to(what)


def _read_safely(kinds: list[str], changes: list, command: str, measured: Path, where: Path) -> None:
    """Run `command` on a copy of `measured` with `changes` (damaged_folder) made and `kinds` planted; count it,
    with each thing it must not do: a traceback, a hang, a write through a link out of the folder, the
    secret outside it printed or written anywhere (an archive's members included)."""
    import hashlib
    import shutil
    import stat
    import tarfile

    outside = where / "outside"
    (outside / "t" / "c").mkdir(parents=True)
    (outside / "shadow").write_bytes(SECRET)
    (outside / "t" / "c" / "s.csv").write_bytes(SECRET)
    before = sorted((p, p.read_bytes()) for p in outside.rglob("*") if p.is_file())
    folder = where / "results"
    shutil.copytree(measured, folder)
    _damage(folder, changes)  # before the planting: the damage is written through no link and no FIFO
    for kind in kinds:
        _plant(folder, outside, kind)
    try:
        proc = reproflow(*READERS[command](folder, where), timeout=120)
    except subprocess.TimeoutExpired:
        _count("planted files", "hangs")
        raise AssertionError(f"{command} hung on {kinds}") from None
    written = [p for p in where.rglob("*") if outside not in p.parents and p.is_file() and not p.is_symlink()
               and stat.S_ISREG(p.lstat().st_mode) and p.stat().st_size <= 2**28]  # not the huge one
    digest = hashlib.sha256(SECRET).hexdigest().encode()
    leaked = SECRET.decode() in proc.stdout + proc.stderr
    for p in written:
        data = p.read_bytes()
        if p.suffix == ".gz":
            with tarfile.open(p) as tar:
                data = b"".join(tar.extractfile(m).read() for m in tar if m.isfile())
        leaked = leaked or SECRET in data or digest in data
    through = sorted((p, p.read_bytes()) for p in outside.rglob("*") if p.is_file()) != before
    traceback = "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2, 3)
    _count("planted files", "tracebacks" * traceback, "writes outside" * through, "leaks" * leaked)
    assert not traceback, (kinds, command, proc.returncode, proc.stderr[-2000:])
    assert not through, f"{command} wrote through a link out of the folder ({kinds})"
    assert not leaked, f"{command} printed or wrote the secret from outside the folder ({kinds})"
    if kinds == ["not-results"] and command == "archive":
        assert proc.returncode == 2 and "is not a results folder" in proc.stderr, proc.stderr


@COUNTED
@pytest.mark.parametrize("command", list(READERS))
@pytest.mark.parametrize("kind", list(PLANTED))
def test_a_results_folder_with_links_fifos_and_devices_is_read_safely(kind, command, measured, tmp_path):
    """Each planted thing alone, for every command that reads a results folder: a FIFO, a link to /dev/zero
    or a file past the size cap named like a point file, links to a secret file or folder, runs/ or
    quarantine/ planted as links, a results folder that leads elsewhere, names that are not text: every
    command ends (no hang, no traceback), reads and packs nothing outside the folder, and writes nothing
    through a link."""
    _read_safely([kind], [], command, measured, tmp_path)


@COUNTED
@settings(SETTINGS, max_examples=24)
@given(kinds=st.lists(st.sampled_from([k for k in PLANTED if k != "not-results"]), min_size=1, max_size=4,
                      unique=True),
       changes=st.one_of(st.just([]), damaged_folder()), command=st.sampled_from(list(READERS)))
def test_generated_hostile_results_folders_are_read_safely(kinds, changes, command, measured, tmp_path):
    """Generated: several planted things at once, in a folder whose rows, records or manifests may also be
    torn or hostile; the same checks."""
    _read_safely(kinds, changes, command, measured, Path(tempfile.mkdtemp(dir=tmp_path)))


@COUNTED
@pytest.mark.parametrize("field", ["cluster", "suites", "command", "executor"])
def test_control_characters_in_records_reach_the_terminal_escaped(field, measured, tmp_path):
    """A manifest whose fields clear the screen, set the window title or fake a line: `runs` prints them as
    escapes, never as the characters a terminal acts on."""
    import json
    import shutil

    folder = tmp_path / "results"
    shutil.copytree(measured, folder)
    manifest = next((folder / "runs").glob("*.json"))
    record = json.loads(manifest.read_text())
    payload = "\x1b[2J\x1b]0;owned\x07\rfake line\x9b"
    record[field] = [payload] if isinstance(record.get(field), list) else payload
    manifest.write_text(json.dumps(record))
    out = io.StringIO()
    with no_traceback("terminal output"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["runs", "--results", str(folder)])
    assert code == 0
    text = out.getvalue()
    assert not any(c in text for c in "\x1b\x07\r\x9b"), text
    if field == "cluster":  # printed on the run's line
        assert "\\x1b[2J" in text, text


ROW_VALUES = st.one_of(st.sampled_from(["../../../outside", "/etc/passwd", "two", "9" * 400, "", "nan", "-1", "0",
                                         "a/b", "..", ".hidden", "x" * 300, "all_reduce", "unknown"]), hostile)


@COUNTED
@settings(SETTINGS, max_examples=80)
@given(column=st.sampled_from(["suite", "experiment", "family", "world_size", "repeat", "collective", "metric",
                               "unit", "point", "rank", "begin_size", "job_id"]), value=ROW_VALUES,
       command=st.sampled_from(["report", "claims", "compare", "runs"]))
def test_row_values_never_name_a_file_outside_the_output_or_end_in_a_traceback(column, value, command, measured,
                                                                                 tmp_path):
    """A value of any column (names, counts, parameters) in every row of a point file: the commands that
    build file names, figures and numbers from rows write only inside --out, or leave the file out."""
    import csv
    import shutil

    where = Path(tempfile.mkdtemp(dir=tmp_path))
    folder = where / "in" / "results"
    shutil.copytree(measured, folder)
    files = list(folder.glob("tiny/c/*.csv"))
    assert files
    for path in files:
        rows = list(csv.DictReader(path.open()))
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows([{**r, column: value} if column in r else r for r in rows])
    before = {p for p in where.rglob("*")}
    out = where / "in" / "out"
    argv = {"report": ["report", "--results", str(folder), "--out", str(out)],
            "claims": ["report", "--results", str(folder), "--out", str(out), "--claims-only"],
            "compare": ["compare", str(measured), str(folder), "--out", str(out)],
            "runs": ["runs", "--results", str(folder)]}[command]
    err = io.StringIO()
    with no_traceback("row values"), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code in (0, 1, 2), (argv, err.getvalue())
    made = {p for p in where.rglob("*")} - before
    outside = [p for p in made if out not in p.parents and p != out and folder not in p.parents]
    assert not outside, outside


def _archive(where: Path, measured: Path, kind: str) -> Path:
    """An archive to compare: one `reproflow archive` wrote, changed in one way a hostile or broken file could be."""
    import tarfile

    path = where / kind / "share.tar.gz"
    path.parent.mkdir()
    if kind in ("junk", "cut", "not-led", "lists-a-million"):
        good = archive_of(measured, where / "good" / "share.tar.gz") if kind != "not-led" else None
        if kind == "not-led":  # a results folder packed by hand: no MANIFEST.json first
            with tarfile.open(path, "w:gz") as tar:
                tar.add(measured, arcname="share/results")
        elif kind == "lists-a-million":  # a manifest that promises a bomb
            listed = {f"r/{n}": {"bytes": 1, "sha256": "0" * 64} for n in range(1_000_000)}
            data = json.dumps({"files": listed}).encode()
            member = tarfile.TarInfo("share/MANIFEST.json")
            member.size = len(data)
            with tarfile.open(path, "w:gz", compresslevel=1) as tar:
                tar.addfile(member, io.BytesIO(data))
        else:
            path.write_bytes(b"\x1f\x8b junk" if kind == "junk" else good.read_bytes()[: good.stat().st_size // 2])
        return path
    if kind == "changed":
        with tarfile.open(archive_of(measured, where / "good" / "share.tar.gz")) as tar:
            point = next(m for m in tar if m.name.endswith(".csv"))
        member, data = tarfile.TarInfo(point.name), b"9" * point.size
        member.size = point.size
        return archive_of(measured, path, member, data)
    member = tarfile.TarInfo({"absolute": "/tmp/reproflow-planted.csv", "leading-out": "../../planted.csv",
                              "link": "share/results/t/c/link.csv", "device": "share/results/t/dev",
                              "fifo": "share/results/t/fifo", "hardlink": "share/results/t/hard.csv",
                              "added": "share/results/tiny/c/added.csv"}[kind])
    member.type = {"link": tarfile.SYMTYPE, "device": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE,
                   "hardlink": tarfile.LNKTYPE}.get(kind, tarfile.REGTYPE)
    member.linkname = "/etc/passwd" if kind in ("link", "hardlink") else ""
    return archive_of(measured, path, member)


ARCHIVES = ["absolute", "leading-out", "link", "device", "fifo", "hardlink", "added", "changed", "junk", "cut",
            "not-led", "lists-a-million"]


@COUNTED
@pytest.mark.parametrize("kind", ARCHIVES)
def test_hostile_archives_are_refused_naming_the_member(kind, measured, tmp_path):
    err = io.StringIO()
    with no_traceback("archives"), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["compare", str(measured), str(_archive(tmp_path, measured, kind)), "--out",
                         str(tmp_path / "cmp")])
    assert code == 2 and any(words in err.getvalue() for words in (
        "not a file its MANIFEST.json lists", "not a readable .tar.gz archive", "its SHA-256 differs",
        "so it is not an archive `reproflow archive` wrote", "lists more than 999,999 files")), err.getvalue()
    assert not Path("/tmp/reproflow-planted.csv").exists() and not (tmp_path.parent / "planted.csv").exists()


# ---- the job script's container branches (Pyxis, OCI, Apptainer) with hostile images and mounts --------------

CONTAINER_STUBS = r"""srun() {
    if [ "$1" = --help ]; then echo "--container-image"; return 0; fi
    printf '%s\0' "$@" >> "$ARGV_OUT"; printf 'END\0' >> "$ARGV_OUT"
    case " $* " in *" bash -c "*) echo "node1 4.1.2" ;; esac
}
scontrol() { echo node1; }
unsquashfs() { local d=""; while [ $# -gt 0 ]; do [ "$1" = -d ] && d=$2; shift; done; mkdir -p "$d/etc"; }
"""
file_name = hostile.filter(lambda s: s not in ("", ".", "..") and "/" not in s and "\0" not in s
                           and len(s.encode("utf-8", "surrogateescape")) < 120)


@COUNTED
@settings(SETTINGS, max_examples=90)
@given(runtime=st.sampled_from(["pyxis", "oci", "apptainer"]), name=file_name,
       mounts=hostile.filter(lambda s: "\0" not in s))
def test_container_branches_pass_hostile_images_and_mounts_as_data(runtime, name, mounts, tmp_path):
    """The rendered script run in bash with a squash file whose name carries a payload and hostile
    CONTAINER_MOUNTS: nothing runs that the values spell, and the image reaches srun or apptainer byte
    for byte."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        image = folder / (name + ".sqsh")
        image.write_bytes(b"hsqs" + bytes(36) + (64).to_bytes(8, "little") + bytes(16))  # magic, bytes_used
    except (OSError, UnicodeEncodeError):
        _count("container branches")
        return
    (folder / "oci.conf").write_text("")
    (folder / "stubs.sh").write_text(CONTAINER_STUBS + 'apptainer() { printf "%s\\0" apptainer "$@" >> '
                                                       '"$ARGV_OUT"; printf "END\\0" >> "$ARGV_OUT"; }\n')
    script = folder / "job.sbatch"
    script.write_text(render_sbatch(load_suite(_tiny(folder)), ROOT))
    env = {"PATH": "/usr/bin:/bin", "BASH_ENV": str(folder / "stubs.sh"), "ARGV_OUT": str(folder / "argv"),
           "HOME": str(folder), "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1",
           "SLURM_SUBMIT_DIR": str(folder), "SLURM_CONF": str(folder / "slurm.conf"), "IMAGE": str(image),
           "CONTAINER_RUNTIME": runtime, "CONTAINER_MOUNTS": mounts, "REPROFLOW_CHECKOUT": str(ROOT)}
    subprocess.run(["bash", str(script)], env={k: v.encode("utf-8", "surrogateescape") for k, v in env.items()},
                   capture_output=True, timeout=60)
    injected = _injected()
    _count("container branches", "injections" if injected else "")
    assert not injected, (runtime, name, mounts)
    recorded = (folder / "argv").read_bytes().decode("utf-8", "surrogateescape").split("\0") \
        if (folder / "argv").exists() else []
    image_text, mounts = str(image), mounts or f"{folder}:{folder}"  # empty: the script's default
    if runtime == "pyxis":
        given = [recorded[i + 1] for i, a in enumerate(recorded[:-1]) if a == "--container-image"]
        assert given and set(given) == {image_text}, recorded[:20]
        assert {recorded[i + 1] for i, a in enumerate(recorded[:-1]) if a == "--container-mounts"} == {mounts}
    elif runtime == "apptainer":
        assert image_text in recorded and recorded[recorded.index("--bind") + 1] == mounts, recorded[:20]
    else:
        bundle = image_text.removesuffix(".sqsh") + ".oci/job-7"
        assert f"--container={bundle}" in recorded, recorded[:20]


@COUNTED
def test_at_least_a_thousand_bad_inputs_and_none_did_what_it_must_not():
    """Runs after the tests of this module that count (pytest keeps file order): no traceback, injection,
    hang, write outside or leak."""
    if BAD_INPUTS["inputs"] == 0:
        pytest.skip("the property tests above did not run (selected alone)")
    assert BAD_INPUTS["inputs"] >= 1000, BAD_INPUTS
    assert all(BAD_INPUTS[outcome] == 0 for outcome in OUTCOMES), BAD_INPUTS
