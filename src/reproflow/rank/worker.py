"""The per-rank program of every job: local runs, torchrun under sbatch, and submitit all start it.

    python -m reproflow.worker --suite FILE --experiment NAME --results DIR [--force]

Each rank joins the process group, runs the experiment's points in order, and rank 0 writes each
point's rows atomically as soon as the point is finished, so a job that dies later loses nothing
already measured. Points whose results exist are skipped unless --force.

Before the first point the ranks pass the health gate (reproflow.rank.health) unless the suite turns it
off; rank 0 of each host records the job's environment (secrets redacted) beside the results.

Fault injection for reliability tests: REPROFLOW_INJECT_FAULT="<text>:<mode>[:<rank>[:<attempt>]]" acts
on the points whose label contains <text>, on that rank (all ranks when omitted), in that attempt of a
retried job only (every attempt when omitted: a fault that must not follow the retry); a rank's start is
labelled `startup of <experiment>`, where `hang` stops it before it joins the process group (a start-up
that never ends). Modes: `raise` fails the point and goes on; `exit` ends the rank as a crash would;
`kill` sends the rank SIGKILL 0.2 s into the point, in the middle of its collectives; `hang` stops the
rank before the point's first collective, as a stuck GPU would. `health:corrupt[:<rank>]` makes the rank
add wrong values in the health gate.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from reproflow.rank.context import RunContext
from reproflow.rank.health import Gate, health_gate
from reproflow.rank.startup import BEGUN, READY, bounded, env_rank, reached
from reproflow.spec.errors import NOT_APPLICABLE, NotApplicable, ParamError, PointFailed, ReproflowError
from reproflow.spec.family import Family, Measurement, get_family
from reproflow.spec.params import whole
from reproflow.spec.suite import Experiment, Point, load_suite, parse_overrides
from reproflow.store import events
from reproflow.store.files import atomic_write
from reproflow.store.provenance import (
    Provenance,
    git_commit,
    image_sha256,
    job_identity,
    machine_name,
    write_environment,
)
from reproflow.store.results import (
    GATE_OFF,
    failure_path,
    make_rows,
    point_file_problem,
    point_path,
    quarantine,
    rows_to_csv,
    write_failure,
)
from reproflow.store.runs import row_run_id

EXIT_POINTS_FAILED = 3


def _injected_fault(label: str, rank: int) -> str:
    spec = os.environ.get("REPROFLOW_INJECT_FAULT", "")
    if not spec:
        return ""
    parts = spec.split(":")
    text, mode = parts[0], parts[1] if len(parts) > 1 else "raise"
    target = int(parts[2]) if len(parts) > 2 and parts[2] else None
    attempt = int(parts[3]) if len(parts) > 3 and parts[3] else None
    if attempt is not None and attempt != int(os.environ.get("REPROFLOW_ATTEMPT") or 1):
        return ""
    if text in label and (target is None or target == rank):
        return mode
    return ""


def _device_name(ctx: RunContext) -> str:
    if ctx.device.type == "cuda":
        return torch.cuda.get_device_name(ctx.device)
    return machine_name()


def _provenance(ctx: RunContext, hosts: Sequence[object], root: Path, gate: Gate) -> Provenance:
    job_id, image = job_identity()
    nccl = ""
    if ctx.backend == "nccl":
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    return Provenance(
        job_id=job_id,
        nodelist=",".join(sorted({str(h) for h in hosts})),
        world_size=ctx.world_size,
        backend=ctx.backend,
        device=ctx.device.type,
        device_name=_device_name(ctx),
        torch_version=torch.__version__,
        nccl_version=nccl,
        git_commit=git_commit(str(root)),
        image=image,
        image_sha256=image_sha256(image) if ctx.rank == 0 else "",
        container_runtime=os.environ.get("REPROFLOW_CONTAINER_RUNTIME", "") if image else "",
        enroot_version=os.environ.get("REPROFLOW_ENROOT_VERSION", ""),
        attempt=int(os.environ.get("REPROFLOW_ATTEMPT") or 1),
        retry_of=os.environ.get("REPROFLOW_RETRY_OF", ""),
        health_gate=gate.status,
        health_detail=gate.detail,
        network=os.environ.get("REPROFLOW_NETWORK", ""),
        host_cpus=len(os.sched_getaffinity(0)),
        run_id=row_run_id(job_id),
    )


def _done(results: Path, path: Path, ctx: RunContext) -> bool:
    """Whether a point's file holds its whole result; a torn file is quarantined and measured again."""
    if not path.exists():
        return False
    problem = point_file_problem(path)
    if not problem:
        return True
    moved = quarantine(results, path, problem)
    ctx.log(f"reproflow: {path} is not a whole result file ({problem}); moved to {moved}, measuring it again")
    return False


def _gate(ctx: RunContext, enabled: bool) -> Gate:
    if not enabled:
        return Gate(GATE_OFF, "")
    try:
        gate = health_gate(ctx, corrupt=_injected_fault("health", ctx.rank) == "corrupt")
    except RuntimeError as exc:
        # A rank that cannot finish one all-reduce cannot measure anything: say where, then end the job.
        print(f"reproflow: rank {ctx.rank} on {ctx.hostname}: health gate all-reduce failed: "
              f"{str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        raise
    ctx.log(f"reproflow: health gate {gate.status}: {gate.detail}")
    return gate


def _inject_during_point(mode: str, rank: int, label: str) -> None:
    """Faults that strike a running point: a crash, a SIGKILL mid-collective, a segmentation fault in
    native code, a hang."""
    if mode == "exit":
        print(f"rank {rank}: injected crash at {label}", file=sys.stderr, flush=True)
        os._exit(17)
    if mode == "kill":
        print(f"rank {rank}: injected SIGKILL 0.2 s into {label}", file=sys.stderr, flush=True)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
    if mode == "segv":
        print(f"rank {rank}: injected segmentation fault at {label}", file=sys.stderr, flush=True)
        ctypes.string_at(0)  # reads address 0: SIGSEGV, as a fault in a C extension raises it
    if mode == "hang":
        print(f"rank {rank}: injected hang at {label}", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)


def _preflight(fam: Family, point: Point, ctx: RunContext) -> str:
    """Checks every rank makes before the point's first collective; '' when the point may run."""
    try:
        if fam.check is not None:
            fam.check(point.params, ctx.world_size)
        if fam.runtime_check is not None:
            fam.runtime_check(point.params, ctx)
    except ParamError as exc:
        return f"invalid parameters for world size {ctx.world_size}: {exc}"
    except NotApplicable as exc:
        return f"{NOT_APPLICABLE}: {exc}"
    if _injected_fault(point.label, ctx.rank) == "raise":
        return "injected fault (REPROFLOW_INJECT_FAULT)"
    return ""


def run_experiment(ctx: RunContext, suite_name: str, exp: Experiment, results: Path, force: bool,
                   root: Path, only: int | None = None) -> int:
    """Run the points of `exp` (only point index `only` when given) on this rank; return how many failed."""
    fam = get_family(exp.family)
    hosts = ctx.hosts()
    if ctx.local_rank == 0:
        write_environment(results, suite_name, job_identity()[0], ctx.hostname,
                          [r for r, h in enumerate(hosts) if h == ctx.hostname])
    prov = _provenance(ctx, hosts, root, _gate(ctx, exp.launch.health_gate))
    repeats = exp.launch.repeats
    keys = [p.key(ctx.world_size, ctx.backend, ctx.device.type, repeats) for p in exp.points]
    paths = [point_path(results, suite_name, exp.name, k) for k in keys]
    # Rank 0 alone decides what is done (and quarantines torn files), so ranks cannot disagree.
    chosen = [only is None or i == only for i in range(len(paths))]
    todo = [c and (force or ctx.rank != 0 or not _done(results, p, ctx)) for c, p in zip(chosen, paths, strict=True)]
    box: list[object] = [todo]
    dist.broadcast_object_list(box, src=0)
    todo = box[0]  # type: ignore[assignment]
    reached(READY)
    if ctx.rank == 0:
        events.emit("experiment", suite=suite_name, experiment=exp.name, family=fam.name, points=sum(chosen),
                    to_run=sum(todo))
    ctx.log(
        f"reproflow: suite {suite_name} / experiment {exp.name} ({fam.name}): {sum(chosen)} of "
        f"{len(exp.points)} points, {sum(todo)} to run, {sum(chosen) - sum(todo)} already done; job {prov.job_id}, "
        f"{ctx.world_size} ranks on {prov.nodelist}, {ctx.backend} on {ctx.device.type}"
    )
    failed = 0
    for i, (point, path, run_it) in enumerate(zip(exp.points, paths, todo, strict=True)):
        tag = f"[{i + 1}/{len(exp.points)}] {point.label}"
        if only is not None and i != only:
            continue
        if not run_it:
            _point(ctx, events.SKIPPED, i, exp, f"{tag}: done earlier, skipped ({path.name})")
            continue
        problem = _preflight(fam, point, ctx)
        message = ctx.failures(problem)
        # Not applicable on every rank: skipped and said so (no failure record; a rerun asks again).
        if message and ctx.all_agree(problem.startswith(NOT_APPLICABLE)):
            _point(ctx, events.NOT_APPLICABLE, i, exp, f"{tag}: {problem}")
            continue
        if message:
            failed += 1
            if ctx.rank == 0:
                write_failure(path, point.label, message, prov.job_id, prov.run_id)
            _point(ctx, events.FAILED, i, exp, f"{tag}: FAILED before running: {message}")
            continue
        _point(ctx, events.RUNNING, i, exp, f"{tag}: running")
        _inject_during_point(_injected_fault(point.label, ctx.rank), ctx.rank, point.label)
        start = time.perf_counter()
        measured: list[tuple[int, Measurement]] = []
        try:
            for repeat in range(repeats):
                measured.extend((repeat, m) for m in fam.run(ctx, point.params))
        except (PointFailed, ParamError) as exc:
            # ParamError here comes from the point's input files (a config, a profile), which every
            # rank reads alike, so every rank fails the point at the same place.
            failed += 1
            if ctx.rank == 0:
                write_failure(path, point.label, str(exc), prov.job_id, prov.run_id)
            _point(ctx, events.FAILED, i, exp, f"{tag}: FAILED: {exc}")
            continue
        except RuntimeError as exc:
            # Typically a collective whose peer died or hung (gloo raises RuntimeError, NCCL DistBackendError):
            # this rank cannot go on. Say where it stood; the launcher names the rank that went first.
            print(f"reproflow: rank {ctx.rank} on {ctx.hostname}: {tag} failed after "
                  f"{time.perf_counter() - start:.1f} s: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
            raise
        if ctx.rank == 0:
            head = {"suite": suite_name, "experiment": exp.name, "family": fam.name, "point": point.label}
            atomic_write(path, rows_to_csv(make_rows(head, point.params, measured, prov)), under=results)
            failure_path(path).unlink(missing_ok=True)
            print(fam.table(point.params, [m for r, m in measured if r == repeats - 1]), flush=True)
        _point(ctx, events.MEASURED, i, exp, f"{tag}: {len(measured)} rows in {time.perf_counter() - start:.1f} s "
               f"-> {path}")
    return failed


def _point(ctx: RunContext, status: str, index: int, exp: Experiment, line: str) -> None:
    """A point's progress: the line for people (rank 0's log) and the event for a supervisor."""
    ctx.log(line)
    if ctx.rank == 0:
        events.emit("point", experiment=exp.name, index=index + 1, total=len(exp.points),
                    label=exp.points[index].label, status=status)


def _rank_log(rank: int) -> None:
    """Under mpirun (one launcher for all ranks), ranks other than 0 write to REPROFLOW_RANK_LOGS/rank<N>.log."""
    logs = os.environ.get("REPROFLOW_RANK_LOGS")
    if not logs or rank == 0:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(Path(logs) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one rank."""
    parser = argparse.ArgumentParser(prog="python -m reproflow.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", required=True, help="suite file")
    parser.add_argument("--experiment", required=True, help="experiment of the suite to run")
    parser.add_argument("--results", default="results", help="results folder")
    parser.add_argument("--force", action="store_true", help="re-measure points that have results")
    parser.add_argument("--root", default=".", help="project checkout, for the git commit column")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="fix a parameter for every point (repeatable)")
    parser.add_argument("--point", type=whole(0), default=None,
                        help="run only the point with this 0-based index (one task of a job array)")
    args = parser.parse_args(argv)
    # A rank that dies of a fatal signal (a fault in torch's or gloo's native code) writes every thread's
    # Python stack to its log first: otherwise only its exit signal says anything of where it was.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    reached(BEGUN)
    try:
        suite = load_suite(args.suite, parse_overrides(args.set), only=args.experiment)
        exp = suite.experiment(args.experiment)
        rank = env_rank() or 0
        with bounded(exp.launch.startup_s, rank, socket.gethostname()):
            _inject_during_point(_injected_fault(f"startup of {exp.name}", rank), rank, "start-up")
            ctx = RunContext.from_env(exp.launch.device, exp.launch.backend, exp.launch.timeout_s)
            _rank_log(ctx.rank)
            try:
                failed = run_experiment(ctx, suite.name, exp, Path(args.results), args.force, Path(args.root),
                                        args.point)
            finally:
                ctx.close()
    except ReproflowError as exc:
        print(f"reproflow: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception:
        traceback.print_exc()
        print(f"reproflow: rank {os.environ.get('RANK', '?')} failed; points finished before this are kept.",
              file=sys.stderr, flush=True)
        return 1
    return EXIT_POINTS_FAILED if failed else 0


def entry() -> NoReturn:
    """Run one rank (`python -m reproflow.worker`) and leave the process."""
    leave(main())


def leave(exit_code: int) -> NoReturn:
    """End a rank's process whose rows are on disk and whose process group is gone, without the
    interpreter's teardown, where a gloo thread left joinable now and then aborts a finished rank
    ("terminate called without an active exception", SIGABRT: under mpirun the job ends with exit code 6,
    under srun the task and its job fail). Under an MPI launcher a rank that failed (not one whose points
    failed, which every rank reports alike) aborts the job rather than finalize: MPI_Finalize waits for
    every rank, and the others may be waiting for this one (rank 0's store that could not listen, its
    port taken: the others retried connecting for 15 minutes while it sat in Finalize)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            if exit_code not in (0, EXIT_POINTS_FAILED) and MPI.COMM_WORLD.Get_size() > 1:
                MPI.COMM_WORLD.Abort(exit_code)
            MPI.Finalize()
        # MPICH sends its PMI "finalize" from a C exit handler: without it, mpirun's proxy may take the
        # closed connection for a crash and SIGKILL the ranks still finalizing (exit code 9, 1 run in 8).
        # libc's exit runs those handlers and still skips the interpreter's teardown.
        ctypes.CDLL(None).exit(exit_code)
    os._exit(exit_code)
