"""Nothing measured is lost: atomic point files, skip-done reruns, failed and crashed points, torn files
quarantined, the health gate, the recorded environment, concurrent appends, the failure taxonomy."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ONE_COLLECTIVE, record_fault, reproflow, rows_lost

from reproflow.launch.retry import (
    CANCELLED,
    EXPERIMENT,
    INFRASTRUCTURE,
    OK,
    TIME_LIMIT,
    classify,
    fit,
    recorded_failures,
)
from reproflow.reporting.report import load_results
from reproflow.store.files import append_line, atomic_write
from reproflow.store.provenance import NOT_RECORDED, REDACTED, redact_environment
from reproflow.store.results import QUARANTINE, point_file_problem, quarantine

pytestmark = pytest.mark.distributed

SUITE = """
[launch]
backend = "gloo"
device = "cpu"
timeout_s = 60
time_limit = "00:05:00"
[[experiment]]
name = "c"
family = "param_comms"
launch = { procs_per_node = 2 }
params = { begin_size = "1K", end_size = "2K", warmup_iters = 1, iters = 2 }
matrix = { collective = ["all_reduce", "broadcast", "reduce", "send_recv"] }
"""


def _files(results: Path) -> dict[str, Path]:
    return {p.name.split("-w")[0]: p for p in (results / "tiny" / "c").glob("*.csv")}


def test_atomic_write_replaces_whole_files(tmp_path):
    target = tmp_path / "a" / "x.csv"
    atomic_write(target, "one\n")
    atomic_write(target, "two\n")
    assert target.read_text() == "two\n"
    assert [p.name for p in target.parent.iterdir()] == ["x.csv"]


def test_rerun_skips_done_points_and_force_measures_again(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    first = reproflow("run", str(suite), "--results", str(results))
    assert first.returncode == 0, first.stderr
    stamps = {k: p.stat().st_mtime_ns for k, p in _files(results).items()}
    assert len(stamps) == 4
    second = reproflow("run", str(suite), "--results", str(results))
    assert second.returncode == 0 and "0 to run, 4 already done" in second.stdout
    assert {k: p.stat().st_mtime_ns for k, p in _files(results).items()} == stamps
    third = reproflow("run", str(suite), "--results", str(results), "--force")
    assert third.returncode == 0 and "4 to run" in third.stdout
    assert all(p.stat().st_mtime_ns != stamps[k] for k, p in _files(results).items())


def test_a_failed_point_leaves_the_others_intact(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    start = time.monotonic()
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "collective=broadcast:raise:1"})
    failed = list((results / "tiny" / "c").glob("*.failed.json"))
    survived = proc.returncode == 3 and len(failed) == 1 and set(_files(results)) == {
        "collective=all_reduce", "collective=reduce", "collective=send_recv"}
    record_fault("local: a point fails on one rank", survived, rows_lost(proc.stdout), False, time.monotonic() - start)
    assert survived, proc.stderr
    assert "rank 1: injected fault" in json.loads(failed[0].read_text())["error"]
    status = reproflow("status", "--results", str(results))
    assert "tiny/c: 3 point(s) measured, 1 failed" in status.stdout
    again = reproflow("run", str(suite), "--results", str(results))
    assert again.returncode == 0 and "1 to run, 3 already done" in again.stdout
    assert len(_files(results)) == 4 and not list((results / "tiny" / "c").glob("*.failed.json"))


def test_a_crashed_rank_keeps_finished_points_and_a_rerun_resumes(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    start = time.monotonic()
    proc = reproflow("run", str(suite), "--results", str(results),
                     env={"REPROFLOW_INJECT_FAULT": "collective=reduce:exit:1"})
    survived = proc.returncode not in (0, 3) and set(_files(results)) == {"collective=all_reduce",
                                                                          "collective=broadcast"}
    record_fault("local: a rank crashes (exit 17)", survived, rows_lost(proc.stdout), False, time.monotonic() - start)
    assert survived, proc.stderr
    assert not [p for p in (results / "tiny" / "c").iterdir() if p.name.startswith(".")]
    again = reproflow("run", str(suite), "--results", str(results))
    assert again.returncode == 0 and "2 to run, 2 already done" in again.stdout
    assert len(_files(results)) == 4


def test_torn_files_are_quarantined_never_aggregated_and_measured_again(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    assert reproflow("run", str(suite), "--results", str(results)).returncode == 0
    files = _files(results)
    whole = files["collective=broadcast"].read_text()
    lines = whole.splitlines(keepends=True)
    # Cut mid-line, cut at a line boundary (caught by point_rows), and a file of another program.
    files["collective=broadcast"].write_text(whole[: len(whole) // 2])
    files["collective=reduce"].write_text("".join(lines[:-1]))
    assert point_file_problem(files["collective=all_reduce"]) == ""
    assert "cut short" in point_file_problem(files["collective=broadcast"])
    assert "rows where the writer wrote" in point_file_problem(files["collective=reduce"])
    report = reproflow("report", "--results", str(results), "--out", str(tmp_path / "out"))
    record_fault("torn result files (cut mid-line, cut at a line end)", report.returncode == 0 and
                 report.stderr.count("is not a whole result file") == 2, 0, False, 0.0)
    assert report.returncode == 0, report.stderr
    assert report.stderr.count("is not a whole result file") == 2
    frame = load_results(results)
    assert sorted(frame["collective"].unique()) == ["all_reduce", "send_recv"]
    left_out = (tmp_path / "out" / "left_out.md").read_text()
    assert "cut short" in left_out and "rows where the writer wrote" in left_out
    assert len(list((results / QUARANTINE).rglob("*.csv"))) == 2
    again = reproflow("run", str(suite), "--results", str(results))
    assert again.returncode == 0 and "2 to run, 2 already done" in again.stdout
    assert all(point_file_problem(p) == "" for p in _files(results).values()) and len(_files(results)) == 4


def test_a_failed_health_gate_is_recorded_and_its_points_left_out(write_suite, tmp_path):
    suite, results = write_suite(SUITE), tmp_path / "results"
    proc = reproflow("run", str(suite), "--results", str(results), "-e", "c",
                     env={"REPROFLOW_INJECT_FAULT": "health:corrupt:1"})
    assert proc.returncode == 0, proc.stderr
    assert "health gate fail: all_reduce of 4 MiB over 2 ranks: rank 0:" in proc.stdout
    rows = pd.concat(pd.read_csv(p) for p in _files(results).values())
    assert set(rows["health_gate"]) == {"fail"} and "summed values wrong" in rows["health_detail"].iloc[0]
    out = tmp_path / "out"
    report = reproflow("report", "--results", str(results), "--out", str(out))
    record_fault("health gate: a rank corrupts the all-reduce", "4 point(s) left out: their job failed its health "
                 "gate" in report.stderr, rows_lost(proc.stdout), False, 0.0)
    assert "4 point(s) left out: their job failed its health gate" in report.stderr
    assert "health gate failed" in (out / "left_out.md").read_text()
    assert load_results(results).empty
    good = reproflow("run", str(suite), "--results", str(tmp_path / "good"))
    assert "health gate pass: all_reduce of 4 MiB over 2 ranks" in good.stdout
    assert set(load_results(tmp_path / "good")["health_gate"]) == {"pass"}
    # One rank moves nothing over a bus: the gate says so instead of a busBW of 0.
    alone = reproflow("run", str(write_suite(ONE_COLLECTIVE % 2, "alone")), "--results", str(tmp_path / "alone"))
    assert "over 1 ranks on" in alone.stdout and "one rank: no bus traffic" in alone.stdout, alone.stdout
    assert "busBW 0 GB/s" not in alone.stdout


def test_two_jobs_quarantining_the_same_torn_file_both_go_on(tmp_path):
    """The second finder of a torn file finds it moved already: it gets the same place, not an error."""
    torn = tmp_path / "s" / "e" / "p.csv"
    torn.parent.mkdir(parents=True)
    torn.write_text("schema_version,suite")
    first = quarantine(tmp_path, torn, "cut short")
    assert quarantine(tmp_path, torn, "cut short") == first and first.is_file()
    assert json.loads(first.with_suffix(".why.json").read_text())["problem"] == "cut short"


def test_the_environment_is_recorded_with_secrets_redacted_and_archived_redacted_again(write_suite, tmp_path):
    """A job whose environment holds a Slurm token, a token as a package index's user name, a password
    after another query parameter and a connection string (also repeated in SLURM_EXPORT_ENV, as sbatch
    --export does): neither its environment file nor the archive holds any of them; an environment file
    written before these rules is redacted again in the archive, one that cannot be read is left out."""
    suite, results = write_suite(SUITE), tmp_path / "results"
    secrets = {"SLURM_JWT": "eyJhbGciOi.jwt-part", "PIP_INDEX_URL": "https://ghp_tok3n@pypi.example/simple",
               "DB_URL": "postgres://db/x?user=me&password=pa55word",
               "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=AzK3y==;"}
    exported = "NONE," + ",".join(f"{k}={v}" for k, v in secrets.items() if k != "AZURE_STORAGE_CONNECTION_STRING")
    env = {**secrets, "SLURM_EXPORT_ENV": exported, "NCCL_SOCKET_IFNAME": "lo", "PLAIN_SETTING": "visible"}
    proc = reproflow("run", str(suite), "--results", str(results), "--set", "collective=all_reduce", env=env)
    assert proc.returncode == 0, proc.stderr
    (record,) = (results / "tiny" / "env").glob("*.json")
    recorded = json.loads(record.read_text())["environment"]
    assert recorded["NCCL_SOCKET_IFNAME"] == "lo" and recorded["SLURM_JWT"] == REDACTED
    assert recorded["PLAIN_SETTING"] == recorded["PIP_INDEX_URL"] == recorded["DB_URL"] == NOT_RECORDED
    assert "PIP_INDEX_URL=https://<redacted>@pypi.example" in recorded["SLURM_EXPORT_ENV"]
    assert "&password=<redacted>" in recorded["SLURM_EXPORT_ENV"]
    leaked = ("eyJhbGciOi", "jwt-part", "ghp_tok3n", "pa55word", "AzK3y")

    def holding_secrets(texts: dict[str, str]) -> list[str]:
        return [name for name, text in texts.items() if any(v in text for v in leaked)]

    assert not holding_secrets({str(p): p.read_text(errors="replace") for p in results.rglob("*") if p.is_file()})
    # Records of an older version, written with the secrets in them, and a torn one.
    old = json.loads(record.read_text())
    old["environment"] = {**old["environment"], **secrets}
    (record.parent / "old-node1.json").write_text(json.dumps(old))
    (record.parent / "torn-node2.json").write_text('{"environment": {"HF_TOKEN": "hf_sec')
    archive = tmp_path / "share.tar.gz"
    proc = reproflow("archive", "--out", str(archive), "--results", str(results), "--reports", str(tmp_path / "r"),
                     "--logs", str(tmp_path / "l"))
    assert proc.returncode == 0, proc.stderr
    assert "left out results/tiny/env/torn-node2.json: not a readable environment record" in proc.stderr
    with tarfile.open(archive) as tar:
        texts = {m.name: tar.extractfile(m).read().decode(errors="replace")  # type: ignore[union-attr]
                 for m in tar.getmembers() if m.isfile()}
    assert "share/results/tiny/env/old-node1.json" in texts and not holding_secrets(texts)
    # the suite, given by path, kept beside its results: the archive can rerun it
    assert texts["share/results/tiny.toml"] == suite.read_text()
    assert "hf_sec" not in "".join(texts.values())
    manifest = json.loads(texts["share/MANIFEST.json"])
    assert list(manifest["left_out"]) == ["results/tiny/env/torn-node2.json"]


@pytest.mark.parametrize(("value", "shown"), [
    ("https://ghp_x@host/simple", f"https://{REDACTED}@host/simple"),
    ("https://:tok@host/x", f"https://:{REDACTED}@host/x"),
    ("postgres://me:pw@db:5432/x", f"postgres://me:{REDACTED}@db:5432/x"),
    ("http://h/?user=a&password=p&x=1", f"http://h/?user=a&password={REDACTED}&x=1"),
    ("https://acct.blob/c?sv=2022&sig=AbC%2B", f"https://acct.blob/c?sv=2022&sig={REDACTED}"),
    ("AccountName=a;AccountKey=k==;EndpointSuffix=core", f"AccountName=a;AccountKey={REDACTED};EndpointSuffix=core"),
    ('PASSWORD="two words" next', f"PASSWORD={REDACTED} next"),
    ("run --token t -v --db-password 'a b'", f"run --token {REDACTED} -v --db-password {REDACTED}"),
    ("Authorization: Bearer abc.def", f"Authorization: Bearer {REDACTED}"),
    ("NONE,A=1,HF_TOKEN=x", f"NONE,A=1,HF_TOKEN={REDACTED}"),
    ("/usr/bin:/bin", "/usr/bin:/bin"),
    ("db:\n  password: hunter2\n  host: db1", f"db:\n  password: {REDACTED}\n  host: db1"),
    ("api_key : 'a b' then", f"api_key: {REDACTED} then"),
    ("mysql -u me -p hunter2 db", f"mysql -u me -p {REDACTED} db"),
    ("start time: 12:00, url https://h:443/x", "start time: 12:00, url https://h:443/x"),
    ("srun --mpi=pmi2 -N 2 --export=NONE,MONKEY=1", "srun --mpi=pmi2 -N 2 --export=NONE,MONKEY=1"),
])
def test_secrets_inside_recorded_values_are_redacted(value, shown):
    assert redact_environment({"SLURM_EXPORT_ENV": value})["SLURM_EXPORT_ENV"] == shown


def test_only_variables_that_explain_a_measurement_keep_their_values():
    secret_names = ["SLURM_JWT", "CI_JOB_JWT", "GITHUB_PAT", "DB_PASS", "MYSQL_PWD", "LDAP_PW", "AWS_ACCESS_KEYS",
                    "AUTHORIZATION", "BEARER", "AZURE_STORAGE_SAS", "MY_CONNECTION_STRING", "SENTRY_DSN",
                    "HF_TOKEN", "KEY", "SSH_AUTH_SOCK", "NCCL_SECRET", "AccountKey"]
    kept = {"NCCL_IB_HCA": "mlx5", "NCCL_IB_QPS_PER_CONNECTION": "4", "FI_PROVIDER": "efa", "OMP_NUM_THREADS": "1",
            "SLURM_JOB_ID": "7", "MASTER_PORT": "1", "PATH": "/usr/bin", "REPROFLOW_IMAGE": "x.sqsh"}
    env = redact_environment({**kept, **{n: "s3cret" for n in secret_names}, "MONKEY": "m", "PIP_INDEX_URL": "u"})
    assert {n: env[n] for n in kept} == kept
    assert {n: env[n] for n in secret_names} == dict.fromkeys(secret_names, REDACTED)
    assert env["MONKEY"] == env["PIP_INDEX_URL"] == NOT_RECORDED
    assert redact_environment(env) == env  # a record redacted before stays as it is


def _append_many(path: str, writer: int) -> None:
    for i in range(50):
        append_line(Path(path), json.dumps({"writer": writer, "i": i}))


def test_lines_are_appended_where_the_file_system_has_no_flock(tmp_path, monkeypatch):
    """Lustre mounted without -o flock answers flock with ENOSYS: the line is appended all the same."""
    import errno
    import fcntl

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    for i in range(3):
        append_line(tmp_path / "jobs.jsonl", json.dumps({"i": i}))
    assert [json.loads(line)["i"] for line in (tmp_path / "jobs.jsonl").read_text().splitlines()] == [0, 1, 2]


def test_twenty_writers_appending_to_one_file_lose_no_line(tmp_path):
    target = tmp_path / "jobs.jsonl"
    with multiprocessing.get_context("spawn").Pool(20) as pool:
        pool.starmap(_append_many, [(str(target), w) for w in range(20)])
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(lines) == 1000 and len({(d["writer"], d["i"]) for d in lines}) == 1000


@pytest.mark.parametrize(("state", "log", "down", "category", "words"), [
    ("COMPLETED", "", (), OK, "completed"),
    ("NODE_FAIL", "", ("node2",), INFRASTRUCTURE, "node of the job failed"),
    ("PREEMPTED", "", (), INFRASTRUCTURE, "preempted"),
    ("TIMEOUT", "", (), TIME_LIMIT, "time limit"),
    ("OUT_OF_MEMORY", "", (), EXPERIMENT, "out of memory"),
    ("CANCELLED", "", (), CANCELLED, "cancelled"),
    ("CANCELLED", "", ("node2",), INFRASTRUCTURE, "node2 went down"),
    ("FAILED", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", (), EXPERIMENT, "out of memory"),
    ("FAILED", "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", (), INFRASTRUCTURE, "NCCL"),
    ("FAILED", "torch.distributed.DistNetworkError: failed to connect", (), INFRASTRUCTURE, "rendezvous"),
    ("FAILED", "reproflow: rank 1 on node2: health gate all-reduce failed: x", (), INFRASTRUCTURE,
     "health gate failed (first: rank 1 on node2)"),
    ("FAILED", "1: Root Cause (first observed failure):\n1: [0]:\n1:   time : x\n1:   host      : node2\n"
     "1:   rank      : 1 (local_rank: 0)\n1:   error_file: <N/A>\n1:   traceback : Signal 9 (SIGKILL) received",
     (), INFRASTRUCTURE,
     "killed (SIGKILL) (first: rank 1 on node2)"),
    # Each node's torchrun names a root cause, their lines interleaved: the rank killed by a signal is first.
    ("FAILED", "0: Root Cause (first observed failure):\n0:   host      : node1\n0:   rank      : 0 (local_rank: 0)\n"
     "1: Root Cause (first observed failure):\n1:   host      : node2\n1:   rank      : 1 (local_rank: 0)\n"
     "1:   exitcode  : -9 (pid: 15892)  (SIGKILL)\n0:   exitcode  : 1 (pid: 15891)\n"
     "1:   traceback : Signal 9 (SIGKILL) received by PID 15892", (), INFRASTRUCTURE,
     "killed (SIGKILL) (first: rank 1 on node2)"),
    ("FAILED", "reproflow: rank 3 on node2 did not reach its first point within 330 s (launch.startup_s); it was "
     "joining the process group", (), INFRASTRUCTURE, "did not start within launch.startup_s"),
    ("FAILED", "[1/7] collective=reduce: FAILED: rank 1: injected fault", (), EXPERIMENT, "a point failed"),
    ("FAILED", "reproflow: error: suite file x does not exist", (), EXPERIMENT, "invalid input"),
    ("FAILED", "ValueError: boom", (), EXPERIMENT, "see its log"),
])
def test_failure_taxonomy(state, log, down, category, words):
    verdict = classify("42", state, log, down)
    assert verdict.category == category and words in verdict.reason, verdict
    assert verdict.nodes == (down if category == INFRASTRUCTURE else ())


def test_a_node_is_blamed_from_slurms_event_log_even_when_it_is_idle_again():
    """`sacctmgr -n -P show event nodes=node1,node2 start=<job start> format=...` as the test cluster
    printed it after node2 was set down mid-job and came back three seconds later (ReturnToService=2):
    the closed event still blames node2; events after the job ended, of other nodes, or not a failure
    do not."""
    recorded = ["node2|2026-11-25T10:01:02|2026-11-25T10:01:05|DOWN|reproflow-fault-test",
                "node2|2026-11-25T10:01:02|2026-11-25T10:01:05|DOWN*|Not responding",
                "node1|2026-11-25T10:09:00|Unknown|DRAIN|after the job",
                "node3|2026-11-25T10:01:00|Unknown|DOWN|not the job's",
                "node1|2026-11-25T10:00:30|2026-11-25T10:00:31|IDLE|"]
    blamed = recorded_failures(recorded, ["node1", "node2"], end="2026-11-25T10:01:04")
    assert blamed == {"node2": "node2 DOWN at 2026-11-25T10:01:02, back 2026-11-25T10:01:05: reproflow-fault-test"}
    assert set(recorded_failures(recorded, ["node1", "node2"], end="Unknown")) == {"node1", "node2"}
    assert "still out: after the job" in recorded_failures(recorded, ["node1"], end="")["node1"]
    verdict = classify("42", "NODE_FAIL", "", blamed, f"Slurm's event log: {blamed['node2']}")
    assert verdict.nodes == ("node2",) and verdict.line().endswith(
        "; nodes blamed: node2 (Slurm's event log: node2 DOWN at 2026-11-25T10:01:02, back 2026-11-25T10:01:05: "
        "reproflow-fault-test)")
    assert classify("42", "OUT_OF_MEMORY", "", blamed, "x").nodes == ()


def test_a_local_rendezvous_port_is_free_and_below_the_ephemeral_ports():
    """The local launcher's MASTER_PORT (and rank 0's under an MPI launcher, and a tool's) is one the kernel
    never hands out, so no MPI transport's listener or outgoing connection takes it before the store
    listens; and nothing holds it when chosen."""
    import socket

    from reproflow.rank.ports import FIRST, ephemeral_ports, free_port

    low = ephemeral_ports()[0]
    ports = [free_port() for _ in range(200)]
    assert all(FIRST <= p < low for p in ports) and len(set(ports)) > 150
    for port in ports[:20]:
        with socket.socket() as sock:
            sock.bind(("", port))  # free when chosen: a store can listen there on every interface


def test_retry_keeps_the_rank_count_on_fewer_nodes():
    assert fit(2, 1, 5) == (2, 1)
    assert fit(2, 1, 1) == (1, 2)
    assert fit(4, 2, 3) == (2, 4)
    assert fit(3, 1, 2) == (1, 3)
    assert fit(2, 4, 0) is None


@pytest.mark.parametrize("how", ["stuck", "ready", "left"])
def test_a_rank_bounds_its_own_start_and_says_where_it_stood(how):
    """Under srun or torchrun no launcher of reproflow's watches: a rank short of its first point past
    launch.startup_s names its stage, shows its threads' stacks and exits 125; one that got there, or that
    left the bounded block (its worker ended), goes on."""
    code = "\n".join([
        "import time", "from reproflow.rank import startup", "with startup.bounded(1, 3, 'node2'):",
        "    startup.reached(startup.JOINING, 'its store at node1:29500, served by rank 0')",
        "    startup.reached(startup.READY)" if how == "ready" else "    pass",
        f"    time.sleep({0 if how == 'left' else 5})", "time.sleep(5)"])
    env = {k: v for k, v in os.environ.items() if k not in ("REPROFLOW_START", "RANK")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if how != "stuck":
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        return
    assert proc.returncode == 125, proc.stderr
    assert ("reproflow: rank 3 on node2 did not reach its first point within 1 s (launch.startup_s); it was joining "
            "the process group (its store at node1:29500, served by rank 0). Its threads:") in proc.stderr
    assert 'File "<string>", line 6 in <module>' in proc.stderr  # where the main thread waited
