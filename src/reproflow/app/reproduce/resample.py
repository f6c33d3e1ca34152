"""More samples for inconclusive claims: the steps to run again, with how many samples, within the
plan's budget of minutes."""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reproflow.app.reproduce.plan import Folders, Plan, Step, Target
from reproflow.app.reproduce.steps import StepResult, run_step, tail

if TYPE_CHECKING:
    from reproflow.reporting.claims import Claim


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


def resample(plan: Plan, targets: Sequence[Target], folders: Folders, out: Callable[[str], None],
             steps: Sequence[Mapping[str, object]] = ()) -> bool:
    """Measure more samples for the inconclusive claims the plan can decide within its budget, then
    check the claims and build the report again (its summary listing `steps` and these, as
    more-<step>); False when a step failed."""
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
        start = time.monotonic()
        code, job_ids, counts = run_step(argv, log, None, limit_s=2 * 60 * r.minutes)
        done = StepResult(r.step, code, time.monotonic() - start, counts["measured"], counts["skipped"],
                          counts["failed"], job_ids, log, counts["not_applicable"])
        steps = [*steps, done.record(f"more-{r.step.name}")]
        if code == 124:
            out(f"   more samples of {r.step.name} stopped at twice its estimate ({2 * r.minutes:.1f} min); the "
                f"points it finished are kept")
        elif code or counts["failed"]:
            ok = False
            out(f"   more samples of {r.step.name} FAILED (exit {code}); last lines of {log}:\n{tail(log)}")
    if chosen:
        build_reports(folders.results, folders.reports, steps=steps)
        out(f"claims after more samples ({folders.reports / 'claims.md'}): "
            f"{claim_line(folders.reports / 'claims.csv')}")
    return ok


def claim_line(path: Path) -> str:
    """'N holds, N does not hold, N inconclusive, N not measured' from the claims table the report wrote."""
    import pandas as pd

    from reproflow.reporting.claims import STATUSES

    status = pd.read_csv(path)["status"].value_counts() if path.is_file() else pd.Series(dtype=int)
    return ", ".join(f"{int(status.get(s, 0))} {s}" for s in STATUSES)
