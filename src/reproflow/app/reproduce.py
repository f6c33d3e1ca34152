"""`reproflow reproduce`: every family's small suites, one command, here or on Slurm, then the report.

The plan is data (`workflows/reproduce/targets.toml`): steps are reproflow command lines, targets are
the papers' figures and tables with the steps that measure them. Each step runs as a child process
whose output goes to `<logs>/reproduce/<step>.log`; its progress lines (the workers' `[i/n] point`
lines) drive one live display: points done / total, the current point, elapsed time and an estimate
of the time left, from this machine's earlier runs or the plan's estimates. Steps skip what is
measured already, so a rerun runs only what is missing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import tomllib
from tqdm import tqdm

from reproflow.launch.status import experiment_status
from reproflow.spec.errors import NOT_APPLICABLE, ReproflowError
from reproflow.spec.suite import named_suite
from reproflow.store.results import atomic_write, result_files

if TYPE_CHECKING:
    from reproflow.reporting.claims import Claim


def _say(text: str) -> None:
    # Flushed: progress read from a file or a CI log arrives as it happens, not when the run ends.
    print(text, flush=True)

PLAN = Path("workflows") / "reproduce" / "targets.toml"
LOCAL, SLURM = "local", "slurm"
# The workers' own progress lines (reproflow.rank.worker).
_HEADER = re.compile(r"suite \S+ / experiment (\S+) \(\w+\): \d+ of \d+ points")
_POINT = re.compile(rf"^\[(\d+)/(\d+)\] (.*): (running|done earlier, skipped|FAILED|{NOT_APPLICABLE}|"
                    r"\d+ rows in [\d.]+ s)")
_JOB_IDS = re.compile(r"^job ids: ([\d_,]+)$")


@dataclass(frozen=True)
class Step:
    """One reproflow command line that measures something."""

    name: str
    command: str
    minutes: float
    points: int = 0
    reference: str = ""
    covered_by: str = ""
    # More samples for a claim its target checks: `more` is appended to the command, {samples} the new
    # value of the step's sample count (`samples` now, at most `max_samples`); it costs `more_minutes` plus
    # `sample_minutes` per sample (startups, then every point's extra samples).
    more: str = ""
    samples: int = 0
    max_samples: int = 0
    more_minutes: float = 0.0
    sample_minutes: float = 0.0


@dataclass(frozen=True)
class Target:
    """One paper figure or table: the steps that measure it and the commands that draw it."""

    name: str
    family: str
    title: str
    steps: tuple[str, ...]
    draw: tuple[str, ...] = ()
    reference: str = ""
    # Run only when named (make <target>): too long for the whole reproduction.
    default: bool = True
    # Its steps read data from the reference folder (e.g. the artifact's profiled database).
    needs_reference: bool = False


@dataclass(frozen=True)
class Plan:
    """Every step and target of the reproduction."""

    steps: dict[str, Step]
    targets: dict[str, Target]
    more_minutes: float = 0.0  # the time a run may spend on more samples for inconclusive claims

    def select(self, only: Sequence[str]) -> tuple[list[Target], list[Step]]:
        """The targets named in `only` (every default one when empty) and the steps they need, in plan
        order; a step covered by another selected step (Aceso's search by its full run) is left out."""
        unknown = [t for t in only if t not in self.targets]
        if unknown:
            raise ReproflowError(f"--only {', '.join(unknown)}: no such target. Targets: {', '.join(self.targets)}.")
        targets = [t for name, t in self.targets.items() if name in only or (not only and t.default)]
        wanted = {s for t in targets for s in t.steps}
        steps = [s for name, s in self.steps.items() if name in wanted and s.covered_by not in wanted]
        return targets, steps


def load_plan(path: Path) -> Plan:
    """Read and check the plan; errors name the entry and the field."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ReproflowError(f"cannot read the reproduction plan {path}: {exc}") from None
    steps: dict[str, Step] = {}
    for i, raw in enumerate(data.get("step", [])):
        try:
            step = Step(**raw)
        except TypeError as exc:
            raise ReproflowError(f"{path}: step {i + 1} ({raw.get('name', '?')}): {exc}; fields are name, command, "
                                 "minutes, points, reference, covered_by, more, samples, max_samples, more_minutes, "
                                 "sample_minutes.") from None
        if step.more and not (step.samples and step.max_samples >= step.samples and "{samples}" in step.more):
            raise ReproflowError(f"{path}: step {step.name}: `more` (arguments added to its command) needs "
                                 "{samples}, and samples <= max_samples (the sample count now and the most a run "
                                 "may take).")
        steps[step.name] = step
    targets: dict[str, Target] = {}
    for i, raw in enumerate(data.get("target", [])):
        try:
            target = Target(**{**raw, "steps": tuple(raw.get("steps", ())), "draw": tuple(raw.get("draw", ()))})
        except TypeError as exc:
            raise ReproflowError(f"{path}: target {i + 1} ({raw.get('name', '?')}): {exc}; fields are name, "
                                 "family, title, steps, draw, reference, default, needs_reference.") from None
        missing = [s for s in target.steps if s not in steps]
        if missing:
            raise ReproflowError(f"{path}: target {target.name}: steps {', '.join(missing)} are not defined "
                                 "([[step]] name = ...).")
        targets[target.name] = target
    for step in steps.values():
        if step.covered_by and step.covered_by not in steps:
            raise ReproflowError(f"{path}: step {step.name}: covered_by = {step.covered_by!r} names no step.")
    budget = data.get("more_minutes", 0.0)
    if not isinstance(budget, int | float) or budget < 0:
        raise ReproflowError(f"{path}: more_minutes = {budget!r}: give the minutes a run may spend on more samples "
                             "for inconclusive claims (0: none).")
    return Plan(steps, targets, float(budget))


@dataclass(frozen=True)
class Folders:
    """Where a reproduction reads and writes; `reference` holds the papers' published results (optional)."""

    results: Path
    reports: Path
    logs: Path
    reference: Path | None = None

    def argv(self, command: str, reference: str) -> list[str]:
        """A plan command line as arguments, folders filled in; `reference` appended when there is one."""
        line = command + (f" {reference}" if reference and self.reference else "")
        return [a.format(results=self.results, reports=self.reports, logs=self.logs, reference=self.reference)
                for a in shlex.split(line)]

    @property
    def timings(self) -> Path:
        return self.logs / "reproduce" / "timings.json"


def step_argv(step: Step, folders: Folders, executor: str = LOCAL, image: str = "", mounts: str = "") -> list[str]:
    """A step's reproflow arguments; submitted to Slurm, `run` becomes `submit` and the families'
    commands get --submit."""
    argv = folders.argv(step.command, step.reference)
    if executor != SLURM:
        return argv
    extra = [*(["--image", image] if image else []), *(["--mounts", mounts] if mounts else [])]
    if argv[0] == "run":
        return ["submit", *argv[1:], *extra]
    return [*argv, "--submit", *extra]


def suite_points(argv: list[str], results: Path) -> tuple[int, int] | None:
    """(points, already measured) of a `run SUITE -e ...` step (measured: the point files `reproflow
    status` counts), or None for other commands."""
    if argv[0] != "run":
        return None
    suite = named_suite(argv[1])
    chosen = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    measured = {(row.suite, row.experiment): row.done for row in experiment_status(results)}
    total = done = 0
    for exp in suite.select(chosen):
        total += len(exp.points)
        done += min(len(exp.points), measured.get((suite.name, exp.name), 0))
    return total, done


def read_timings(path: Path) -> dict[str, dict[str, float]]:
    """Measured minutes and points of earlier complete runs of each step on this machine."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Estimate:
    """What one step will cost: points, minutes and node-hours."""

    step: Step
    nodes: int
    points: int
    measured: int | None
    minutes: float
    source: str

    @property
    def node_hours(self) -> float:
        return self.nodes * self.minutes / 60


def estimate(steps: list[Step], folders: Folders, executor: str = LOCAL) -> list[Estimate]:
    """Per step: nodes (1, this machine, when local), points (and how many are measured already),
    expected minutes and node-hours. Minutes come from this machine's earlier complete runs, else the
    plan's estimate; steps whose points are all measured cost nothing."""
    timings = read_timings(folders.timings)
    out = []
    for step in steps:
        argv = folders.argv(step.command, step.reference)
        known = suite_points(argv, folders.results)
        points, measured = known if known else (step.points, None)
        nodes = max(e.launch.nodes for e in named_suite(argv[1]).experiments) if known and executor == SLURM else 1
        past = timings.get(step.name)
        minutes, source = (past["minutes"], "measured here") if past else (step.minutes, "plan (2 cores)")
        if measured is not None and points:
            minutes *= (points - measured) / points
        out.append(Estimate(step, nodes, points, measured, minutes, source))
    return out


def format_estimate(rows: list[Estimate], executor: str) -> str:
    """The estimate as a table, with totals."""
    unit = "node-hours" if executor == SLURM else "hours here"
    lines = [f"{'step':<20} {'nodes':>5} {'points':>7} {'measured':>8} {'minutes':>8} {unit:>11}  source"]
    for r in rows:
        measured = "?" if r.measured is None else str(r.measured)
        lines.append(f"{r.step.name:<20} {r.nodes:>5} {r.points:>7} {measured:>8} {r.minutes:>8.1f} "
                     f"{r.node_hours:>11.3f}  {r.source}")
    lines.append(f"{'total':<20} {'':>5} {sum(r.points for r in rows):>7} {'':>8} {sum(r.minutes for r in rows):>8.1f} "
                 f"{sum(r.node_hours for r in rows):>11.3f}")
    if executor == SLURM:
        lines.append("node-hours = the nodes a step's suite asks for x its expected minutes (runs on the cluster's "
                     "hardware may differ from the 2-core estimate until they have run there once)")
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass
class StepResult:
    """How one step went."""

    step: Step
    code: int = 0
    seconds: float = 0.0
    measured: int = 0
    skipped: int = 0
    failed: int = 0
    job_ids: list[str] = field(default_factory=list)
    log: Path | None = None
    not_applicable: int = 0  # points this hardware cannot measure as their source does (said in the log)


class Progress:
    """The live display: a tqdm bar on a terminal (messages printed above it), a line per finished
    point elsewhere (logs, CI)."""

    def __init__(self, plan: list[Estimate], out: Callable[[str], None] = _say, tty: bool | None = None) -> None:
        self.plan, self.out = plan, out
        self.start = time.monotonic()
        self.index, self.done, self.current, self.experiment = 0, 0, "", ""
        self.step_start, self.step_done = self.start, 0
        self.totals = [e.points - (e.measured or 0) for e in plan]
        # tqdm's own rate and ETA are left out: the time left is ours (the plan's figures, then the pace).
        self.bar = tqdm(total=sum(self.totals), file=sys.stdout, dynamic_ncols=True, mininterval=0.5,
                        bar_format="{desc} {bar:16} {n_fmt}/{total_fmt} points{postfix}") if (
            sys.stdout.isatty() if tty is None else tty) else None

    def begin(self, index: int) -> None:
        self.index, self.step_start, self.step_done, self.current = index, time.monotonic(), 0, ""
        self.experiment = ""

    def measured(self, count: int) -> None:
        """Points written so far by the current step's Slurm jobs (counted on the shared results folder)."""
        if count > self.step_done:
            self.done += count - self.step_done
            self.step_done = count
            self.current = f"{count} point(s) written by its jobs"
            self.show(force=True)

    def point(self, label: str, finished: bool) -> None:
        self.current = label
        if finished:
            self.done += 1
            self.step_done += 1
            if self.step_done > self.totals[self.index]:  # a generated suite announced more than the plan said
                self.totals[self.index] = self.step_done
        self.show(force=finished)

    def left(self) -> float:
        """Seconds left: the plan's figure for the steps not started, and for the current one a blend of
        the plan's figure and the step's own pace, weighted by the fraction of its points done."""
        rest = sum(e.minutes * 60 for e in self.plan[self.index + 1:])
        expected = self.plan[self.index].minutes * 60
        spent = time.monotonic() - self.step_start
        total = self.totals[self.index]
        fraction = self.step_done / total if total else min(1.0, spent / expected) if expected else 1.0
        if fraction >= 1:
            return rest
        planned = expected * (1 - fraction)
        if not self.step_done:
            return rest + planned
        # A step's first points are not its pace (CFP's first point is a whole analysis pass): trust the
        # pace only as far as the step has gone, so the estimate moves smoothly instead of jumping.
        paced = spent / fraction * (1 - fraction)
        return rest + (1 - fraction) * planned + fraction * paced

    def line(self) -> str:
        step = self.plan[self.index].step.name
        return (f"[{_clock(time.monotonic() - self.start)} elapsed, ~{_clock(self.left())} left] "
                f"{self.done}/{sum(self.totals)} points | step {self.index + 1}/{len(self.plan)} {step}: "
                f"{self.current or 'starting'}")

    def show(self, force: bool = False) -> None:
        if self.bar is None:
            if force:
                self.out(self.line())
            return
        self.bar.total, self.bar.n = sum(self.totals), self.done
        self.bar.set_description_str(f"[{_clock(time.monotonic() - self.start)} elapsed, ~{_clock(self.left())} "
                                     "left]", refresh=False)
        self.bar.set_postfix_str(f"step {self.index + 1}/{len(self.plan)} {self.plan[self.index].step.name}: "
                                 f"{self.current or 'starting'}", refresh=False)
        self.bar.refresh()

    def say(self, text: str) -> None:
        """A message on its own line (above the bar, which is redrawn after it)."""
        if self.bar is None:
            self.out(text)
        else:
            self.bar.write(text, file=sys.stdout)

    def close(self) -> None:
        """Leave the bar where it ends."""
        if self.bar is not None:
            self.show()
            self.bar.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("MPLBACKEND", "Agg")
    return env


def run_step(argv: list[str], log: Path, progress: Progress | None,
             limit_s: float = math.inf) -> tuple[int, list[str], dict[str, int]]:
    """Run `reproflow ARGV` as a child process, its output into `log`; returns (exit code, Slurm job ids
    it printed, counts of measured / skipped / failed points). Past `limit_s` the child and its ranks
    are stopped (exit code 124); the points they finished are on disk already."""
    log.parent.mkdir(parents=True, exist_ok=True)
    counts = {"measured": 0, "skipped": 0, "failed": 0, "not_applicable": 0}
    job_ids: list[str] = []
    lines: queue.Queue[str | None] = queue.Queue()
    with log.open("w") as sink:
        sink.write(f"$ reproflow {shlex.join(argv)}\n")
        sink.flush()
        # Its own process group: stopping it stops the ranks it started too.
        child = subprocess.Popen([sys.executable, "-m", "reproflow.app.cli", *argv], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=_child_env(), bufsize=1,
                                 process_group=0)
        deadline = time.monotonic() + limit_s
        assert child.stdout is not None

        def pump() -> None:
            for text in child.stdout:  # type: ignore[union-attr]
                lines.put(text)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        try:
            while True:
                if time.monotonic() > deadline:
                    _stop_group(child)
                    sink.write(f"reproflow reproduce: stopped at its limit of {limit_s / 60:.1f} min\n")
                    return 124, job_ids, counts
                try:
                    text = lines.get(timeout=1.0)
                except queue.Empty:
                    if progress:
                        progress.show()
                    continue
                if text is None:
                    break
                sink.write(text)
                sink.flush()
                _track(text.rstrip("\n"), counts, job_ids, progress)
        except KeyboardInterrupt:
            _stop_group(child)
            raise
        return child.wait(), job_ids, counts


def _stop_group(child: subprocess.Popen) -> None:
    """SIGTERM to the child's process group (it and its ranks), SIGKILL to what is left after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _track(text: str, counts: dict[str, int], job_ids: list[str], progress: Progress | None) -> None:
    """Update the counts and the display from one output line of a step."""
    found = _JOB_IDS.match(text)
    if found:
        job_ids += [j for j in found[1].split(",") if j]
        return
    header = _HEADER.search(text)
    if header and progress:
        progress.experiment = header[1]
        return
    point = _POINT.match(text)
    if not point:
        return
    label, what = point[3], point[4]
    kind = ("skipped" if what.startswith("done earlier") else "failed" if what == "FAILED"
            else "not_applicable" if what == NOT_APPLICABLE else "measured" if what != "running" else "")
    if kind:
        counts[kind] += 1
    if progress:
        progress.point(f"{progress.experiment} [{point[1]}/{point[2]}] {label}" + ("" if what == "running" else
                                                                                  f" ({what})"),
                       finished=kind in ("measured", "failed", "not_applicable"))


def record_timing(folders: Folders, result: StepResult) -> None:
    """Keep a step's duration for later estimates when it measured every point itself."""
    if result.code or result.failed or result.skipped or not result.measured:
        return
    timings = read_timings(folders.timings)
    timings[result.step.name] = {"minutes": round(result.seconds / 60, 2), "points": result.measured}
    folders.timings.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(folders.timings, json.dumps(timings, indent=1, sort_keys=True) + "\n")


def wait_for_jobs(job_ids: list[str], progress: Progress, results: Path, before: int) -> list[str]:
    """Wait for submitted jobs, counting the result files they write into the progress display;
    returns a line per job that did not complete."""
    from reproflow.launch import retry

    if not job_ids:
        return []
    jobs = retry.wait_for(job_ids, progress.say, poll_s=5.0,
                          tick=lambda: progress.measured(len(result_files(results)) - before))
    return [f"job {j}: {job.state}" for j, job in jobs.items() if job.state != "COMPLETED"]


def summary(results: list[StepResult], seconds: float) -> str:
    """The end-of-run table: each step's outcome, points and time."""
    lines = [f"{'step':<20} {'outcome':<8} {'measured':>8} {'skipped':>7} {'failed':>6} {'time':>9}  log"]
    for r in results:
        outcome = "ok" if r.code == 0 and not r.failed else "FAILED"
        lines.append(f"{r.step.name:<20} {outcome:<8} {r.measured:>8} {r.skipped:>7} {r.failed:>6} "
                     f"{_clock(r.seconds):>9}  {r.log}")
    not_applicable = sum(r.not_applicable for r in results)
    lines.append(f"{len(results)} step(s) in {_clock(seconds)}: {sum(r.measured for r in results)} points "
                 f"measured, {sum(r.skipped for r in results)} measured before, {sum(r.failed for r in results)} "
                 "failed" + (f", {not_applicable} {NOT_APPLICABLE} (why: the step logs)" if not_applicable else ""))
    return "\n".join(lines)


def tail(path: Path, n: int = 15) -> str:
    """The last `n` lines of a log."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def reproduce(plan: Plan, only: Sequence[str], folders: Folders, executor: str = LOCAL, image: str = "",
              mounts: str = "", out: Callable[[str], None] = _say) -> int:
    """Run the selected targets' steps (skipping measured points), draw, and build the report page;
    returns 0 when every step succeeded."""
    from reproflow.reporting.report import build_reports

    targets, steps = plan.select(only)
    needy = [t.name for t in targets if t.needs_reference]
    if needy and folders.reference is None:
        raise ReproflowError(f"target {', '.join(needy)} reads the artifact's data from the reference folder: give "
                             "--reference (make REFERENCE=...) a folder holding aceso/profiled-time-eurosys and "
                             "aceso/reference-results (the artifact's profiler/profiled-time-eurosys and results/ref).")
    rows = estimate(steps, folders, executor)
    progress = Progress(rows, out)
    more = f", then up to {plan.more_minutes:g} min of more samples for inconclusive claims" if (
        executor == LOCAL and plan.more_minutes) else ""
    out(f"reproflow reproduce: {len(targets)} target(s), {len(steps)} step(s), {executor}; about "
        f"{sum(r.minutes for r in rows):.1f} min expected{more}; step logs in {folders.logs / 'reproduce'}")
    done: list[StepResult] = []
    for i, row in enumerate(rows):
        step = row.step
        argv = step_argv(step, folders, executor, image, mounts)
        progress.begin(i)
        log = folders.logs / "reproduce" / f"{step.name}.log"
        progress.say(f"-- step {i + 1}/{len(rows)} {step.name}: reproflow {shlex.join(argv)}")
        start, before = time.monotonic(), len(result_files(folders.results))
        code, job_ids, counts = run_step(argv, log, progress)
        result = StepResult(step, code, 0.0, counts["measured"], counts["skipped"], counts["failed"], job_ids, log,
                            counts["not_applicable"])
        if executor == SLURM and code == 0:
            progress.say(f"   waiting for Slurm job(s) {', '.join(job_ids)}")
            unfinished = wait_for_jobs(job_ids, progress, folders.results, before)
            result.measured = len(result_files(folders.results)) - before
            if unfinished:
                result.code = 1
                progress.say("   " + "; ".join(unfinished) + " (reproflow status explains why)")
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
    try:
        build_reports(folders.results, folders.reports)
    except ReproflowError as exc:
        out(f"reproflow reproduce: no report: {exc}")
        return 1
    out(f"report: {folders.reports / 'report.html'} (self-contained) and {folders.reports / 'report.md'}")
    out(f"claims ({folders.reports / 'claims.md'}): {claim_line(folders.reports / 'claims.csv')}")
    ok = all(r.code == 0 and not r.failed for r in done)
    if executor == LOCAL and plan.more_minutes:
        ok = resample(plan, targets, folders, out) and ok
    return 0 if ok else 1


# Samples beyond what the interval's arithmetic asks for: the spread it uses is itself an estimate.
MARGIN = 1.2


@dataclass(frozen=True)
class Resample:
    """A step run again with more samples, for an inconclusive claim."""

    step: Step
    claim: str
    samples: int
    minutes: float


def plan_resamples(plan: Plan, targets: Sequence[Target], claims: Sequence[Claim]) -> tuple[list[Resample], list[str]]:
    """For each inconclusive claim of the selected targets, the steps that measure more of its samples,
    with enough to decide it if its ratio and spread stay, while the plan's budget for more samples
    lasts; and a line for each inconclusive claim left as it is, saying why."""
    chosen: list[Resample] = []
    notes: list[str] = []
    left = plan.more_minutes
    selected = {t.name for t in targets}
    for claim in claims:
        factor = claim.samples_to_decide
        if factor is None or claim.target not in selected:
            continue
        what = f"{claim.family}: {claim.statement}"
        steps = [plan.steps[name] for name in plan.targets[claim.target].steps if plan.steps[name].more]
        if not steps:
            notes.append(f"{what}: inconclusive; no step of target {claim.target} measures more samples")
            continue
        if math.isinf(factor):
            notes.append(f"{what}: inconclusive on its threshold: no number of samples decides it")
            continue
        wanted = [(step, math.ceil(step.samples * max(factor, 1.0) * MARGIN)) for step in steps]
        if any(n > step.max_samples for step, n in wanted):
            notes.append(f"{what}: inconclusive; it needs about {factor:.1f}x its samples, more than the plan allows ("
                         + ", ".join(f"{step.name}: at most {step.max_samples}" for step, _ in wanted) + ")")
            continue
        cost = [step.more_minutes + step.sample_minutes * n for step, n in wanted]
        if sum(cost) > left:
            notes.append(f"{what}: inconclusive; {factor:.1f}x its samples would take about {sum(cost):.1f} min, "
                         f"beyond what is left of the plan's {plan.more_minutes:g} min for more samples")
            continue
        left -= sum(cost)
        chosen += [Resample(step, what, n, minutes) for (step, n), minutes in zip(wanted, cost, strict=True)]
    return chosen, notes


def resample(plan: Plan, targets: Sequence[Target], folders: Folders, out: Callable[[str], None]) -> bool:
    """Measure more samples for the inconclusive claims the plan can decide within its budget, then
    check the claims and build the report again; False when a step failed."""
    from reproflow.reporting.report import build_reports, check_claims

    chosen, notes = plan_resamples(plan, targets, check_claims(folders.results, folders.reports)[0])
    for note in notes:
        out(f"   {note}")
    ok = True
    for r in chosen:
        argv = folders.argv(f"{r.step.command} {r.step.more.replace('{samples}', str(r.samples))}", r.step.reference)
        log = folders.logs / "reproduce" / f"more-{r.step.name}.log"
        out(f"-- more samples for {r.claim}: {r.step.name} with {r.samples} (was {r.step.samples}; about "
            f"{r.minutes:.1f} min of the plan's {plan.more_minutes:g}): reproflow {shlex.join(argv)}")
        # Twice the estimate at most: an estimate gone wrong costs the budget once more, not the run.
        code, _, counts = run_step(argv, log, None, limit_s=2 * 60 * r.minutes)
        if code == 124:
            out(f"   more samples of {r.step.name} stopped at twice its estimate ({2 * r.minutes:.1f} min); the "
                f"points it finished are kept")
        elif code or counts["failed"]:
            ok = False
            out(f"   more samples of {r.step.name} FAILED (exit {code}); last lines of {log}:\n{tail(log)}")
    if chosen:
        build_reports(folders.results, folders.reports)
        out(f"claims after more samples ({folders.reports / 'claims.md'}): "
            f"{claim_line(folders.reports / 'claims.csv')}")
    return ok


def claim_line(path: Path) -> str:
    """'N holds, N does not hold, N inconclusive, N not measured' from the claims table the report wrote."""
    import pandas as pd

    from reproflow.reporting.claims import STATUSES

    status = pd.read_csv(path)["status"].value_counts() if path.is_file() else pd.Series(dtype=int)
    return ", ".join(f"{int(status.get(s, 0))} {s}" for s in STATUSES)
