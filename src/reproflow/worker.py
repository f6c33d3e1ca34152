"""The per-rank program of every job: local runs, torchrun under sbatch, and submitit all start it.

    python -m reproflow.worker --suite FILE --experiment NAME --results DIR [--force]

Each rank joins the process group, runs the experiment's points in order, and rank 0 writes each
point's rows atomically as soon as the point is finished, so a job that dies later loses nothing
already measured. Points whose results exist are skipped unless --force.

Fault injection for reliability tests: REPROFLOW_INJECT_FAULT="<text>:<raise|exit>[:<rank>]" makes
points whose label contains <text> fail on that rank (all ranks when omitted); `raise` fails the
point and goes on, `exit` kills the rank as a crash would.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from reproflow.context import RunContext
from reproflow.errors import ParamError, PointFailed, ReproflowError
from reproflow.family import Family, Measurement, get_family
from reproflow.results import (
    Provenance,
    atomic_write,
    failure_path,
    file_sha256,
    git_commit,
    job_identity,
    machine_name,
    make_rows,
    point_path,
    rows_to_csv,
    write_failure,
)
from reproflow.suite import Experiment, Point, load_suite, parse_overrides

EXIT_POINTS_FAILED = 3


def _injected_fault(label: str, rank: int) -> str:
    spec = os.environ.get("REPROFLOW_INJECT_FAULT", "")
    if not spec:
        return ""
    parts = spec.split(":")
    text, mode = parts[0], parts[1] if len(parts) > 1 else "raise"
    target = int(parts[2]) if len(parts) > 2 and parts[2] else None
    if text in label and (target is None or target == rank):
        return mode
    return ""


def _device_name(ctx: RunContext) -> str:
    if ctx.device.type == "cuda":
        return torch.cuda.get_device_name(ctx.device)
    return machine_name()


def _provenance(ctx: RunContext, hosts: Sequence[object], root: Path) -> Provenance:
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
        image_sha256=file_sha256(image) if ctx.rank == 0 else "",
    )


def _preflight(fam: Family, point: Point, ctx: RunContext) -> str:
    """Checks every rank makes before the point's first collective; '' when the point may run."""
    try:
        if fam.check is not None:
            fam.check(point.params, ctx.world_size)
        if fam.runtime_check is not None:
            fam.runtime_check(point.params, ctx)
    except ParamError as exc:
        return f"invalid parameters for world size {ctx.world_size}: {exc}"
    if _injected_fault(point.label, ctx.rank) == "raise":
        return "injected fault (REPROFLOW_INJECT_FAULT)"
    return ""


def run_experiment(ctx: RunContext, suite_name: str, exp: Experiment, results: Path, force: bool,
                   root: Path, only: int | None = None) -> int:
    """Run the points of `exp` (only point index `only` when given) on this rank; return how many failed."""
    fam = get_family(exp.family)
    hosts = ctx.hosts()
    prov = _provenance(ctx, hosts, root)
    repeats = exp.launch.repeats
    keys = [p.key(ctx.world_size, ctx.backend, ctx.device.type, repeats) for p in exp.points]
    paths = [point_path(results, suite_name, exp.name, k) for k in keys]
    # Rank 0 alone decides what is done, so ranks cannot disagree on a shared filesystem.
    chosen = [only is None or i == only for i in range(len(paths))]
    todo = [c and (force or not p.exists()) for c, p in zip(chosen, paths, strict=True)]
    box: list[object] = [todo]
    dist.broadcast_object_list(box, src=0)
    todo = box[0]  # type: ignore[assignment]
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
            ctx.log(f"{tag}: done earlier, skipped ({path.name})")
            continue
        message = ctx.failures(_preflight(fam, point, ctx))
        if message:
            failed += 1
            if ctx.rank == 0:
                write_failure(path, point.label, message, prov.job_id)
            ctx.log(f"{tag}: FAILED before running: {message}")
            continue
        if _injected_fault(point.label, ctx.rank) == "exit":
            print(f"rank {ctx.rank}: injected crash at {point.label}", file=sys.stderr, flush=True)
            os._exit(17)
        start = time.perf_counter()
        measured: list[tuple[int, Measurement]] = []
        try:
            for repeat in range(repeats):
                measured.extend((repeat, m) for m in fam.run(ctx, point.params))
        except PointFailed as exc:
            failed += 1
            if ctx.rank == 0:
                write_failure(path, point.label, str(exc), prov.job_id)
            ctx.log(f"{tag}: FAILED: {exc}")
            continue
        if ctx.rank == 0:
            head = {"suite": suite_name, "experiment": exp.name, "family": fam.name, "point": point.label}
            atomic_write(path, rows_to_csv(make_rows(head, point.params, measured, prov)))
            failure_path(path).unlink(missing_ok=True)
            print(fam.table(point.params, [m for r, m in measured if r == repeats - 1]), flush=True)
        ctx.log(f"{tag}: {len(measured)} rows in {time.perf_counter() - start:.1f} s -> {path}")
    return failed


def _rank_log(rank: int) -> None:
    """Under mpirun (one launcher for all ranks), ranks other than 0 write to REPROFLOW_RANK_LOGS/rank<N>.log."""
    logs = os.environ.get("REPROFLOW_RANK_LOGS")
    if not logs or rank == 0:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(Path(logs) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
    parser.add_argument("--point", type=int, default=None,
                        help="run only the point with this 0-based index (one task of a job array)")
    args = parser.parse_args(argv)
    try:
        suite = load_suite(args.suite, parse_overrides(args.set))
        exp = suite.experiment(args.experiment)
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


if __name__ == "__main__":
    exit_code = main()
    if "mpi4py.MPI" not in sys.modules:
        # Every row is on disk and the process group is gone: leave without the interpreter's teardown,
        # where a gloo thread left joinable now and then aborts a finished rank ("terminate called
        # without an active exception", exit -6). MPI ranks must still pass MPI_Finalize at exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    sys.exit(exit_code)
