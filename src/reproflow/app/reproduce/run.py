"""`reproflow reproduce` itself: the selected targets' steps, their drawing, the report and more samples."""

from __future__ import annotations

import functools
import os
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from reproflow.app.reproduce.estimate import estimate, record_timing
from reproflow.app.reproduce.plan import LOCAL, SLURM, Folders, Plan, step_argv
from reproflow.app.reproduce.progress import Progress, say
from reproflow.app.reproduce.resample import claim_line, resample
from reproflow.app.reproduce.steps import StepResult, run_step, summary, tail, wait_for_jobs
from reproflow.launch.job import Job
from reproflow.reporting.claims import read_looks, write_looks
from reproflow.spec.errors import ReproflowError
from reproflow.store.results import result_files


def reproduce(plan: Plan, only: Sequence[str], folders: Folders, executor: str = LOCAL, job: Job | None = None,
              out: Callable[[str], None] = say) -> int:
    """Run the selected targets' steps (skipping measured points), draw, and build the report page;
    returns 0 when every step succeeded."""
    from reproflow.reporting.report import build_reports

    targets, steps = plan.select(only)
    needy = [t.name for t in targets if t.needs_reference]
    if needy and folders.reference is None:
        raise ReproflowError(f"target {', '.join(needy)} reads the artifact's data from the reference folder: give "
                             "--reference (make REFERENCE=...) a folder holding aceso/profiled-time-eurosys and "
                             "aceso/reference-results (the artifact's profiler/profiled-time-eurosys and results/ref).")
    if executor == LOCAL and not only:
        # Named with --only, such a step runs anyway, for its figures.
        cores = len(os.sched_getaffinity(0))
        for step in (s for s in steps if s.min_cpus > cores):
            named = [t.name for t in targets if step.name in t.steps]
            out(f"reproflow reproduce: step {step.name} does not run here: its claim takes a CPU core per rank "
                f"({step.min_cpus}) and this machine has {cores}, so its claim is not applicable here (--only "
                f"{','.join(named)} runs it anyway; of the default plan, make {' '.join(named)})")
        steps = [s for s in steps if s.min_cpus <= cores]
    if executor == SLURM:
        _doctor(job or Job(), folders, out)
    rows = estimate(steps, folders, executor)
    progress = Progress(rows, out)
    more = f", then up to {plan.more_minutes:g} min of more samples for inconclusive claims" if (
        executor == LOCAL and plan.more_minutes) else ""
    out(f"reproflow reproduce: {len(targets)} target(s), {len(steps)} step(s), {executor}; about "
        f"{sum(r.minutes for r in rows):.1f} min expected{more}; step logs in {folders.logs / 'reproduce'}")
    done: list[StepResult] = []
    for i, row in enumerate(rows):
        step = row.step
        argv = step_argv(step, folders, executor, job)
        progress.begin(i)
        log = folders.logs / "reproduce" / f"{step.name}.log"
        progress.say(f"-- step {i + 1}/{len(rows)} {step.name}: reproflow {shlex.join(argv)}")
        start, before = time.monotonic(), len(result_files(folders.results))
        # On Slurm the points are written by the jobs: counted from the result files as they appear.
        tick = functools.partial(_count_new, progress, folders.results, before) if executor == SLURM else None
        code, job_ids, counts = run_step(argv, log, progress, tick=tick)
        result = StepResult(step, code, 0.0, counts["measured"], counts["skipped"], counts["failed"], job_ids, log,
                            counts["not_applicable"])
        if executor == SLURM:
            # `submit` waited for its jobs and retried them itself (step_argv); the families' --submit did not.
            if code == 0 and argv[0] != "submit":
                progress.say(f"   waiting for Slurm job(s) {', '.join(job_ids)}")
                unfinished = wait_for_jobs(job_ids, progress, folders.results, before)
                if unfinished:
                    result.code = 1
                    progress.say("   " + "; ".join(unfinished) + " (reproflow status explains why)")
            result.measured = len(result_files(folders.results)) - before
        result.seconds = time.monotonic() - start
        done.append(result)
        if result.code or result.failed:
            progress.say(f"   step {step.name} FAILED (exit {result.code}, {result.failed} failed point(s)); last "
                         f"lines of {log}:\n{tail(log)}")
        elif executor == LOCAL:
            record_timing(folders, result)
    draws = list(dict.fromkeys((d, t.reference) for t in targets for d in t.draw))
    for command, reference in draws:
        argv = folders.argv(command, reference)
        log = folders.logs / "reproduce" / f"draw-{argv[0]}-{argv[1]}.log"
        code, _, _ = run_step(argv, log, None)
        if code:
            progress.say(f"   drawing `reproflow {shlex.join(argv)}` failed (exit {code}); see {log}")
    progress.close()
    progress.say(summary(done, time.monotonic() - progress.start))
    # A claim that may get more samples is looked at twice: each look at a level that keeps the chance
    # of a wrong verdict over both at most LEVEL's (reporting.claims.level_for), recorded beside the rows
    # so that a report built from them later judges alike.
    looks = read_looks(folders.results)
    looks.update({t.family: 1 for t in targets})
    if executor == LOCAL and plan.more_minutes:
        looks.update({t.family: 2 for t in targets if any(plan.steps[s].more for s in t.steps)})
    write_looks(folders.results, looks)
    steps = [r.record() for r in done]
    try:
        written = build_reports(folders.results, folders.reports, steps=steps)
    except ReproflowError as exc:
        out(f"reproflow reproduce: no report: {exc}")
        return 1
    if [p.name for p in written] == ["summary.json"]:
        out(f"no points measured, so no report page: the steps' tables and figures are under {folders.reports}; "
            f"the run and its steps: {folders.reports / 'summary.json'}")
    else:
        out(f"report: {folders.reports / 'report.html'} (self-contained) and {folders.reports / 'report.md'}")
        out(f"claims ({folders.reports / 'claims.md'}): {claim_line(folders.reports / 'claims.csv')}")
    ok = all(r.code == 0 and not r.failed for r in done)
    if executor == LOCAL and plan.more_minutes:
        ok = resample(plan, targets, folders, out, steps) and ok
    return 0 if ok else 1


def _doctor(job: Job, folders: Folders, out: Callable[[str], None]) -> None:
    """`reproflow doctor` before anything is submitted: Slurm, the image and its runtime, the shared
    results folder; stops the reproduction with the fixes when something must be fixed."""
    from reproflow.launch.doctor import doctor

    for folder in (folders.results, folders.logs, folders.reports):  # Pyxis mounts them: they must exist
        folder.mkdir(parents=True, exist_ok=True)
    failed = doctor(job.image, folders.results, 2, job.runtime, out=out)
    if failed:
        raise ReproflowError(f"reproflow doctor found {failed} problem(s) to fix (above); nothing was "
                             "submitted. Fix them and run the same command again.")


def _count_new(progress: Progress, results: Path, before: int) -> None:
    progress.measured(len(result_files(results)) - before)
