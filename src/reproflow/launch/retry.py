"""Failure taxonomy and retries for submitted jobs.

Every finished job is classified from its Slurm state and its logs:

- infrastructure: node failure, preemption, a communicator or rendezvous that cannot form, a failed
  health gate, a rank killed by a signal. Not the experiment's fault: retried (up to `--retries`)
  on the same number of ranks, without the nodes that failed, and the retried rows say so
  (columns `attempt`, `retry_of`).
- experiment: out of memory, an exception in the benchmark, a point whose result was invalid, bad
  input. Retrying would fail again: reported, never retried.
- time_limit: the job ran past its time limit. Its finished points are kept; rerunning resumes.
- cancelled: someone cancelled it. Not retried.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from reproflow.launch import shell
from reproflow.launch.shell import run_lines
from reproflow.launch.status import SlurmJob
from reproflow.store import events

OK, INFRASTRUCTURE, EXPERIMENT, TIME_LIMIT, CANCELLED = "ok", "infrastructure", "experiment", "time_limit", "cancelled"
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                          "BOOT_FAIL", "DEADLINE", "UNSCHEDULABLE"})
# Pending reasons that no amount of waiting cures: the request does not fit the partition, or its
# dependency failed. The supervisor cancels such a job and says why instead of waiting forever.
NEVER_STARTS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
                          "DependencyNeverSatisfied", "InvalidQOS", "InvalidAccount", "QOSMaxNodePerJobLimit",
                          "QOSMaxCpuPerJobLimit", "AssocMaxNodesPerJob", "AssocMaxCpuPerJobLimit"})
_STATE = {"COMPLETED": (OK, "completed"), "NODE_FAIL": (INFRASTRUCTURE, "a node of the job failed (NODE_FAIL)"),
          "BOOT_FAIL": (INFRASTRUCTURE, "a node did not boot (BOOT_FAIL)"),
          "PREEMPTED": (INFRASTRUCTURE, "preempted by a higher-priority job"),
          "TIMEOUT": (TIME_LIMIT, "ran past its time limit (TIMEOUT)"),
          "DEADLINE": (TIME_LIMIT, "reached its deadline (DEADLINE)"),
          "OUT_OF_MEMORY": (EXPERIMENT, "out of memory (OUT_OF_MEMORY)"),
          "UNSCHEDULABLE": (EXPERIMENT, "Slurm can never start it as asked (nodes, ranks per node, time or partition); "
                                        "cancelled")}
# Log lines, strongest evidence first. Out of memory is the experiment's; the others are the platform's.
_LOG = [
    (EXPERIMENT, re.compile(r"CUDA out of memory|OutOfMemoryError|oom[-_ ]kill|Out Of Memory", re.I), "out of memory"),
    (INFRASTRUCTURE, re.compile(r"[Nn]ode failure|NODE FAIL|DUE TO NODE FAILURE"), "node failure"),
    (INFRASTRUCTURE, re.compile(r"health gate all-reduce failed|health gate fail"), "the health gate failed"),
    (INFRASTRUCTURE, re.compile(r"NCCL error|ncclSystemError|ncclInternalError|ncclRemoteError|NCCL WARN .*(init|"
                                r"connect)|Failed to initialize NCCL", re.I), "NCCL could not communicate"),
    (INFRASTRUCTURE, re.compile(r"did not reach its first point within|start-up limit reached"),
     "the ranks did not start within launch.startup_s"),
    (INFRASTRUCTURE, re.compile(r"RendezvousConnectionError|RendezvousTimeoutError|DistNetworkError|"
                                r"DistStoreError"), "the ranks could not meet (rendezvous)"),
    (INFRASTRUCTURE, re.compile(r"fi_\w+ failed|libfabric|EFA error", re.I), "the network fabric failed"),
    (INFRASTRUCTURE, re.compile(r"Signal 9 \(SIGKILL\)|signal 9 \(SIGKILL\)|task \d+: Killed"),
     "a rank was killed (SIGKILL)"),
    (EXPERIMENT, re.compile(r"reproflow: error:"), "invalid input"),
    (EXPERIMENT, re.compile(r"FAILED( before running)?: "), "a point failed"),
    (INFRASTRUCTURE, re.compile(r"Connection (closed|reset) by peer|collective failed in .* timed? ?out|"
                                r"Timed out waiting", re.I), "a rank lost its peers"),
]
# The first failing rank: from torchrun's "Root Cause" block ("host : node2", "rank : 1 (local_rank: 0)",
# "exitcode : -9"), or reproflow's own "rank 1 on node2".
_ROOT_CAUSE = re.compile(r"host\s*:\s*(?P<host>\S+)\s*\n\s*rank\s*:\s*(?P<rank>\d+) \(local_rank[^\n]*\n"
                         r"(?:\s*exitcode\s*:\s*(?P<code>-?\d+))?")
_WHO = re.compile(r"rank (?P<rank>\d+) on (?P<host>[^\s:,()]+)")
_LABEL = re.compile(r"^(\d+): ?", re.M)


@dataclass(frozen=True)
class Verdict:
    """What happened to one job: its category, in words, and the nodes to leave out of a retry."""

    job_id: str
    state: str
    category: str
    reason: str
    nodes: tuple[str, ...] = ()
    evidence: str = ""  # where the blamed nodes were read

    def line(self) -> str:
        where = f"; nodes blamed: {','.join(self.nodes)}" if self.nodes else ""
        where += f" ({self.evidence})" if self.nodes and self.evidence else ""
        return f"job {self.job_id}: {self.state} -> {self.category}: {self.reason}{where}"


def classify(job_id: str, state: str, log: str, down: Iterable[str] = (), evidence: str = "") -> Verdict:
    """Classify a finished job from its Slurm state, its logs, and its nodes that failed while it ran
    (`failed_nodes`: the nodes and where that was read)."""
    down = tuple(sorted(down))
    state = state.split()[0] if state else "UNKNOWN"
    if state in _STATE:
        category, reason = _STATE[state]
        if category != INFRASTRUCTURE:  # a job out of memory or out of time blames no node
            down, evidence = (), ""
        return Verdict(job_id, state, category, reason + _culprit(log), down, evidence)
    if down:
        return Verdict(job_id, state, INFRASTRUCTURE, f"node(s) {','.join(down)} went down during the job", down,
                       evidence)
    if state == "CANCELLED":
        return Verdict(job_id, state, CANCELLED, "cancelled (scancel, or the administrator)")
    for category, pattern, reason in _LOG:
        if pattern.search(log):
            return Verdict(job_id, state, category, reason + _culprit(log))
    return Verdict(job_id, state, EXPERIMENT, "the job failed; see its log" + _culprit(log))


def _task_streams(log: str) -> list[str]:
    """The log as one text per srun task ("N: " labels of srun -l; interleaved lines would split a
    block), or the log itself when unlabelled."""
    tasks: dict[str, list[str]] = {}
    for line in log.splitlines():
        found = _LABEL.match(line)
        if found:
            tasks.setdefault(found.group(1), []).append(line[found.end():])
    return ["\n".join(lines) for lines in tasks.values()] or [log]


def _culprit(log: str) -> str:
    """' (first: rank R on HOST)'. Each node's torchrun names a root cause: the rank killed by a signal
    is the first to fail, the others' ranks ended after losing it; else the first block in the log."""
    causes = [m for text in _task_streams(log) for m in _ROOT_CAUSE.finditer(text)]
    if causes:
        first = min(causes, key=lambda m: not (m.group("code") or "").startswith("-"))
        return f" (first: rank {first.group('rank')} on {first.group('host')})"
    found = _WHO.search(log)
    return f" (first: rank {found.group('rank')} on {found.group('host')})" if found else ""


def job_state(job_id: str) -> SlurmJob:
    """A job as sacct reports it; state UNKNOWN before sacct knows it."""
    for line in run_lines(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,JobName,State,Start,End,NodeList"]):
        fields = line.split("|")
        if len(fields) == 6 and fields[0] == job_id:
            return SlurmJob(job_id, fields[1], fields[2].split()[0] if fields[2] else "UNKNOWN", *fields[3:])
    return SlurmJob(job_id, "", "UNKNOWN", "", "", "")


# What sacctmgr prints of a node event, one per line (-n -P): the node, when it went down (or drained, or
# failed) and came back ("Unknown" while it is still out), its state and the administrator's reason.
EVENT_FORMAT = "NodeName,TimeStart,TimeEnd,State,Reason"


def recorded_failures(lines: Iterable[str], nodes: Collection[str], end: str) -> dict[str, str]:
    """From `sacctmgr show event` lines (EVENT_FORMAT) asked from the job's start: each of the job's
    `nodes` that an event took down, drained or failed before the job's `end` ('' or Unknown: not
    ended), with the event in words. An event closed since (the node idle again) still counts."""
    found: dict[str, str] = {}
    for line in lines:
        name, start, back, state, reason = ([*line.split("|"), "", "", "", ""])[:5]
        if name in nodes and (not end or end == "Unknown" or start <= end) and re.search(r"DOWN|DRAIN|FAIL", state):
            again = f", back {back}" if back and back != "Unknown" else ", still out"
            found.setdefault(name, f"{name} {state} at {start}{again}" + (f": {reason}" if reason else ""))
    return found


def failed_nodes(job: SlurmJob, log: str = "", settle_s: float = 60.0) -> tuple[list[str], str]:
    """The job's nodes that went down, drained or failed while it ran, and where that was read: Slurm's
    node events in the job's time window (sacctmgr; accounting), srun's "Node failure on <node>" lines
    in the job's log; without accounting, the nodes unusable now.

    A node set down comes back on its own under ReturnToService, often before the job is classified,
    so its state afterwards would hide it; the event log keeps it. slurmctld hands the event to
    slurmdbd a little after the job's state, so a NODE_FAIL job whose event is not there yet is asked
    again for up to `settle_s` seconds.
    """
    # The allocation's nodes and its steps': a job ended NODE_FAIL may be listed without the node it lost.
    steps = run_lines(["sacct", "-n", "-P", "-j", job.job_id, "-o", "NodeList"])
    nodes = sorted({n for listed in (job.nodelist, *steps) for n in hostnames(listed)})
    if not nodes:
        return [], ""
    srun = re.findall(r"[Nn]ode failure on (\S+?)[\s,.:]", log)
    said = {n: f"srun: node failure on {n}" for n in srun if n in nodes}
    if not job.start or job.start == "Unknown":
        return sorted(said), "; ".join(said.values())
    deadline = time.monotonic() + (settle_s if job.state in ("NODE_FAIL", "BOOT_FAIL") else 0.0)
    while True:
        asked = shell.run(["sacctmgr", "-n", "-P", "show", "event", f"nodes={','.join(nodes)}", f"start={job.start}",
                           f"format={EVENT_FORMAT}"])
        if asked is None or asked.returncode != 0:
            # No accounting: the nodes' state now is all there is, and a node already back is missed.
            now = node_states()
            down = {n: f"{n} {now[n]} now" for n in nodes if n in now and not usable(now[n])}
            found = {**down, **said}
            why = "no accounting (sacctmgr show event failed): blamed from the nodes' state now"
            return sorted(found), "; ".join([*found.values(), why])
        events = recorded_failures(asked.stdout.splitlines(), nodes, job.end)
        if events or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    found = {**said, **{n: f"Slurm's event log: {e}" for n, e in events.items()}}
    return sorted(found), "; ".join(found.values())


def hostnames(nodelist: str) -> list[str]:
    """`node[1-2]` -> ['node1', 'node2'] (scontrol's expansion)."""
    if not nodelist or nodelist in ("None assigned", "(null)"):
        return []
    return run_lines(["scontrol", "show", "hostnames", nodelist])


_UP = {"idle", "mixed", "allocated", "completing", "alloc", "mix", "comp", "planned"}


def node_states(partition: str = "") -> dict[str, str]:
    """Every node of the partition (all nodes when '') and its state, e.g. {'node1': 'idle', 'node2': 'down'}."""
    cmd = ["sinfo", "-h", "-N", "-o", "%N %T"] + (["-p", partition] if partition else [])
    states = {}
    for line in run_lines(cmd):
        name, _, state = line.partition(" ")
        states[name] = state.strip().rstrip("*~#!%$@^-").lower()
    return states


def usable(state: str) -> bool:
    """Whether a node in this sinfo state can take a job."""
    return state in _UP


def fit(nodes: int, procs: int, available: int) -> tuple[int, int] | None:
    """(nodes, ranks per node) for the same number of ranks on at most `available` nodes, or None.

    The shape is kept when enough nodes remain; otherwise the ranks are packed on fewer nodes (the
    largest count that divides them), which changes intra- versus inter-node traffic: say so.
    """
    world = nodes * procs
    for n in range(min(nodes, available), 0, -1):
        if world % n == 0:
            return n, world // n
    return None


@dataclass
class Attempt:
    """One submission of an experiment and what became of it."""

    number: int
    job_ids: list[str]
    nodes: int
    procs: int
    exclude: tuple[str, ...] = ()
    verdicts: list[Verdict] = field(default_factory=list)


def wait_for(job_ids: list[str], say: Callable[[str], None], poll_s: float = 2.0,
             limit_s: float | None = None, tick: Callable[[], None] | None = None) -> dict[str, SlurmJob]:
    """Poll sacct until every job is in a final state; prints each state change and calls `tick`
    (a progress display) at every poll.

    `limit_s` bounds the wait once a job runs (its time limit plus a margin); a job still running
    past it is returned as it is rather than waited for forever.
    """
    seen: dict[str, SlurmJob] = {}
    started: float | None = None
    while True:
        for job_id in job_ids:
            job = job_state(job_id)
            if job.state == "PENDING":
                reason = "".join(run_lines(["squeue", "-h", "-j", job_id, "-o", "%r"])).strip()
                if reason in NEVER_STARTS:
                    run_lines(["scancel", job_id])
                    say(f"job {job_id}: pending for a reason waiting cannot cure ({reason}); cancelled it")
                    job = replace(job, state="UNSCHEDULABLE")
            if job_id not in seen or seen[job_id].state != job.state:
                where = f" on {job.nodelist}" if job.nodelist and job.nodelist != "None assigned" else ""
                say(f"job {job_id}: {job.state}{where}")
            seen[job_id] = job
            if job.state == "RUNNING" and started is None:
                started = time.monotonic()
        if tick is not None:
            tick()
        if all(j.state in FINAL_STATES for j in seen.values()):
            return seen
        if limit_s is not None and started is not None and time.monotonic() - started > limit_s:
            say(f"reproflow: jobs {', '.join(job_ids)} still not finished {limit_s:.0f} s after starting; "
                "stopped waiting (they keep running; `reproflow status` follows them)")
            return seen
        time.sleep(poll_s)


def job_log(folder: Path, job_id: str) -> str:
    """The log of a job `reproflow submit` wrote into `folder` (`<job id>.out`: every step's output, srun's
    task labels on each line); '' when it is not there."""
    try:
        return (folder / f"{job_id}.out").read_text(errors="replace")
    except OSError:
        return ""


def batch_log(job: SlurmJob) -> str:
    """The output of a job submitted with a rendered sbatch script: `<name>_<id>.out` (the scripts'
    --output) in the job's working directory, as sacct records it; '' when it is not there."""
    lines = run_lines(["sacct", "-X", "-n", "-P", "-j", job.job_id, "-o", "WorkDir"])
    path = Path(lines[0].strip() if lines else ".") / f"{job.name}_{job.job_id}.out"
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def verdicts(jobs: dict[str, SlurmJob], folder: Path) -> list[Verdict]:
    """A verdict per finished job: its state, its logs, and its nodes that failed while it ran."""
    out = []
    for job_id, job in jobs.items():
        log = job_log(folder, job_id)
        out.append(classify(job_id, job.state, log, *failed_nodes(job, log)))
    return out


def say(text: str) -> None:
    """Progress of the supervisor, flushed so it shows live, and an event for whoever supervises this
    process (`reproduce` shows it from the event, never from the printed line)."""
    print(text, flush=True, file=sys.stdout)
    events.emit("supervisor", text=text)
