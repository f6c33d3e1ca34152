"""The live display of a reproduction: points done / total, the current point, elapsed time and the
time left (a tqdm bar on a terminal, a line per finished point in logs)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tqdm import tqdm

if TYPE_CHECKING:
    from reproflow.app.reproduce.estimate import Estimate


def say(text: str) -> None:
    # Flushed: progress read from a file or a CI log arrives as it happens, not when the run ends.
    print(text, flush=True)


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """The live display: a tqdm bar on a terminal (messages printed above it), a line per finished
    point elsewhere (logs, CI)."""

    def __init__(self, plan: list[Estimate], out: Callable[[str], None] = say, tty: bool | None = None) -> None:
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
        return (f"[{clock(time.monotonic() - self.start)} elapsed, ~{clock(self.left())} left] "
                f"{self.done}/{sum(self.totals)} points | step {self.index + 1}/{len(self.plan)} {step}: "
                f"{self.current or 'starting'}")

    def show(self, force: bool = False) -> None:
        if self.bar is None:
            if force:
                self.out(self.line())
            return
        self.bar.total, self.bar.n = sum(self.totals), self.done
        self.bar.set_description_str(f"[{clock(time.monotonic() - self.start)} elapsed, ~{clock(self.left())} "
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
