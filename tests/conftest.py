"""Shared helpers: the checkout root, a tiny-suite writer, and the reproflow command."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reproflow.store.results import point_file_problem

ROOT = Path(__file__).resolve().parents[1]


def one_case_claim(measured: float | None, interval: tuple[float, float] | None = None, *, statement: str = "s",
                   target: str = "", at_least: float | None = 1.0, at_most: float | None = None,
                   detail: str = "") -> Any:
    """A judged claim of one case with the given ratio and interval (its verdict by the judge's rule), for
    tests of what reads claims: the page, the picture, the plan for more samples."""
    from reproflow.reporting.claims import Case, Claim, ClaimSpec, Design, verdict

    spec = ClaimSpec(family="f", statement=statement, ratio="r", paper="", system="a", baselines="b",
                     design=Design.INDEPENDENT, at_least=at_least, at_most=at_most, target=target)
    if measured is None:
        return Claim(spec, detail=detail)
    case = Case("c", verdict(spec, measured, interval, interval), measured, interval, interval)
    return Claim(spec, (case,), detail=detail, comparisons=1)


@pytest.fixture(autouse=True)
def own_catalog(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's runs go to a catalog of its own, never the user's, and no test inherits an open run."""
    home = tmp_path_factory.mktemp("catalog")
    monkeypatch.setenv("REPROFLOW_CATALOG", str(home))
    monkeypatch.delenv("REPROFLOW_RUN_ID", raising=False)
    return home


@pytest.fixture
def write_suite(tmp_path: Path):
    """Write a suite file into tmp_path and return its path."""

    def write(text: str, name: str = "tiny") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


def reproflow(*args: str, cwd: Path = ROOT, env: dict | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the reproflow CLI as a user would, capturing output."""
    full_env = dict(os.environ) | (env or {})
    return subprocess.run([sys.executable, "-m", "reproflow.app.cli", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def mpi_start_failed(log: str) -> bool:
    """A job log showing the test cluster's MPI start-up failing, before any point is measured: MPICH's
    pmi2 client over Slurm's pmi2 plugin now and then sends a garbled request ("mpi/pmi2: invalid client
    request"; about 1 start in 8) or hangs in MPI_Init, where a rank's watchdog ("Timeout (...)!") shows it
    still taking its rank from MPI (`adopt_mpi_environment`). Tests submit such a job once more."""
    return "mpi/pmi2: invalid client request" in log or ("Timeout (" in log and " in adopt_mpi_environment" in log)


# The fault-injection tally: every injected fault and every generated bad input is recorded here by
# the test that made it, whatever its outcome, and summed up at the end of the run.
FAULTS: list[dict] = []
# What a bad input may do that it must not: end in a traceback, run injected text, hang, write outside the
# folders given, or leak a file from outside them; each counted on its own line of the summary.
OUTCOMES = ("tracebacks", "injections", "hangs", "writes outside", "leaks")
BAD_INPUTS: dict[str, int] = {"inputs": 0, "failed": 0} | dict.fromkeys(OUTCOMES, 0)


# A suite of one 1-rank all_reduce point over 1-4 KiB (`% iters`): the smallest real run.
ONE_COLLECTIVE = """
[launch]
backend = "gloo"
device = "cpu"
[[experiment]]
name = "c"
family = "param_comms"
launch = { procs_per_node = 1 }
params = { begin_size = "1K", end_size = "4K", warmup_iters = 1, iters = %d }
matrix = { collective = ["all_reduce"] }
"""


def archive_of(results: Path, out: Path, extra: tarfile.TarInfo | None = None, data: bytes = b"") -> Path:
    """`out`, an archive `reproflow archive` writes of `results`, with `extra` added after its own members
    (with `data` as its bytes), or, when `extra` names a member it already has, that member's bytes replaced."""
    from reproflow.store.archive import write_archive

    write_archive(out, out.parent / "no-project", results, out.parent / "no-reports", out.parent / "no-logs")
    if extra is None:
        return out
    with tarfile.open(out) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]
    changed = [(extra, data) if m.name == extra.name else (m, d) for m, d in members]
    with tarfile.open(out, "w:gz") as tar:
        for member, body in changed + ([(extra, data)] if changed == members else []):
            tar.addfile(member, io.BytesIO(body) if member.isfile() else None)
    return out


def record_fault(name: str, survived: bool, rows_lost: int, hung: bool, seconds: float) -> None:
    """Note one injected fault: whether the system behaved as promised, rows lost, and whether it hung."""
    FAULTS.append({"fault": name, "survived": survived, "rows_lost": rows_lost, "hung": hung, "seconds": seconds})


WRITTEN = re.compile(r"(\d+) rows in [\d.]+ s -> (\S+\.csv)")


def rows_lost(log: str) -> int:
    """Rows the job said it wrote that are not on disk in a whole file."""
    lost = 0
    for count, name in WRITTEN.findall(log):
        path = Path(name)
        if not path.exists() or point_file_problem(path):
            lost += int(count)
        else:
            lost += max(0, int(count) - (len(path.read_text().splitlines()) - 1))
    return lost



def pytest_itemcollected(item: pytest.Item) -> None:
    """`make test` runs two pytest-xdist workers: the tests that share the Slurm cluster go to one of them,
    one after another (set while collecting: xdist reads the groups before later hooks run)."""
    if item.get_closest_marker("slurm"):
        item.add_marker(pytest.mark.xdist_group("slurm"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Slurm tests first: much of their time is waiting for the cluster, which the other worker fills
    with the rest. (Tests that compare measured times, marked `timing`, run after, alone.)"""
    items.sort(key=lambda item: not item.get_closest_marker("slurm"))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple[:2] >= (9, 2):
        raise pytest.UsageError(f"pytest {pytest.__version__}: pytest-xdist's --dist loadgroup does not group tests "
                                "here (pytest-xdist issue 1386), so the Slurm tests would share the cluster at once. "
                                "Install the versions of constraints.txt (make venv).")


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker: its tally goes to the controller, which prints the summary
        output["faults"], output["bad_inputs"] = FAULTS, BAD_INPUTS


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    FAULTS.extend(node.workeroutput.get("faults", []))
    for kind, count in node.workeroutput.get("bad_inputs", {}).items():
        BAD_INPUTS[kind] = BAD_INPUTS.get(kind, 0) + count


def pytest_terminal_summary(terminalreporter) -> None:
    if not FAULTS and not BAD_INPUTS["inputs"]:
        return
    tr = terminalreporter
    tr.section("fault injection")
    for f in FAULTS:
        tr.write_line(f"{f['fault']}: {'survived' if f['survived'] else 'NOT SURVIVED'}, {f['rows_lost']} rows lost, "
                      f"{'HUNG' if f['hung'] else 'no hang'}, {f['seconds']:.1f} s")
    if BAD_INPUTS["inputs"]:
        kinds = ", ".join(f"{k.removeprefix('kind:')} {n}" for k, n in sorted(BAD_INPUTS.items())
                          if k.startswith("kind:"))
        outcomes = ", ".join(f"{BAD_INPUTS[o]} {o}" for o in OUTCOMES)
        tr.write_line(f"bad inputs: {BAD_INPUTS['inputs']} generated ({kinds}), {outcomes}")
    injected = len(FAULTS) + BAD_INPUTS["inputs"]
    survived = sum(f["survived"] for f in FAULTS) + BAD_INPUTS["inputs"] - BAD_INPUTS["failed"]
    tr.write_line(f"{injected} faults injected, {survived} survived, {sum(f['rows_lost'] for f in FAULTS)} rows lost, "
                  f"{sum(f['hung'] for f in FAULTS)} hangs")


def find_chromium() -> str | None:
    """Debian's Chromium binary (the wrapper script's target first), or None."""
    for candidate in ("/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@contextlib.contextmanager
def chromium_tab() -> Iterator[tuple[Any, list[str]]]:
    """A tab of a real headless Chromium (Debian's, driven by Playwright), 1280 x 900, and the list its
    console errors, page errors and failed loads go to; skips where Chromium or its driver is missing."""
    binary = find_chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (make test installs Debian's chromium with tests/packages.sh)")
    import playwright
    from playwright.sync_api import sync_playwright

    driver = subprocess.run([str(Path(playwright.__file__).parent / "driver" / "node"), "--version"],
                            capture_output=True, text=True)
    if driver.returncode != 0:
        pytest.skip(f"Playwright's driver does not start here ({driver.stderr.strip()}); make test installs "
                    "the libatomic1 it needs with tests/packages.sh")
    errors: list[str] = []
    with sync_playwright() as session:
        browser = session.chromium.launch(executable_path=binary, args=["--no-sandbox", "--disable-dev-shm-usage"])
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on("requestfailed", lambda request: errors.append(f"failed to load {request.url}"))
        try:
            yield tab, errors
        finally:
            browser.close()
