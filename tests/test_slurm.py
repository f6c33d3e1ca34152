"""End to end through a real Slurm cluster (slurmctld, 2 slurmd, slurmdbd) started by tests/slurm/start.sh.

Jobs run the committed sbatch scripts and `reproflow submit` (the same job, templates/job.sh, one
experiment per job) on the host environment (IMAGE= : no Pyxis), with parameter overrides that keep
each job to a few seconds; the last tests run a short reproduction through Pyxis in the CPU image.
The nodes are hosts of an emulated network, each link shaped (tests/slurm/start.sh), so a job across
them crosses a shaped link.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, mpi_start_failed, reproflow
from slurmtools import (  # noqa: F401
    IMAGE,
    NEEDS_IMAGE,
    NEEDS_PYXIS,
    SLOW,
    SMALL,
    cluster,
    rows_of,
    sacct,
    sbatch,
    submitted_ids,
    wait,
)

from reproflow.reporting.claims import ONCE

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("cluster")]

def test_committed_scripts_pass_sbatch_test_only():
    for script in sorted((ROOT / "sbatch").glob("*.sbatch")):
        proc = subprocess.run(["sbatch", "--test-only", "-N", "2", "--export=NONE", str(script)], cwd=ROOT,
                              capture_output=True, text=True)
        assert proc.returncode == 0 and "to start at" in proc.stderr, (script, proc.stderr)


def test_sbatch_param_comms_on_two_nodes(tmp_path):
    results = tmp_path / "results"
    env = f"NONE,IMAGE=,PROCS_PER_NODE=1,RESULTS={results},SET={SMALL}"
    job = sbatch("-N", "2", f"--export={env}", "-o", str(tmp_path / "%x_%j.out"), "sbatch/param-comms.sbatch")
    state = wait(job)[job]
    log = (tmp_path / f"reproflow-param-comms_{job}.out").read_text()
    assert state["state"] == "COMPLETED", log[-3000:]
    rows = rows_of(results)
    assert set(rows["job_id"]) == {job}
    assert set(rows["nodelist"]) == {"node1,node2"}
    assert set(rows["world_size"]) == {2} and set(rows["backend"]) == {"gloo"}
    per_rank_hosts = rows[rows["metric"] == "time_us"]["rank"].astype(int)
    assert set(per_rank_hosts) == {0, 1}
    assert rows["collective"].nunique() == 7
    assert "COMMS-RES-all_reduce-float32" in log


def test_jobs_record_their_environment_without_the_submitters_variables(tmp_path):
    """--export=NONE keeps the submitting shell out; what the job had is recorded per host, secrets redacted."""
    results = tmp_path / "results"
    env = f"NONE,IMAGE=,PROCS_PER_NODE=1,RESULTS={results},SET={SMALL} collective=all_reduce,API_TOKEN=s3cr3t-value"
    job = subprocess.run(["sbatch", "--parsable", "-N", "2", f"--export={env}", "-o", str(tmp_path / "%j.out"),
                          "sbatch/param-comms.sbatch"], cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, LEAK_MARKER="from-the-login-shell")).stdout.strip()
    assert wait(job)[job]["state"] == "COMPLETED", (tmp_path / f"{job}.out").read_text()[-2000:]
    records = {json.loads(p.read_text())["host"]: json.loads(p.read_text())
               for p in (results / "param-comms" / "env").glob(f"{job}-*.json")}
    assert set(records) == {"node1", "node2"}
    for record in records.values():
        env_seen = record["environment"]
        assert "LEAK_MARKER" not in env_seen and env_seen["API_TOKEN"] == "<redacted>"
        assert env_seen["SLURM_JOB_ID"] == job and env_seen["REPROFLOW_IMAGE"] == ""
        # The two nodes share this machine's cores: each rank's torch gets its node's share (the TaskProlog).
        assert env_seen["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert not [p for p in results.rglob("*") if p.is_file() and "s3cr3t-value" in p.read_text(errors="replace")]
    proc = reproflow("submit", "param-comms", "--nodes", "1", "--procs-per-node", "1",
                     "--results", str(tmp_path / "sub"), "--wait",
                     "--set", "collective=all_reduce", *[a for kv in SMALL.split() for a in ("--set", kv)],
                     env={"LEAK_MARKER": "from-the-login-shell"})
    assert proc.returncode == 0 and "-> ok: completed" in proc.stdout, proc.stdout + proc.stderr
    (record,) = (tmp_path / "sub" / "param-comms" / "env").glob("*.json")
    assert "LEAK_MARKER" not in json.loads(record.read_text())["environment"]
    # 8 ranks on a 2-core node can never start: the supervisor says so and cancels instead of waiting forever.
    stuck = reproflow("submit", "param-comms", "--nodes", "1", "--procs-per-node", "8",
                      "--results", str(tmp_path / "sub"), "--wait", timeout=120)
    assert stuck.returncode == 1 and "UNSCHEDULABLE -> experiment: Slurm can never start it" in stuck.stdout


def test_sbatch_two_ranks_per_node(tmp_path):
    results = tmp_path / "results"
    env = f"NONE,IMAGE=,PROCS_PER_NODE=2,RESULTS={results},SET={SMALL} collective=all_reduce"
    job = sbatch("-N", "2", f"--export={env}", "-o", str(tmp_path / "%x_%j.out"), "sbatch/param-comms.sbatch")
    assert wait(job)[job]["state"] == "COMPLETED", (tmp_path / f"reproflow-param-comms_{job}.out").read_text()
    rows = rows_of(results)
    assert set(rows["world_size"]) == {4} and set(rows["nodelist"]) == {"node1,node2"}


def test_reproflow_submit_runs_the_suites_job_script(tmp_path):
    results = tmp_path / "results"
    proc = reproflow("submit", "param-comms", "--nodes", "2", "--procs-per-node", "1", "--results", str(results),
                     *[a for kv in SMALL.split() for a in ("--set", kv)])
    assert proc.returncode == 0, proc.stderr
    (job,) = submitted_ids(proc.stdout)
    assert wait(job)[job]["state"] == "COMPLETED", list((results / "param-comms" / "jobs").glob("*.out"))
    rows = rows_of(results / "param-comms" / "collectives")
    assert set(rows["job_id"]) == {job} and set(rows["nodelist"]) == {"node1,node2"}
    status = reproflow("status", "--results", str(results))
    assert f"{job}" in status.stdout and "COMPLETED" in status.stdout
    # The catalog: one run, its id in every row, its manifest written by the submitting process, the
    # cluster named by Slurm, the points and the headline figure read from the rows.
    (manifest,) = (results / "runs").glob("*.json")
    run_id = manifest.stem
    assert set(rows["run_id"]) == {run_id}
    listed = reproflow("runs", "--results", str(results))
    assert listed.returncode == 0, listed.stderr
    assert f"{run_id}" in listed.stdout and "submitted" in listed.stdout and "7 point(s), 0 failed" in listed.stdout
    assert "reproflowtest" in listed.stdout and "param_comms busbw" in listed.stdout and "node1,node2" in listed.stdout
    assert reproflow("runs", "--results", str(results), "--cluster", "no-such").stdout.startswith("reproflow: 0 run")


def test_job_array_with_a_concurrency_cap(tmp_path):
    """One array task per point; with at most 1 running, no two tasks overlap in time."""
    results = tmp_path / "results"
    proc = reproflow("submit", "param-comms", "--nodes", "1", "--procs-per-node", "2", "--results", str(results),
                     "--array", "--max-parallel", "1", *[a for kv in SMALL.split() for a in ("--set", kv)])
    assert proc.returncode == 0, proc.stderr
    ids = submitted_ids(proc.stdout)
    assert len(ids) == 7
    array = ids[0].split("_")[0]
    tasks = wait(array, timeout=240, count=7)
    assert all(t["state"] == "COMPLETED" for t in tasks.values()), tasks
    assert any(t["reason"] == "JobArrayTaskLimit" for t in tasks.values()), tasks
    spans = sorted((pd.Timestamp(t["start"]), pd.Timestamp(t["end"])) for t in tasks.values())
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, spans
    rows = rows_of(results / "param-comms" / "collectives")
    assert rows["collective"].nunique() == 7
    assert set(rows["job_id"]) == set(ids)


def test_dependency_chain_runs_in_order_and_stops_after_a_failure(tmp_path):
    results = tmp_path / "results"
    sets = [a for kv in SMALL.split() for a in ("--set", kv)]
    first = reproflow("submit", "param-comms", "--nodes", "1", "--procs-per-node", "1", "--results", str(results),
                      "--set", "collective=all_reduce", *sets)
    (a,) = submitted_ids(first.stdout)
    second = reproflow("submit", "param-comms", "--nodes", "1", "--procs-per-node", "1", "--results", str(results),
                       "--set", "collective=broadcast", "--after", a, *sets)
    (b,) = submitted_ids(second.stdout)
    done_a, done_b = wait(a)[a], wait(b)[b]
    assert done_a["state"] == done_b["state"] == "COMPLETED"
    assert pd.Timestamp(done_b["start"]) >= pd.Timestamp(done_a["end"])
    bad = reproflow("submit", "param-comms", "--nodes", "1", "--procs-per-node", "1", "--results", str(tmp_path / "r2"),
                    "--set", "collective=reduce", *sets, env={"REPROFLOW_INJECT_FAULT": "collective=reduce:exit"})
    (c,) = submitted_ids(bad.stdout)
    after = reproflow("submit", "param-comms", "--nodes", "1", "--procs-per-node", "1",
                      "--results", str(tmp_path / "r2"), "--set", "collective=send_recv", "--after", c, *sets)
    (d,) = submitted_ids(after.stdout)
    assert wait(c)[c]["state"] == "FAILED"
    reason = ""
    for _ in range(30):
        reason = subprocess.run(["squeue", "-h", "-j", d, "-o", "%r"], capture_output=True, text=True).stdout.strip()
        if reason == "DependencyNeverSatisfied":
            break
        time.sleep(1)
    assert reason == "DependencyNeverSatisfied"
    status = reproflow("status", "--results", str(tmp_path / "r2")).stdout
    assert f"{c:<12} FAILED" in status and f"{d:<12} PENDING" in status, status
    subprocess.run(["scancel", d], check=True)


def test_status_reports_every_slurm_state(tmp_path):
    def wrap(name: str, *args: str) -> str:
        return sbatch("--job-name", f"reproflow-state-{name}", "-o", str(tmp_path / "%j.out"), *args)

    done = {"COMPLETED": wrap("ok", "-n1", "--wrap", "true"), "FAILED": wrap("fail", "-n1", "--wrap", "exit 3")}
    for job in done.values():
        wait(job)
    timeout = wrap("timeout", "-w", "node1", "-n1", "--time=1", "--wrap", "sleep 300")
    running = wrap("running", "-w", "node1", "-n1", "--wrap", "sleep 300")
    held = wrap("held", "-n1", "--hold", "--wrap", "true")
    on_node2 = wrap("nodefail", "-w", "node2", "-n1", "--wrap", "sleep 300")
    wait(running, {"RUNNING"})
    wait(on_node2, {"RUNNING"})
    live = reproflow("status", "--results", str(tmp_path)).stdout
    assert f"{running:<12} RUNNING" in live and f"{held:<12} PENDING" in live, live
    subprocess.run(["scancel", running], check=True)
    subprocess.run(["scontrol", "update", "nodename=node2", "state=down", "reason=reproflow-test"], check=True)
    try:
        done["NODE_FAIL"] = on_node2
        wait(on_node2, {"NODE_FAIL"}, timeout=60)
    finally:
        # ReturnToService=2 may already have brought it back, in which case resume is refused.
        subprocess.run(["scontrol", "update", "nodename=node2", "state=resume"], capture_output=True)
    done["CANCELLED"] = running
    done["TIMEOUT"] = timeout
    wait(timeout, {"TIMEOUT"}, timeout=150)
    subprocess.run(["scancel", held], check=True)
    final = reproflow("status", "--results", str(tmp_path)).stdout
    for state, job in done.items():
        assert f"{job:<12} {state}" in final, (state, final)
    for job, verdict in ((done["FAILED"], "FAILED -> experiment"), (on_node2, "NODE_FAIL -> infrastructure"),
                         (running, "CANCELLED -> cancelled"), (timeout, "TIMEOUT -> time_limit")):
        assert f"job {job}: {verdict}" in final, final


def test_cancelled_job_keeps_finished_points_and_rerun_completes(tmp_path):
    results = tmp_path / "results"
    env = f"NONE,IMAGE=,PROCS_PER_NODE=1,RESULTS={results},SET={SLOW}"
    job = sbatch("-N", "2", f"--export={env}", "-o", str(tmp_path / "%x_%j.out"), "sbatch/param-comms.sbatch")
    folder = results / "param-comms" / "collectives"
    end = time.monotonic() + 120
    while time.monotonic() < end and not list(folder.glob("*.csv")):
        time.sleep(0.5)
    subprocess.run(["scancel", job], check=True)
    assert wait(job)[job]["state"] == "CANCELLED"
    kept = sorted(folder.glob("*.csv"))
    assert 1 <= len(kept) < 7
    for path in kept:  # every kept file is whole: all sizes of its point are there
        rows = pd.read_csv(path)
        assert rows[rows["metric"] == "busbw"]["size_bytes"].max() == 8 * 2**20
    status = reproflow("status", "--results", str(results)).stdout
    assert f"param-comms/collectives: {len(kept)} point(s) measured" in status and "CANCELLED" in status
    again = sbatch("-N", "2", f"--export={env}", "-o", str(tmp_path / "%x_%j.out"), "sbatch/param-comms.sbatch")
    assert wait(again, timeout=300)[again]["state"] == "COMPLETED"
    log = (tmp_path / f"reproflow-param-comms_{again}.out").read_text()
    assert f"{7 - len(kept)} to run, {len(kept)} already done" in log
    assert len(list(folder.glob("*.csv"))) == 7


def test_doctor_reports_slurm_ready_and_shared_results(tmp_path):
    proc = reproflow("doctor", "--results", str(tmp_path))
    assert "[  ok] Slurm is ready: controller up, 2 of 2 node(s) usable" in proc.stdout, proc.stdout
    assert f"[  ok] results folder {tmp_path.resolve()} is visible from 2 node(s)" in proc.stdout
    assert "[  ok] accounting on" in proc.stdout and "GPUs per node: node1=8, node2=8" in proc.stdout
    assert "pmi2" in proc.stdout and "[  ok] mpi4py loads MPICH" in proc.stdout


RESHARDING = """
[suite]
description = "a 2-host resharding case for the test cluster"
[launch]
nodes = 2
procs_per_node = 2
backend = "gloo"
device = "cpu"
time_limit = "00:05:00"
[[experiment]]
name = "two-hosts"
family = "resharding"
[experiment.zip]
resharding_mode = ["send_recv", "send_recv", "broadcast", "ring_broadcast"]
use_local_allgather = [false, true, false, false]
[experiment.params]
case = "custom"
src_mesh = "1x2"
dst_mesh = "1x2"
shape = "64x8"
src_spec = "R,S0"
dst_spec = "S0,R"
runs = 3
warmup_runs = 1
chunk_bytes = 64
"""


def test_resharding_meshes_sit_on_separate_nodes(tmp_path, write_suite):
    from reproflow.launch.render import render_sbatch
    from reproflow.spec.suite import load_suite

    script = tmp_path / "resharding.sbatch"
    script.write_text(render_sbatch(load_suite(write_suite(RESHARDING, "resharding-two-hosts")), ROOT))
    results = tmp_path / "results"
    job = sbatch("-N", "2", f"--export=NONE,IMAGE=,RESULTS={results}", "-o", str(tmp_path / "%x_%j.out"),
                 str(script))
    state = wait(job)[job]
    log = (tmp_path / f"reproflow-resharding-two-hosts_{job}.out").read_text()
    assert state["state"] == "COMPLETED", log[-3000:]
    # Source mesh on the first node, destination on the second: the hosts of the plan are real nodes.
    assert log.count("hosts: 0=node1 1=node2") == 4
    rows = rows_of(results)
    assert set(rows["nodelist"]) == {"node1,node2"} and set(rows["world_size"]) == {4}
    assert (rows[rows["metric"] == "wrong_elements"]["value"] == 0).all()
    assert len(rows[rows["metric"] == "exec_time_mean"]) == 4


ACESO_PROFILE = """
[launch]
backend = "gloo"
device = "cpu"
time_limit = "00:10:00"
[[experiment]]
name = "ops"
family = "aceso"
launch = { procs_per_node = 1 }
params = { model = "gpt", size = "tiny", seq_len = 32, warmup = 1, repeats = 1 }
matrix = { mbs = [1, 2] }
"""


def test_aceso_profile_then_search_as_dependent_jobs(tmp_path, write_suite):
    """Profile on the cluster, then a CPU-only search job that starts after it and builds the
    database from its rows; the search result is keyed by the database's content hash."""
    results, db, configs = tmp_path / "results", tmp_path / "db", tmp_path / "configs"
    profile = reproflow("submit", str(write_suite(ACESO_PROFILE, "aceso-tiny")), "--results", str(results))
    assert profile.returncode == 0, profile.stderr
    (profile_job,) = submitted_ids(profile.stdout)
    search_args = ["aceso", "search", "--model-name", "gpt", "--model-size", "tiny", "--global-batch-size", "8",
                   "--micro-batch-size", "1", "2", "--num-nodes", "1", "--num-gpus-per-node", "1",
                   "--memory-limit", "10000", "--profiled-time-path", str(db), "--config-save-path", str(configs),
                   "--budget-cases", "300", "--from-results", str(results)]
    search = reproflow(*search_args, "--submit", "--after", profile_job)
    assert search.returncode == 0, search.stderr
    (search_job,) = submitted_ids(search.stdout)
    assert wait(profile_job)[profile_job]["state"] == "COMPLETED"
    state = wait(search_job)[search_job]
    logs = list((configs / "submitit").rglob("*.out"))
    assert state["state"] == "COMPLETED", [p.read_text()[-2000:] for p in logs]
    assert state["start"] >= sacct(profile_job)[profile_job]["end"]  # afterok: only once the profile ended
    assert (db / "gpt_tiny_mbs2_tp1_algo0.csv").is_file()
    (manifest,) = configs.glob("search-*.json")
    assert json.loads(manifest.read_text())["configs"]
    again = reproflow(*search_args)
    assert again.returncode == 0 and "reused: this database" in again.stdout


def test_aceso_profile_search_train_chain_from_one_command(tmp_path):
    """`reproflow aceso reproduce small --submit`: profile, search, the screen of every Megatron-LM plan,
    the choice of the fastest, the ABBA rounds of Aceso's config against it, the ops profiled again and
    both configs predicted from them, as Slurm jobs chained with afterok; the trainings span both nodes."""
    logs, results = tmp_path / "logs", tmp_path / "results"
    run = reproflow("aceso", "reproduce", "small", "--models", "t5", "--num-nodes", "2", "--num-gpus-per-node", "1",
                    "--budget-cases", "300", "--train-iters", "3", "--train-seconds", "0", "--train-rounds", "2",
                    "--screen-iters", "3", "--log-path", str(logs), "--results", str(results), "--submit")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("job ids:")]
    # profile (the ops on both nodes, then P2P between them), search, screen, the choice, the rounds, the
    # ops profiled again, the predictions from them
    assert len(lines) == 8, run.stdout
    jobs = [line.split(":", 1)[1].strip() for line in lines]
    ops, p2p, search, screen, choice, rounds, again, predict = jobs
    states = {job: wait(job, timeout=900)[job] for job in jobs}
    assert all(s["state"] == "COMPLETED" for s in states.values()), (states, run.stdout)
    assert states[search]["start"] >= max(states[ops]["end"], states[p2p]["end"])
    assert states[p2p]["nodes"] == states[again]["nodes"] == "node[1-2]"
    assert (logs / "profiled-time" / "p2p_inter_node.csv").is_file()
    for before, after in ((search, screen), (screen, choice), (choice, rounds), (rounds, again), (again, predict)):
        assert states[after]["start"] >= states[before]["end"]
    assert states[screen]["nodes"] == states[rounds]["nodes"] == "node[1-2]"
    folder = logs / "aceso" / "search" / "t5" / "tiny"
    chosen = json.loads((folder / "baseline.json").read_text())
    # the screen named every plan of the grid; those the search did not write were not applicable
    trained = [p for p in chosen["plans"] if p["plan"] == "megatron"]
    assert len(trained) == len(json.loads(next(folder.glob("search-*.json")).read_text())["megatron_grid"])
    rows = rows_of(results)
    rounds_rows = rows[(rows["suite"] == "aceso-train-t5-tiny") & (rows["metric"] == "iteration_ms")]
    # each side's measured pick and its predicted pick (the artifact's), once where they are one config
    picks = {"megatron": {chosen["measured_best"], chosen["predicted_best"]},
             "aceso": {chosen["aceso_measured_best"] or chosen["aceso"], chosen["aceso"]}}
    for plan, names in picks.items():
        assert set(rounds_rows.loc[rounds_rows["plan"] == plan, "config_name"]) == {Path(n).stem for n in names}
        for name in names:
            csvs = sorted((logs / plan / "runtime" / "t5" / "tiny" / "csv").glob(f"{Path(name).stem}_*.csv"))
            assert len(csvs) == 2, (plan, name)  # one per rank, on both nodes
    assert len(list((folder / "csv").glob("info_*-after-training.csv"))) == 2
    assert len(list((folder / "csv").glob("ops_*.csv"))) == 2  # each op's predictions, by the predicting job
    tables = reproflow("aceso", "e2e", "small", "--log-path", str(logs))
    assert tables.returncode == 0 and "-------- [t5] End-to-end Throughput (Samples/s) --------" in tables.stdout
    accuracy = reproflow("aceso", "perf-model-acc", "small", "--log-path", str(logs))
    assert accuracy.returncode == 0 and "from its ops profiled again right after training: " in accuracy.stdout
    assert "op by op with a sync after each" in accuracy.stdout  # where each prediction misses


SPATIAL = """
[launch]
launcher = "mpi"
time_limit = "00:10:00"
[[experiment]]
name = "tiles"
family = "spatial"
launch = { nodes = 2, procs_per_node = 2 }
[experiment.params]
model = "resnet"
resnet_depth = 29
image_size = 64
batch_size = 2
split_size = 2
spatial_size = 1
num_spatial_parts = 2
slice_method = "vertical"
local_dp = 2
steps = 1
"""


def test_spatial_mpi_ranks_start_through_srun_on_two_nodes(tmp_path, write_suite):
    """The MPI path of the sbatch script: srun --mpi starts one MPI rank per task (pmi2 here: the MPICH
    wheel has no PMIx client); tiles on node1, the two layer-parallel replicas on node2."""
    from reproflow.launch.render import render_sbatch
    from reproflow.spec.suite import load_suite

    script = tmp_path / "spatial.sbatch"
    script.write_text(render_sbatch(load_suite(write_suite(SPATIAL, "spatial-two-nodes")), ROOT))
    results = tmp_path / "results"
    for attempt in range(2):
        # About 40 s when it starts; the time limit turns a start-up that hangs into TIMEOUT with its log.
        job = sbatch("-N", "2", "--time=3", f"--export=NONE,IMAGE=,RESULTS={results},SRUN_MPI=pmi2", "-o",
                     str(tmp_path / "%x_%j.out"), str(script))
        state = wait(job, timeout=330)[job]
        log = (tmp_path / f"reproflow-spatial-two-nodes_{job}.out").read_text()
        # MPICH's pmi2 start-up failing (mpi_start_failed), or hanging until the time limit before any
        # point was written: that start, and only that, is tried again.
        started = results.exists() and any(results.rglob("*.csv"))
        if attempt == 0 and (mpi_start_failed(log) or (state["state"] == "TIMEOUT" and not started)):
            print(f"job {job}: MPICH's pmi2 start-up failed ({state['state']}); submitting again. Its log:\n"
                  f"{log[-2000:]}", flush=True)
            continue
        break
    assert state["state"] == "COMPLETED", log[-3000:]
    assert "MPI rank(s) per node through srun" in log
    rows = rows_of(results)
    assert set(rows["nodelist"]) == {"node1,node2"} and set(rows["world_size"]) == {4}
    checks = rows[rows["metric"].isin(["logits_max_rel_err", "grads_max_rel_err"])]["value"]
    assert len(checks) == 2 and checks.max() < 1e-8


def test_reproduce_submits_waits_for_the_jobs_and_reports(tmp_path):
    from test_reproduce import tiny_plan

    folders = ["--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
               "--logs", str(tmp_path / "logs")]
    proc = reproflow("reproduce", "--plan", str(tiny_plan(tmp_path)), "--only", "comms", "--executor", "slurm",
                     *folders, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "[  ok] Slurm is ready" in proc.stdout  # reproflow doctor first
    assert "reproflow submit " in proc.stdout and "--retries 2" in proc.stdout
    (job,) = set(rows_of(tmp_path / "results" / "tiny-comms")["job_id"])
    assert f"attempt 1: job(s) {job}" in proc.stdout and f"job {job}: COMPLETED -> ok" in proc.stdout
    assert sacct(job)[job]["state"] == "COMPLETED"
    assert "2 points measured" in proc.stdout
    assert set(rows_of(tmp_path / "results" / "tiny-comms")["job_id"]) == {job}
    claims = pd.read_csv(tmp_path / "reports" / "claims.csv")
    comms = claims[claims["family"] == "param_comms"].set_index("claim")
    # reproflow's own rows cannot test the bus factor (they compute busBW from it): the original tools' can;
    # the tiny sweep measures each size once, which decides no timing
    assert comms["status"].iloc[0] == "not measured"
    assert comms.loc["busBW grows with message size", "status"] == "inconclusive"
    assert ONCE in comms.loc["busBW grows with message size", "cases"]
    assert (tmp_path / "reports" / "report.html").is_file()


def test_a_rerun_of_an_interrupted_reproduction_submits_only_the_rest(tmp_path):
    """A reproduction whose second step fails (a point raises in its job, an experiment failure: not
    retried) keeps the first step's rows; the same command again submits nothing for the first step
    and only the unmeasured point of the second."""
    from test_reproduce import tiny_plan

    plan = str(tiny_plan(tmp_path))
    command = ["reproduce", "--plan", plan, "--only", "comms,resharding", "--executor", "slurm",
               "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
               "--logs", str(tmp_path / "logs")]
    first = reproflow(*command, env={"REPROFLOW_INJECT_FAULT": "ring_broadcast"}, timeout=600)
    assert first.returncode == 1, first.stdout[-3000:]
    assert "step resharding FAILED" in first.stdout and "not retried: experiment" in \
        (tmp_path / "logs" / "reproduce" / "resharding.log").read_text()
    assert len(list((tmp_path / "results" / "tiny-comms").rglob("*.csv"))) == 2
    again = reproflow(*command, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "all 2 point(s) measured earlier; nothing submitted" in \
        (tmp_path / "logs" / "reproduce" / "comms.log").read_text()
    table = {line.split()[0]: line.split()[1:5] for line in again.stdout.splitlines()
             if line.startswith(("comms ", "resharding "))}
    assert table == {"comms": ["ok", "0", "2", "0"], "resharding": ["ok", "1", "1", "0"]}, again.stdout[-2000:]


def shaped_network() -> str:
    """The network the test cluster's start built for its nodes ('emulated: ...'); skips where it could
    not (no root or iproute2: the nodes are on loopback), fails under CI."""
    state = Path(os.environ.get("LOCAL_SLURM_DIR", ROOT / ".local-slurm")) / "network"
    described = state.read_text().strip() if state.is_file() else ""
    if not described.startswith("emulated"):
        if os.environ.get("CI") == "true":
            pytest.fail(f"the test cluster's nodes are not on a shaped network ({described or 'no ' + str(state)})")
        pytest.skip(f"the test cluster's nodes are on {described or 'an unknown network'} (tests/slurm/start.sh)")
    return described


LINK = """
[suite]
description = "one sender on node1, one receiver on node2: the rate of the link between them"
[launch]
nodes = 2
procs_per_node = 1
backend = "gloo"
device = "cpu"
time_limit = "00:05:00"
[[experiment]]
name = "link"
family = "resharding"
params = { case = "1-to-1x1", scale = 256, runs = 5, warmup_runs = 1, resharding_mode = "send_recv" }
"""


def test_a_two_node_job_crosses_the_shaped_link(tmp_path, write_suite):
    """4 MiB from node1 to node2: every row names the shaped network, and the rate measured across it is
    at most the link's (over loopback it would be several times more)."""
    from reproflow.launch.render import render_sbatch
    from reproflow.spec.suite import load_suite

    described = shaped_network()
    mbit = float(re.search(r"([\d.]+) Mbit/s", described).group(1))
    script = tmp_path / "link.sbatch"
    script.write_text(render_sbatch(load_suite(write_suite(LINK, "shaped-link")), ROOT))
    results = tmp_path / "results"
    job = sbatch("-N", "2", f"--export=NONE,IMAGE=,RESULTS={results}", "-o", str(tmp_path / "%j.out"), str(script))
    assert wait(job)[job]["state"] == "COMPLETED", (tmp_path / f"{job}.out").read_text()[-3000:]
    rows = rows_of(results)
    assert set(rows["network"]) == {described} and set(rows["nodelist"]) == {"node1,node2"}
    measured = rows.loc[rows["metric"] == "effective_bw", "value"].item() * 8e3  # GB/s -> Mbit/s
    assert 0 < measured <= 1.05 * mbit, (measured, described)
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "shaped-link.md").write_text(
        f"Job {job}: 4 MiB send/recv node1 -> node2 on the test cluster ({described}): {measured:.0f} Mbit/s "
        f"measured, {measured / mbit:.0%} of the link\n")


@NEEDS_IMAGE
@NEEDS_PYXIS
def test_reproduce_through_pyxis_across_the_shaped_nodes_judges_the_link_claim(tmp_path):
    """The short form of the cluster's reproduction: two targets submitted in the CPU image through Pyxis,
    waited for and reported; resharding's claim, whose mechanism is the link between hosts, is judged
    (holds, does not hold or inconclusive), not "not applicable here" as over loopback."""
    from test_reproduce import tiny_plan

    described = shaped_network()
    folders = ["--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
               "--logs", str(tmp_path / "logs")]
    proc = reproflow("reproduce", "--plan", str(tiny_plan(tmp_path)), "--only", "comms,resharding",
                     "--executor", "slurm", "--image", IMAGE, *folders, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = rows_of(tmp_path / "results" / "tiny-resharding")
    assert set(rows["container_runtime"]) == {"pyxis"} and set(rows["network"]) == {described}
    assert set(rows["nodelist"]) == {"node1,node2"}
    claims = pd.read_csv(tmp_path / "reports" / "claims.csv")
    faster = claims[claims["claim"].str.startswith("broadcast resharding is faster")].iloc[0]
    assert faster["status"] in {"holds", "does not hold", "inconclusive"}, faster.to_dict()
    comms = claims[claims["family"] == "param_comms"].set_index("claim")
    # reproflow's own rows cannot test the bus factor (they compute busBW from it): the original tools' can;
    # the tiny sweep measures each size once, which decides no timing
    assert comms["status"].iloc[0] == "not measured"
    assert comms.loc["busBW grows with message size", "status"] == "inconclusive"
    assert ONCE in comms.loc["busBW grows with message size", "cases"]
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "reproduce-through-pyxis.md").write_text(
        f"reproflow reproduce --executor slurm --image <cpu image> --only comms,resharding (tiny plan) on "
        f"{described}: resharding's faster claim {faster['status']} at {faster['measured']:.3f}\n")
