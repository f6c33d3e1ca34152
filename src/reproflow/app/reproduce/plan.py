"""The reproduction plan as data: steps (reproflow command lines) and targets (the papers' figures and
tables with the steps that measure them), read from workflows/reproduce/targets.toml."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from reproflow.launch.job import Job
from reproflow.spec.documents import parse
from reproflow.spec.errors import ReproflowError

PLAN = Path("workflows") / "reproduce" / "targets.toml"


LOCAL, SLURM = "local", "slurm"
# Resubmissions of a job that failed for the infrastructure (a node lost, a rendezvous that did not form).
RETRIES = 2


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
    # Run here only on a host with this many CPU cores: its claim takes a core per rank, and on fewer the
    # ranks take turns, so what it times is the scheduler (on Slurm it always runs, on a GPU per rank).
    min_cpus: int = 0


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
        data = parse(path.read_text(encoding="utf-8"), toml=True)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReproflowError(f"cannot read the reproduction plan {path}: {exc}") from None
    steps: dict[str, Step] = {}
    for i, raw in enumerate(data.get("step", [])):
        try:
            step = Step(**raw)
        except TypeError as exc:
            raise ReproflowError(f"{path}: step {i + 1} ({raw.get('name', '?')}): {exc}; fields are name, command, "
                                 "minutes, points, reference, covered_by, more, samples, max_samples, more_minutes, "
                                 "sample_minutes, min_cpus.") from None
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


def step_argv(step: Step, folders: Folders, executor: str = LOCAL, job: Job | None = None) -> list[str]:
    """A step's reproflow arguments; submitted to Slurm as `job` says, `run` becomes `submit`, which waits
    for its jobs and resubmits those that failed for the infrastructure (RETRIES times at most, unless
    the job says), and the families' commands get --submit."""
    argv = folders.argv(step.command, step.reference)
    if executor != SLURM:
        return argv
    job = job or Job()
    if job.image and not job.mounts:  # the steps' folders, each where it is here (a family's step reads its logs)
        paths = [folders.results, folders.logs, folders.reports, *([folders.reference] if folders.reference else [])]
        job = replace(job, mounts=",".join(f"{p.resolve()}:{p.resolve()}" for p in paths))
    if argv[0] == "run":
        return ["submit", *argv[1:], *replace(job, retries=job.retries or RETRIES).argv()]
    return [*argv, "--submit", *job.argv()]
