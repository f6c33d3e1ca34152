"""One step of a reproduction: a reproflow child process, its output into the step's log, its progress
followed through the events it writes (reproflow.store.events), and the Slurm jobs it submitted."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproflow.app.reproduce.plan import Step
from reproflow.app.reproduce.progress import Progress, clock
from reproflow.spec.errors import NOT_APPLICABLE
from reproflow.store import events
from reproflow.store.events import read_events
from reproflow.store.results import result_files

TICK_S = 5.0  # seconds between a step's `tick` calls (a Slurm step's result files are counted)


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

    def record(self, name: str = "") -> dict[str, object]:
        """The step as the report's summary.json lists it (`name` instead of the step's, for a rerun)."""
        return {"name": name or self.step.name, "seconds": round(self.seconds, 1), "measured": self.measured,
                "skipped": self.skipped, "failed": self.failed, "not_applicable": self.not_applicable,
                "exit_code": self.code, "job_ids": list(self.job_ids)}


def _child_env(feed: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{events.ENV: str(feed.resolve())})
    env.setdefault("MPLBACKEND", "Agg")
    return env


def run_step(argv: list[str], log: Path, progress: Progress | None, limit_s: float = math.inf,
             tick: Callable[[], None] | None = None) -> tuple[int, list[str], dict[str, int]]:
    """Run `reproflow ARGV` as a child process, its output into `log`; returns (exit code, Slurm job ids
    it submitted, counts of measured / skipped / failed points), followed through the events the child
    and its ranks write (`<log>.events.jsonl`) and `tick`, called every few seconds (given for a Slurm
    step, whose job states and retries are shown as well). Past `limit_s` the child and its ranks are
    stopped (exit code 124); the points they finished are on disk already."""
    log.parent.mkdir(parents=True, exist_ok=True)
    counts = {"measured": 0, "skipped": 0, "failed": 0, "not_applicable": 0}
    job_ids: list[str] = []
    feed = log.with_name(log.name + ".events.jsonl")
    feed.unlink(missing_ok=True)
    offset = 0

    def follow() -> None:
        nonlocal offset
        found, offset = read_events(feed, offset)
        for event in found:
            _apply(event, counts, job_ids, progress)

    lines: queue.Queue[str | None] = queue.Queue()
    with log.open("w") as sink:
        sink.write(f"$ reproflow {shlex.join(argv)}\n")
        sink.flush()
        # Its own process group: stopping it stops the ranks it started too.
        child = subprocess.Popen([sys.executable, "-m", "reproflow.app.cli", *argv], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=_child_env(feed), bufsize=1,
                                 process_group=0)
        deadline = time.monotonic() + limit_s
        ticked = time.monotonic()
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
                    follow()
                    sink.write(f"reproflow reproduce: stopped at its limit of {limit_s / 60:.1f} min\n")
                    return 124, job_ids, counts
                try:
                    text = lines.get(timeout=1.0)
                except queue.Empty:
                    follow()
                    if tick and time.monotonic() >= ticked + TICK_S:
                        ticked = time.monotonic()
                        tick()
                    if progress:
                        progress.show()
                    continue
                if text is None:
                    break
                sink.write(text)
                sink.flush()
                follow()
        except KeyboardInterrupt:
            _stop_group(child)
            raise
        code = child.wait()
        follow()
        return code, job_ids, counts


def _stop_group(child: subprocess.Popen) -> None:
    """SIGTERM to the child's process group (it and its ranks), SIGKILL to what is left after 20 s; returns
    when no process of the group is left (a killed rank can take a moment to go on a loaded machine)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def _apply(event: dict[str, Any], counts: dict[str, int], job_ids: list[str], progress: Progress | None) -> None:
    """Update the counts and the display from one event of a step (reproflow.store.events)."""
    if event["event"] == "submitted":
        job_ids += event["job_ids"]
    elif event["event"] == "supervisor" and progress:  # a Slurm step's job states, attempts and retries
        progress.say("   " + event["text"])
    elif event["event"] == "experiment" and progress:
        progress.experiment = event["experiment"]
    elif event["event"] == "point":
        status = event["status"]
        if status != events.RUNNING:
            counts[status] += 1
        if progress:
            shown = {events.RUNNING: "", events.SKIPPED: " (done earlier, skipped)", events.FAILED: " (FAILED)",
                     events.NOT_APPLICABLE: f" ({NOT_APPLICABLE})"}.get(status, " (measured)")
            progress.point(f"{event['experiment']} [{event['index']}/{event['total']}] {event['label']}{shown}",
                           finished=status in (events.MEASURED, events.FAILED, events.NOT_APPLICABLE))


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
                     f"{clock(r.seconds):>9}  {r.log}")
    not_applicable = sum(r.not_applicable for r in results)
    lines.append(f"{len(results)} step(s) in {clock(seconds)}: {sum(r.measured for r in results)} points "
                 f"measured, {sum(r.skipped for r in results)} measured before, {sum(r.failed for r in results)} "
                 "failed" + (f", {not_applicable} {NOT_APPLICABLE} (why: the step logs)" if not_applicable else ""))
    return "\n".join(lines)


def tail(path: Path, n: int = 15) -> str:
    """The last `n` lines of a log."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
