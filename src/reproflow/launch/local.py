"""Local executor: run an experiment's ranks as processes on this machine, no scheduler needed.

It sets the same environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...) and
starts `python -m reproflow.worker` once per rank, so local runs take the cluster's code path.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reproflow.launch import owner
from reproflow.launch.network import UNSHAPED, EmulatedNetwork, parse_rate
from reproflow.launch.owner import Owned
from reproflow.rank import startup
from reproflow.rank.ports import free_port
from reproflow.spec.errors import ReproflowError
from reproflow.spec.suite import Experiment, Suite, slurm_seconds


def worker_args(suite: Suite, exp: Experiment, results: Path, force: bool, root: Path,
                sets: Sequence[str] = ()) -> list[str]:
    """The worker's arguments, as every executor passes them."""
    args = ["--suite", str(suite.path), "--experiment", exp.name, "--results", str(results), "--root", str(root)]
    for item in sets:
        args += ["--set", item]
    return args + (["--force"] if force else [])


def find_mpirun() -> str:
    """The mpirun of the MPI that mpi4py loads: beside this Python first (the `mpich` wheel), else on PATH."""
    found = shutil.which("mpirun", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if not found:
        raise ReproflowError("launch.launcher = 'mpi' needs mpirun and mpi4py: pip install '.[mpi]' (make does), "
                             "or load the cluster's MPI module.")
    return found


def run_ranks(cmd: Sequence[str], world: int, logs: Path, env_extra: Mapping[str, str] | None = None,
              limit_s: float = 3600.0, host_size: int | None = None, mpirun: str = "",
              network: EmulatedNetwork | None = None, startup_s: float | None = None) -> int:
    """Start `cmd` once per rank with the torch.distributed environment, on this machine.

    `host_size` ranks form one emulated host (LOCAL_WORLD_SIZE), as on `world / host_size` nodes;
    LOCAL_RANK stays the rank, so ranks on a multi-GPU machine still get distinct GPUs. With
    `mpirun`, one `mpirun -np world python -m mpi4py ...` starts the ranks instead, and each takes
    its rank from MPI (`python -m mpi4py` aborts the job when a rank raises, rather than hanging).
    With `network`, each emulated host's ranks run in its namespace and gloo binds to its link.
    Rank 0 prints to this terminal; the others write `logs/rank<N>.log`, whose tail is printed when
    a rank fails. Every process started (mpirun's proxy and ranks too) is stopped when this returns or
    raises, or when this process dies (reproflow.launch.owner). Returns 0, 3 when a rank reported failed
    points, 124 past `limit_s`, EXIT_STARTUP when a rank had not reached its first point `startup_s`
    after the start (the ranks' stages are in `logs/start`), or the exit code of the failing rank named
    as the cause, the first a signal killed, else the first seen to fail (then the other ranks are
    stopped rather than left waiting).
    """
    logs.mkdir(parents=True, exist_ok=True)
    starts = logs / "start"
    shutil.rmtree(starts, ignore_errors=True)
    starts.mkdir()
    env = dict(os.environ)
    env.update(
        MASTER_ADDR=network.address(0) if network else "127.0.0.1",
        MASTER_PORT=str(free_port()),
        REPROFLOW_NETWORK=network.describe() if network else UNSHAPED,
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(host_size or world),
        # As torchrun does: share the cores, or ranks oversubscribe them and time each other.
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // world)),
        **{startup.ENV: str(starts)},
    )
    if network:
        # c10d warns on every connection that an emulated host's address has no name: nothing to act on.
        env.update(GLOO_SOCKET_IFNAME="eth0", TORCH_CPP_LOG_LEVEL=env.get("TORCH_CPP_LOG_LEVEL", "ERROR"))
    env.update(env_extra or {})
    procs: list[subprocess.Popen] = []
    files = []
    launch = Launch(world, starts, startup_s, mpirun)
    with Owned() as owned:
        env.update(owned.env)
        if mpirun:
            env.update(REPROFLOW_RANK_LOGS=str(logs))
            env.pop("RANK", None)
            first, *rest = cmd
            procs.append(subprocess.Popen([mpirun, "-np", str(world), first, "-m", "mpi4py", *rest], env=env))
        try:
            for rank in range(world if mpirun else 0, world):
                env_r = env | {"RANK": str(rank), "LOCAL_RANK": str(rank)}
                argv = list(cmd)
                if network:
                    host = rank // (host_size or world)
                    argv = network.command(host, argv)
                    # Ranks of different emulated hosts see one hostname: this names their host instead.
                    env_r["REPROFLOW_HOST"] = f"{socket.gethostname()}-h{host}"
                if rank == 0:
                    procs.append(subprocess.Popen(argv, env=env_r))
                    continue
                fh = open(logs / f"rank{rank}.log", "w")  # noqa: SIM115 - closed after the ranks exit
                files.append(fh)
                procs.append(subprocess.Popen(argv, env=env_r, stdout=fh, stderr=subprocess.STDOUT))
            code, failed, running = _wait(procs, time.monotonic() + limit_s, launch, owned)
        except BaseException:
            _stop(procs)
            raise
        finally:
            for fh in files:
                fh.close()
    if code not in (0, 3, startup.EXIT_STARTUP):
        _explain_failure(procs, failed, running, logs, world, mpirun)
    return code


@dataclass
class Launch:
    """What the wait for the ranks knows of their start: how many, where they record their stages, the
    seconds from now each has to reach its first point (None: no bound, for commands that are not
    reproflow's worker and record no stage), and the launcher (an mpirun's path, or '' for one process per
    rank)."""

    world: int
    starts: Path
    limit_s: float | None
    mpirun: str
    started: bool = False
    _looked: float = 0.0

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + (self.limit_s if self.limit_s is not None else math.inf)

    def overdue(self) -> bool:
        """Whether the start-up limit has passed with a rank short of its first point (looked up at most
        twice a second, and no more once every rank is there)."""
        now = time.monotonic()
        if self.started or self.limit_s is None or now < self._looked + 0.5:
            return False
        self._looked = now
        ready = sum(s.stage == startup.READY for s in startup.stages(self.starts).values())
        self.started = ready == self.world
        return not self.started and now > self.deadline

    def explain(self, owned: Owned) -> None:
        """Say which ranks did not start, and what each waited for: its last stage, and the kernel's word."""
        stages = startup.stages(self.starts)
        ranks = {rank: pid for pid, environ in owned.processes().items()
                 if (rank := startup.env_rank(environ)) is not None}
        ready = sum(s.stage == startup.READY for s in stages.values())
        launcher = f"mpirun ({self.mpirun})" if self.mpirun else "reproflow's local launcher (a process per rank)"
        print(f"reproflow: start-up limit reached: {ready} of {self.world} rank(s) reached their first point within "
              f"{self.limit_s:g} s (launch.startup_s); {launcher} had started {len(ranks)} rank process(es). "
              "What the others waited for:", file=sys.stderr)
        waits: dict[str, list[int]] = {}
        for rank in range(self.world):
            stage = stages.get(rank)
            if stage and stage.stage == startup.READY:
                continue
            pid = ranks.get(rank, stage.pid if stage else None)
            kernel = f"; kernel: {owner.wchan(pid) or 'running'}" if pid in ranks.values() else "; not running"
            waits.setdefault((stage.waiting() if stage else startup.SILENT) + kernel, []).append(rank)
        for what, which in waits.items():
            print(f"  rank(s) {_ranges(which)}: {what}", file=sys.stderr)
        print("reproflow: stopping them. Points measured before are kept; a rerun measures only the rest. Raise "
              "launch.startup_s only where a start is slow rather than stuck.", file=sys.stderr)


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal {-code}"


def _failed(code: int | None) -> bool:
    """Whether a rank's exit code is a failure: None is still running, 3 reported failed points (kept)."""
    return code not in (None, 0, 3)


def _cause_first(procs: list[subprocess.Popen], failed: list[int]) -> list[int]:
    """The failed ranks, the one to name as the cause first: the first killed by a signal, else the first
    seen to fail. A rank whose peer vanishes fails in its next collective, and may be seen ended before
    the peer that a signal killed (a SIGSEGV's stack dump and core take time): a signal outranks order."""
    cause = next((i for i in failed if (procs[i].returncode or 0) < 0), failed[0])
    return [cause, *(i for i in failed if i != cause)]


def _explain_failure(procs: list[subprocess.Popen], failed: list[int], running: list[int], logs: Path, world: int,
                     mpirun: str) -> None:
    """Name the failed rank taken as the cause (and its host), the others that failed, the ranks still
    running then, and show their logs."""
    host = socket.gethostname()
    if failed and not mpirun:
        cause, *others = failed
        also = "".join(f"; rank {i} failed too, with {_signal_name(procs[i].returncode)}" for i in others)
        still = f"rank(s) {running} were still running (waiting, or hung) and were stopped" if running else \
            "no other rank was running"
        print(f"reproflow: rank {cause} on {host} (pid {procs[cause].pid}) failed, with "
              f"{_signal_name(procs[cause].returncode)}{also}; {still}", file=sys.stderr)
    for rank in range(1, world):
        path = logs / f"rank{rank}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        # Under mpirun one process stands for all ranks: show the logs of the ranks that raised.
        crashed = ("Traceback" in text or "reproflow: error" in text) if mpirun else \
            procs[rank].returncode not in (0, None, -signal.SIGTERM)
        if crashed:
            print(f"--- rank {rank} failed; last lines of {path}:", *text.splitlines()[-15:], sep="\n",
                  file=sys.stderr)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait(procs: list[subprocess.Popen], deadline: float, launch: Launch,
          owned: Owned) -> tuple[int, list[int], list[int]]:
    """(exit code, indices of the processes that failed, the cause first, indices still running after a
    second's grace) once all are done or stopped."""
    # When one rank fails the others would wait for it until the collective timeout: stop them.
    while True:
        codes = [p.poll() for p in procs]
        bad = [i for i, c in enumerate(codes) if _failed(c)]
        if bad:
            time.sleep(1.0)
            failed = _cause_first(procs, bad + [i for i, p in enumerate(procs) if i not in bad and _failed(p.poll())])
            running = [i for i, p in enumerate(procs) if p.poll() is None]
            _stop(procs)
            return int(procs[failed[0]].returncode or 1), failed, running
        if all(c is not None for c in codes):
            return (3 if 3 in codes else 0), [], []
        if launch.overdue():
            launch.explain(owned)
            _stop(procs)
            return startup.EXIT_STARTUP, [], [i for i, c in enumerate(codes) if c is None]
        if time.monotonic() > deadline:
            running = [i for i, c in enumerate(codes) if c is None]
            print(f"reproflow: time limit reached with rank(s) {running} still running; stopping them.",
                  file=sys.stderr)
            _stop(procs)
            return 124, [], running
        time.sleep(0.05)


@dataclass
class LocalExecutor:
    """Runs experiments as local process groups (gloo on CPU, NCCL when GPUs are visible)."""

    results: Path
    root: Path
    force: bool = False
    sets: tuple[str, ...] = ()
    network: str | None = None  # --network: every experiment's launch.network ('' for loopback)
    nodes: int | None = None  # --nodes: emulated hosts here (default: the suite's launch.nodes)
    procs_per_node: int | None = None  # --procs-per-node (default: the suite's launch.procs_per_node)

    def world_size(self, exp: Experiment) -> int:
        """Ranks to start: nodes x ranks per node, each the option's or else the suite's."""
        return (self.nodes or exp.launch.nodes) * self.host_size(exp)

    def host_size(self, exp: Experiment) -> int:
        """Ranks per emulated host: --procs-per-node, else the suite's procs_per_node."""
        return self.procs_per_node or exp.launch.procs_per_node

    def run(self, suite: Suite, exp: Experiment) -> int:
        """Run one experiment; return 0, 3 when points failed, or the failing rank's exit code."""
        job_id = f"local-{_dt.datetime.now():%Y%m%dT%H%M%S}-{os.getpid()}"
        with contextlib.ExitStack() as stack:
            return run_ranks(
                [sys.executable, "-m", "reproflow.worker",
                 *worker_args(suite, exp, self.results, self.force, self.root, self.sets)],
                self.world_size(exp),
                self.results / suite.name / "logs" / job_id,
                {"REPROFLOW_JOB_ID": job_id},
                slurm_seconds(exp.launch.time_limit),
                self.host_size(exp),
                find_mpirun() if exp.launch.launcher == "mpi" else "",
                self._network(exp, stack),
                exp.launch.startup_s,
            )

    def _network_rate(self, exp: Experiment) -> tuple[str, str]:
        """The emulated network's rate the experiment asks for ('' for none) and why it cannot be built
        here ('' where it can)."""
        rate = exp.launch.network if self.network is None else self.network
        if not rate:
            return "", ""
        why = EmulatedNetwork.unavailable()
        if exp.launch.launcher == "mpi":
            why = "the emulated network wraps ranks that reproflow starts, not mpirun's"
        elif exp.launch.backend == "nccl":
            why = "NCCL between one machine's GPUs does not use the emulated links"
        return rate, why

    def network_plan(self, exp: Experiment) -> str:
        """What a real run of the experiment changes on this machine's network, in words ('' for nothing)."""
        rate, why = self._network_rate(exp)
        if not rate:
            return ""
        if why:
            return f"network: {why}; it would run on loopback, unshaped ({rate} not applied), changing nothing"
        hosts = self.world_size(exp) // self.host_size(exp)
        return (f"network: a real run changes this machine while it runs: {hosts} network namespaces (one per "
                f"emulated host), a bridge and tc rate limits of {rate} each way, all removed when it ends; "
                "--network '' runs on loopback and changes nothing")

    def _network(self, exp: Experiment, stack: contextlib.ExitStack) -> EmulatedNetwork | None:
        """The emulated network the experiment asks for, built (removed when `stack` closes); None, and
        why, where it runs on loopback instead."""
        rate, why = self._network_rate(exp)
        if not rate:
            return None
        mbit = parse_rate(rate)
        if not why:
            try:
                net = stack.enter_context(EmulatedNetwork(self.world_size(exp) // self.host_size(exp), mbit))
                print(f"reproflow: {exp.name}: network {net.describe()}")
                return net
            except OSError as exc:
                why = f"the emulated network could not be built ({exc})"
        print(f"reproflow: {exp.name}: {why}; it runs on loopback, unshaped ({rate} not applied)")
        return None
