"""Fault injection: a rank killed mid-collective (here and under Slurm), a rank that hangs, a node set
down during a 2-node job, a job past its time limit, 20 jobs writing one results folder at once, and a
Pyxis job whose image cannot start (a registry name, a missing, cut-short or corrupt squash file, Enroot
missing on a node, a mount whose host folder is missing).

Each test injects its fault, then checks the promises: the job ends within its bound (no hang),
the failure is classified and named (rank and host), every row a job reported written is on disk
and whole (no row lost), and a rerun or retry measures what is missing. Each records its outcome
for the summary line printed at the end of the run ("N faults injected, N survived, 0 rows lost,
0 hangs"); the generated bad inputs of test_inputs.py count in it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, record_fault, reproflow, rows_lost
from slurmtools import (  # noqa: F401 - cluster: the Slurm tests' fixture
    IMAGE,
    NEEDS_IMAGE,
    NEEDS_PYXIS,
    SMOKE,
    cluster,
    folder_hidden_on,
    sbatch,
    submitted_ids,
    wait,
)

from reproflow.app.reproduce.steps import run_step
from reproflow.launch.render import render_sbatch
from reproflow.launch.retry import CANCELLED, INFRASTRUCTURE, TIME_LIMIT, classify, job_log
from reproflow.spec.suite import load_suite
from reproflow.store.results import point_file_problem

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
SLURM = pytest.mark.usefixtures("cluster")

POINTS = """
[launch]
backend = "gloo"
device = "cpu"
timeout_s = {timeout}
time_limit = "{limit}"
exclusive = false
[[experiment]]
name = "c"
family = "param_comms"
launch = {{ nodes = {nodes}, procs_per_node = {procs} }}
params = {{ begin_size = "64K", end_size = "64K", warmup_iters = 1, iters = {iters} }}
matrix = {{ collective = ["broadcast", "all_reduce", "reduce"] }}
"""


def suite_file(tmp_path: Path, *, nodes: int = 1, procs: int = 2, iters: int = 3000, timeout: int = 30,
               limit: str = "00:05:00", name: str = "faults") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(POINTS.format(nodes=nodes, procs=procs, iters=iters, timeout=timeout, limit=limit))
    return path


def rendered(suite: Path) -> Path:
    """The suite's sbatch script, rendered beside it."""
    script = suite.with_suffix(".sbatch")
    script.write_text(render_sbatch(load_suite(suite), ROOT))
    return script


def sbatch_with_fault(suite: Path, fault: str, nodes: int, limit_s: float) -> tuple[str, str, str, float]:
    """Render `suite`'s script beside it, submit it with REPROFLOW_INJECT_FAULT=`fault` (results in
    <folder>/results), wait; (job id, final state, job log, seconds until final)."""
    script = rendered(suite)
    env = f"NONE,IMAGE=,RESULTS={suite.parent / 'results'},REPROFLOW_INJECT_FAULT={fault}"
    start = time.monotonic()
    # -D: the job's working directory, where the script's --output=%x_%j.out goes (and `reproflow status` looks).
    job = sbatch("-N", str(nodes), f"--export={env}", "-D", str(suite.parent), str(script))
    state = wait(job, timeout=limit_s)[job]["state"]
    return job, state, (suite.parent / f"reproflow-{suite.stem}_{job}.out").read_text(), time.monotonic() - start


def points(results: Path, suite: str = "faults") -> dict[str, Path]:
    return {p.name.split("-w")[0]: p for p in (results / suite / "c").glob("*.csv")}


def test_local_rank_killed_mid_collective(tmp_path):
    suite, results = suite_file(tmp_path), tmp_path / "results"
    start = time.monotonic()
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "collective=all_reduce:kill:1"})
    seconds = time.monotonic() - start
    named = re.search(r"rank 1 on \S+ \(pid \d+\) failed, with signal 9 \(SIGKILL\)", proc.stderr)
    lost = rows_lost(proc.stdout)
    again = reproflow("run", str(suite), "--results", str(results))
    survived = bool(named) and proc.returncode == 128 + 9 and set(points(results)) == {
        "collective=broadcast", "collective=all_reduce", "collective=reduce"} and "2 to run, 1 already done" in \
        again.stdout
    # A hang is what outlasts every bound; starting the ranks of a loaded machine is not one.
    record_fault("local: rank killed mid-collective", survived, lost, seconds > 180, seconds)
    assert named, proc.stderr
    assert survived and lost == 0 and seconds < 180, (proc.returncode, again.stdout)


def test_a_reproduce_step_past_its_limit_is_stopped_with_its_ranks(tmp_path, monkeypatch):
    """A step run past its limit (a rank hung, the collective timeout 10 minutes off) is stopped in about
    the limit with every rank it started; the point it finished before is kept."""
    suite, results, log = suite_file(tmp_path, timeout=600, iters=300), tmp_path / "results", tmp_path / "step.log"
    monkeypatch.setenv("REPROFLOW_INJECT_FAULT", "collective=all_reduce:hang:1")
    start = time.monotonic()
    code, _, _ = run_step(["run", str(suite), "--results", str(results)], log, None, limit_s=20)
    seconds = time.monotonic() - start
    left = subprocess.run(["pgrep", "-f", str(suite)], capture_output=True, text=True).stdout.split()
    assert code == 124 and 20 <= seconds < 120 and not left, (code, seconds, left)
    assert "collective=broadcast" in points(results) and "stopped at its limit of 0.3 min" in log.read_text()


def test_local_rank_hung_fails_the_point_within_the_timeout(tmp_path):
    suite, results = suite_file(tmp_path, timeout=10), tmp_path / "results"
    start = time.monotonic()
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "collective=all_reduce:hang:1"})
    seconds = time.monotonic() - start
    failed = re.search(r"rank 0 on \S+: \[2/3\] collective=all_reduce failed after (\d+\.\d) s", proc.stderr)
    survived = proc.returncode == 1 and "rank(s) [1] were still running (waiting, or hung)" in proc.stderr and \
        failed is not None and 10.0 <= float(failed.group(1)) < 60.0
    lost = rows_lost(proc.stdout)
    record_fault("local: rank hung in a collective (10 s timeout)", survived, lost, seconds > 180, seconds)
    assert survived and lost == 0 and seconds < 180, proc.stderr
    assert set(points(results)) == {"collective=broadcast"}


# Two experiments: one measured first, then one whose ranks start under `launcher` within `startup` s.
STARTS = """
[launch]
backend = "gloo"
device = "cpu"
time_limit = "00:20:00"
exclusive = false
[[experiment]]
name = "before"
family = "param_comms"
launch = {{ procs_per_node = 2 }}
params = {{ begin_size = "64K", end_size = "64K", warmup_iters = 1, iters = 20, collective = "all_reduce" }}
[[experiment]]
name = "stuck"
family = "param_comms"
launch = {{ procs_per_node = 3, launcher = "{launcher}", startup_s = {startup} }}
params = {{ begin_size = "64K", end_size = "64K", warmup_iters = 1, iters = 20, collective = "all_reduce" }}
"""


def marked_processes(mark: str) -> list[str]:
    """The processes whose environment carries TEST_MARK=`mark` (a run's, and all that it started)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if f"TEST_MARK={mark}".encode() in environ.read_bytes().split(b"\0"):
                found.append(f"{environ.parent.name}: {(environ.parent / 'cmdline').read_bytes()[:120]!r}")
    return found


def left_behind(mark: str, wait_s: float = 30.0) -> list[str]:
    """The marked processes still there after up to `wait_s` (a killed rank takes a moment to go)."""
    deadline = time.monotonic() + wait_s
    while (found := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def test_mpi_ranks_stuck_at_start_are_stopped_at_the_startup_limit(tmp_path):
    """A rank that never reaches its first point (here: stopped before it joins the process group) holds
    its job only until launch.startup_s, not until the time limit: the run names the launcher, how many
    ranks started and what each waited for, leaves no process behind, keeps what it measured before, and
    a rerun measures only the rest."""
    suite, results, mark = tmp_path / "starts.toml", tmp_path / "results", f"startup-{os.getpid()}"
    suite.write_text(STARTS.format(launcher="mpi", startup=20))
    start = time.monotonic()
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "startup of stuck:hang:1", "TEST_MARK": mark})
    seconds = time.monotonic() - start
    left = left_behind(mark)
    said = re.search(r"start-up limit reached: \d of 3 rank\(s\) reached their first point within 20 s "
                     r"\(launch\.startup_s\); mpirun \(\S+\) had started \d rank process\(es\)", proc.stderr)
    waited = re.search(r"rank\(s\) [\d, -]*\b1\b[\d, -]*: (no word from it|past its imports)", proc.stderr)
    again = reproflow("run", str(suite), "--results", str(results), env={"TEST_MARK": mark})
    kept = "1 of 1 points, 0 to run, 1 already done" in again.stdout and again.returncode == 0
    survived = proc.returncode == 125 and bool(said and waited) and not left and kept
    record_fault("local: MPI rank stuck at start (20 s start-up limit)", survived, rows_lost(proc.stdout),
                 seconds > 300, seconds)
    assert proc.returncode == 125 and said and waited, proc.stderr[-3000:]
    assert "its ranks did not start within launch.startup_s = 20 s" in proc.stderr
    assert not left, left
    assert kept, again.stdout[-2000:] + again.stderr[-2000:]


def test_mpi_rank_0_whose_store_cannot_listen_ends_its_job_at_once(tmp_path, capfd):
    """What held 9 ranks for 15 minutes in a clean-room `make test`: MASTER_PORT held on another address (a
    neighbouring MPI job's UCX listener on the host's address), rank 0's store failed to listen (EADDRINUSE)
    and waited in MPI_Finalize for ranks that retried connecting to it, 600 s and again. Now the failed rank
    aborts the MPI job, which ends in seconds, whatever startup_s is."""
    from reproflow.launch.local import find_mpirun, run_ranks, worker_args

    path, results = tmp_path / "starts.toml", tmp_path / "results"
    path.write_text(STARTS.format(launcher="mpi", startup=600))
    suite = load_suite(path)
    cmd = [sys.executable, "-m", "reproflow.worker", *worker_args(suite, suite.experiment("stuck"), results, False,
                                                                  ROOT)]
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        start = time.monotonic()
        code = run_ranks(cmd, 3, tmp_path / "logs", {"MASTER_PORT": str(held.getsockname()[1])}, limit_s=900,
                         mpirun=find_mpirun(), startup_s=600)
        seconds = time.monotonic() - start
    said = capfd.readouterr()
    survived = code not in (0, 124) and "EADDRINUSE" in said.out + said.err and seconds < 180
    record_fault("local: MPI rank 0's store port taken (EADDRINUSE)", survived, 0, seconds > 180, seconds)
    # Where it did not, the ranks' own logs say why (the job's output alone may end at "Traceback").
    logs = "".join(f"\n== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                   for p in sorted((tmp_path / "logs").rglob("*")) if p.is_file())
    assert survived, (code, seconds, said.out[-2000:] + said.err[-3000:] + logs)


@pytest.mark.parametrize(("launcher", "moment", "sig"), [
    ("mpi", "start", signal.SIGKILL), ("mpi", "step", signal.SIGKILL), ("mpi", "step", signal.SIGTERM),
    ("mpi", "start", signal.SIGINT), ("torchrun", "step", signal.SIGKILL)])
def test_a_run_stopped_or_killed_takes_every_process_it_started_with_it(tmp_path, launcher, moment, sig):
    """`reproflow run` stopped (SIGTERM, SIGINT) or killed outright (SIGKILL, as a test's time limit does)
    while its ranks start or in the middle of a point: no launcher, proxy or rank of it is left running."""
    suite, results, mark = tmp_path / "starts.toml", tmp_path / "results", f"kill-{os.getpid()}-{moment}-{sig}"
    suite.write_text(STARTS.format(launcher=launcher, startup=600))
    fault = "startup of stuck:hang:1" if moment == "start" else "default:hang:1"
    env = dict(os.environ) | {"REPROFLOW_INJECT_FAULT": fault, "TEST_MARK": mark}
    # SIGINT as at a terminal: a run started in the background of a script inherits it ignored (and
    # Python then keeps it so), which is that script's wish, not what this test asks.
    run = subprocess.Popen([sys.executable, "-m", "reproflow.app.cli", "run", str(suite), "-e", "stuck",
                            "--results", str(results)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # mid-start: rank 1 has recorded its start and stopped there; mid-step: all three are at their point
        stage = "begun" if moment == "start" else "ready"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run.poll() is None:
            found = [p.read_text().split("\t")[0] for p in results.glob("starts/logs/*/start/rank*")]
            if found.count(stage) >= (1 if moment == "start" else 3):
                break
            time.sleep(0.2)
        assert run.poll() is None, "the run ended before it could be stopped"
        assert len(marked_processes(mark)) >= 4, marked_processes(mark)  # reproflow, launcher and ranks
        time.sleep(1.0)
        run.send_signal(sig)
        code = run.wait(timeout=120)
    finally:
        run.kill()
    left = left_behind(mark)
    assert not left, (code, left)
    assert code == (-9 if sig == signal.SIGKILL else 128 + sig), code


@pytest.mark.slurm
@SLURM
def test_slurm_rank_killed_mid_collective_on_two_nodes(tmp_path):
    results = tmp_path / "results"
    job, state, log, seconds = sbatch_with_fault(suite_file(tmp_path, nodes=2, procs=1), "collective=all_reduce:kill:1",
                                                 2, 120)
    verdict = classify(job, state, log)
    lost = rows_lost(log)
    survived = state == "FAILED" and verdict.category == INFRASTRUCTURE and \
        re.search(r"first: rank 1 on node[12]", verdict.reason) is not None \
        and set(points(results)) == {"collective=broadcast"}
    record_fault("slurm: rank killed mid-collective, 2 nodes", survived, lost, seconds > 100, seconds)
    assert survived and lost == 0, (state, verdict, log[-3000:])
    status = reproflow("status", "--results", str(results)).stdout
    assert re.search(rf"job {job}: FAILED -> infrastructure: .* \(first: rank 1 on node[12]\)", status), status


@pytest.mark.slurm
@SLURM
def test_slurm_node_down_during_a_two_node_job_is_retried_elsewhere_and_tagged(tmp_path):
    """node2 set down after the first point, while the first attempt's ranks wait in the second (held
    there by an injected hang of that attempt only, so the job cannot finish before it is killed, at
    any speed): node2 is blamed from Slurm's event log though it is back within a second
    (ReturnToService=2), and the retry runs the two points left on node1."""
    suite = suite_file(tmp_path, nodes=2, procs=1, timeout=600)
    results = tmp_path / "results"
    start = time.monotonic()
    supervisor = subprocess.Popen([sys.executable, "-m", "reproflow.app.cli", "submit", str(suite), "--results",
                                   str(results), "--retries", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "REPROFLOW_INJECT_FAULT": "collective=all_reduce:hang::1"})
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and not points(results):
            time.sleep(0.2)
        assert points(results), "the first point was never written"
        subprocess.run(["scontrol", "update", "nodename=node2", "state=down", "reason=reproflow-fault-test"],
                       check=True)
        out, _ = supervisor.communicate(timeout=400)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        subprocess.run(["scontrol", "update", "nodename=node2", "state=resume"], capture_output=True)
    seconds = time.monotonic() - start
    jobs = [json.loads(line) for line in (results / "faults" / "jobs.jsonl").read_text().splitlines()]
    first, second = (j["job_id"] for j in jobs)
    rows = pd.concat(pd.read_csv(p, dtype={"job_id": str, "retry_of": str}) for p in points(results).values())
    retried = rows[rows["attempt"] == 2]
    lost = rows_lost(job_log(results / "faults" / "jobs", first))
    checks = {"exit 0": supervisor.returncode == 0,
              "classified": f"job {first}: NODE_FAIL -> infrastructure" in out,
              "blamed": "nodes blamed: node2" in out, "reshaped": "as 1 node(s) x 2" in out,
              "3 points": len(points(results)) == 3, "retried rows": len(retried) > 0,
              "retry_of": set(retried["retry_of"]) == {first}, "retry job": set(retried["job_id"]) == {second},
              "retry node": set(retried["nodelist"]) == {"node1"},
              "first job": set(rows[rows["attempt"] == 1]["job_id"]) == {first}}
    failed = [name for name, ok in checks.items() if not ok]
    print(out)  # the supervisor's lines (pytest -s): the verdict, the nodes blamed and why, the retry
    record_fault("slurm: node set down during a 2-node job, retried on the other node", not failed, lost,
                 seconds > 400, seconds)
    assert not failed and lost == 0, (failed, lost, rows[["attempt", "job_id", "retry_of", "nodelist"]], out)


@pytest.mark.slurm
@SLURM
def test_slurm_job_past_its_time_limit_keeps_its_points(tmp_path):
    results = tmp_path / "results"
    job, state, log, seconds = sbatch_with_fault(suite_file(tmp_path, nodes=1, procs=2, timeout=600, limit="00:01:00"),
                                                 "collective=all_reduce:hang:1", 1, 240)
    verdict = classify(job, state, log)
    lost = rows_lost(log)
    survived = state == "TIMEOUT" and verdict.category == TIME_LIMIT and set(points(results)) == {
        "collective=broadcast"}
    record_fault("slurm: job past its 1-minute time limit (a hung rank)", survived, lost, seconds > 200, seconds)
    assert survived and lost == 0, (state, log[-2000:])


@pytest.mark.slurm
@SLURM
def test_slurm_cancelled_job_keeps_its_points_and_is_not_retried(tmp_path):
    script = rendered(suite_file(tmp_path, nodes=1, procs=2, iters=6000))
    results = tmp_path / "results"
    start = time.monotonic()
    job = sbatch("-N", "1", f"--export=NONE,IMAGE=,RESULTS={results}", "-o", str(tmp_path / "%j.out"), str(script))
    end = time.monotonic() + 120
    while time.monotonic() < end and not points(results):
        time.sleep(0.2)
    subprocess.run(["scancel", job], check=True)
    state = wait(job)[job]["state"]
    seconds = time.monotonic() - start
    log = (tmp_path / f"{job}.out").read_text()
    verdict = classify(job, state, log)
    lost = rows_lost(log)
    again = sbatch("-N", "1", f"--export=NONE,IMAGE=,RESULTS={results}", "-o", str(tmp_path / "%j.out"), str(script))
    resumed = wait(again, timeout=180)[again]["state"]
    survived = state == "CANCELLED" and verdict.category == CANCELLED and resumed == "COMPLETED" and \
        len(points(results)) == 3 and "already done" in (tmp_path / f"{again}.out").read_text()
    record_fault("slurm: job cancelled mid-run, then rerun", survived, lost, seconds > 150, seconds)
    assert survived and lost == 0, (state, verdict)


TWENTY = """
[launch]
backend = "gloo"
device = "cpu"
exclusive = false
time_limit = "00:05:00"
[[experiment]]
name = "c"
family = "param_comms"
params = { collective = "all_reduce", begin_size = "1K", end_size = "4K", warmup_iters = 1 }
matrix = { iters = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21] }
"""


@pytest.mark.slurm
@SLURM
def test_slurm_twenty_concurrent_jobs_into_one_results_folder_lose_no_row(tmp_path):
    suite = tmp_path / "twenty.toml"
    suite.write_text(TWENTY)
    results = tmp_path / "results"
    start = time.monotonic()
    proc = reproflow("submit", str(suite), "--results", str(results), "--array")
    ids = submitted_ids(proc.stdout)
    tasks = wait(ids[0].split("_")[0], timeout=400, count=20)
    seconds = time.monotonic() - start
    files = sorted((results / "twenty" / "c").glob("*.csv"))
    log = "\n".join(job_log(results / "twenty" / "jobs", i) for i in ids)
    lost = rows_lost(log)
    spans = sorted((pd.Timestamp(t["start"]), pd.Timestamp(t["end"])) for t in tasks.values())
    overlapping = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    recorded = (results / "twenty" / "jobs.jsonl").read_text().splitlines()
    survived = (len(ids) == 20 and all(t["state"] == "COMPLETED" for t in tasks.values()) and len(files) == 20
                and not any(point_file_problem(f) for f in files) and len(recorded) == 20
                and len(list((results / "twenty" / "env").glob("*.json"))) == 20)
    record_fault(f"slurm: 20 concurrent jobs (up to {overlapping} at once) into one results folder", survived, lost,
                 seconds > 400, seconds)
    assert survived and lost == 0 and overlapping >= 2, (tasks, len(files))


@pytest.fixture(scope="module")
def measured_before(tmp_path_factory) -> Path:
    """Rows of an earlier run (one comms point, measured here) that a failing Pyxis job must leave whole."""
    results = tmp_path_factory.mktemp("before") / "results"
    proc = reproflow("run", str(suite_file(results.parent, iters=2)), "--results", str(results))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return results


def corrupted_copy(tmp_path: Path) -> str:
    """The image with its middle half overwritten: header, length and magic whole, its files not."""
    copy = tmp_path / "corrupt.sqsh"
    shutil.copyfile(IMAGE, copy)
    size = copy.stat().st_size
    with copy.open("r+b") as fh:
        for offset in range(size // 4, 3 * size // 4, size // 64):
            fh.seek(offset)
            fh.write(bytes(range(256)) * 256)
    return str(copy)


def cut_short(tmp_path: Path) -> str:
    """The first MiB of the image: an interrupted copy."""
    copy = tmp_path / "short.sqsh"
    with open(IMAGE, "rb") as fh:
        copy.write_bytes(fh.read(1 << 20))
    return str(copy)


PYXIS_FAULTS = {  # fault: the part of the job's one line that names it and its fix
    "registry name": "is not an absolute or ./ path: Pyxis would pull it from a registry. Give the squash file's path",
    "missing squash file": "does not exist. Build it with 'make containers'",
    "squash file cut short": "its squashfs header records. Copy it again, or rebuild it with 'make containers'",
    "corrupt squash file": "Enroot could not unpack IMAGE={image} on node1,node2 (its words above): a corrupt squash "
                           "file",
    "enroot missing on node2": "enroot is not installed on node2, and Pyxis runs it on every node of a job: install "
                               "Enroot there",
    "mount folder missing": "CONTAINER_MOUNTS names {missing}, which does not exist on node1,node2: create it there",
}


@NEEDS_IMAGE
@NEEDS_PYXIS
@pytest.mark.slurm
@SLURM
@pytest.mark.parametrize("fault", list(PYXIS_FAULTS))
def test_a_pyxis_job_names_what_keeps_its_image_from_starting(tmp_path, measured_before, fault):
    """The smoke job with the default runtime (Pyxis) and one fault: it fails before its first step with one
    line naming the fault and its fix, no hang, and the rows already in its results folder stay whole."""
    results = tmp_path / "results"
    shutil.copytree(measured_before, results)
    before = {p: p.read_text() for p in results.rglob("*.csv")}
    image, missing = IMAGE, str(tmp_path / "no-such-folder")
    extra = ""
    if fault == "registry name":
        image = "apps/reproflow-cpu.sqsh"
    elif fault == "missing squash file":
        image = str(tmp_path / "reproflow-cpu.sqsh")
    elif fault == "squash file cut short":
        image = cut_short(tmp_path)
    elif fault == "corrupt squash file":
        image = corrupted_copy(tmp_path)
    elif fault == "mount folder missing":
        extra = f",CONTAINER_MOUNTS={missing}:{missing}"
    hidden = folder_hidden_on("node2", str(Path(shutil.which("enroot") or "").parent)) \
        if fault == "enroot missing on node2" else contextlib.nullcontext()
    start = time.monotonic()
    with hidden:
        job = sbatch("-N", "2", f"--export=NONE,IMAGE={image},RESULTS={results}{extra}", str(SMOKE),
                     cwd=tmp_path)
        state = wait(job, timeout=300)[job]["state"]
    seconds = time.monotonic() - start
    log = (tmp_path / f"reproflow-smoke_{job}.out").read_text()
    message = PYXIS_FAULTS[fault].format(image=image, missing=missing)
    lost = sum(len(text.splitlines()) - 1 for p, text in before.items() if not p.is_file() or p.read_text() != text)
    survived = state == "FAILED" and message in log and "experiment comms" not in log and "Traceback" not in log
    record_fault(f"pyxis: {fault}", survived, lost, seconds > 240, seconds)
    assert survived and lost == 0, (state, log[-3000:])


def test_a_rank_that_dies_of_a_fatal_signal_leaves_its_stack_in_its_log(tmp_path):
    """A rank killed by SIGSEGV (as a fault in torch's or gloo's native code kills it) is named with its
    signal, and its log holds every thread's Python stack at the fault, down to the code that faulted."""
    suite, results = suite_file(tmp_path, iters=300), tmp_path / "results"
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "collective=all_reduce:segv:1"})
    assert proc.returncode == 128 + 11, proc.stderr[-3000:]
    # Rank 0 fails too when rank 1 vanishes, and may be seen ending first: the signal names the cause.
    assert re.search(r"rank 1 on \S+ \(pid \d+\) failed, with signal 11 \(SIGSEGV\)", proc.stderr), \
        proc.stderr
    (log,) = results.rglob("rank1.log")
    text = log.read_text()
    assert "Fatal Python error: Segmentation fault" in text and "in _inject_during_point" in text, text[-3000:]
    assert "collective=broadcast" in points(results)  # the point before it kept
