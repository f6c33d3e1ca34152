"""The papers' claims: declared as data by each family, judged here, by one rule, from the rows alone.

A family declares each claim of its paper as a `ClaimSpec`: the statement, the paper's figure and where
it comes from, what is the system under test and what the baselines are, the design of the comparison
(`Design`), how a best-of-several is chosen (`Selection`), the threshold, what the setting must have for
the claim to be judged (`Requirement`s) and the make target that measures it. From its rows the family
then gives the evidence, one `Comparison` per case and baseline (the samples of both sides, never a
ratio), and `judge` computes every ratio, interval and verdict.

The rule, the same for every claim, with `level` the claim's confidence (95 %, stricter where the claim
may be looked at again with more samples: `level_for`) and m its comparisons (cases times baselines):

- a comparison *holds* when its `level` interval lies on the claim's side of the threshold, and is
  *below* (does not hold) when its interval at `1 - (1 - level) / m` lies wholly on the other side
  (Bonferroni over the m comparisons: with one rejection enough, Holm's procedure decides the same);
  otherwise it is *inconclusive*, as is a comparison of timings with one sample a side (no interval, so no
  error rate: only a BOUND's value is exact);
- the claim *holds* only when every comparison holds (an intersection-union test: its false *holds*
  rate is at most one comparison's, (1 - level) / 2); it *does not hold* when any comparison is below
  (false rate at most (1 - level) / 2 over all m); else it is *inconclusive*, *not measured* (a case
  declared and not measured) or *not compared* (a case whose two sides are one thing);
- a claim whose setting lacks what it requires is *not applicable here*, with the reason, its ratios
  still shown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pandas as pd

from reproflow.reporting.intervals import (
    LEVEL,
    current_level,
    paired_ratio_interval,
    ratio_interval,
    ratio_of_ratios_interval,
)
from reproflow.spec.errors import NOT_APPLICABLE
from reproflow.store.files import atomic_write, read_json_object

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
NOT_MEASURED, NOT_COMPARED = "not measured", "not compared"
STATUSES = (HOLDS, FAILS, INCONCLUSIVE, NOT_MEASURED, NOT_COMPARED, NOT_APPLICABLE)
# Why a sampled comparison without an interval is inconclusive, and the fix.
ONCE = "one sample a side: no interval to judge by (more samples: launch.repeats, or more rounds)"
LOOKS = "looks.json"  # in a results folder: the looks each family's claims may get (app.reproduce writes it)


class Design(StrEnum):
    """How a comparison's samples are laid out, which fixes its interval."""

    PAIRED = "paired rounds"  # jobs in turns, a pair per round, matched by round number: t over the pairs
    INDEPENDENT = "independent samples"  # both sides' samples from one job: Welch's t on the logarithms
    GROWTH = "ratio of two ratios"  # how many times one ratio of independent samples is another
    PREDICTION = "a value over measured rounds"  # one number (a prediction) over the rounds' medians
    BOUND = "a value against a bound"  # an exact number (an error, a deviation): no interval


class Selection(StrEnum):
    """How the baseline of a comparison with "the best of" several is chosen."""

    NONE = "one baseline, fixed in advance"
    EVERY = "judged against every candidate"
    SCREEN = "the fastest on screen samples, which the judgement does not use"


@dataclass(frozen=True)
class Requirement:
    """What a setting must have for the claim to be judged: `what` in words, and `missing`, from the
    claim's rows, why this setting lacks it ('' when it has it)."""

    what: str
    missing: Callable[[pd.DataFrame], str]


@dataclass(frozen=True, kw_only=True)
class ClaimSpec:
    """One claim of a paper, as data."""

    family: str
    statement: str
    ratio: str  # what the ratio is: numerator over denominator, per case
    paper: str  # the paper's figure and where it comes from
    system: str  # the system under test
    baselines: str  # what it is compared with
    design: Design
    selection: Selection = Selection.NONE
    at_least: float | None = None
    at_most: float | None = None
    requires: tuple[Requirement, ...] = ()
    target: str = ""  # the make target that measures it
    # What the cases are (every model, every 1-to-m case with 2+ receivers, ...), for the table of claims.
    cases: str = ""

    @property
    def threshold(self) -> str:
        """The condition on the ratio, e.g. '>= 1' or '>= 0.9 and <= 1.1'."""
        return " and ".join(f"{sign} {bound:g}" for sign, bound in ((">=", self.at_least), ("<=", self.at_most))
                            if bound is not None)


Samples = Sequence[float]


@dataclass(frozen=True)
class Comparison:
    """One case against one baseline, as its samples. `numerator` and `denominator` are by the design:
    PAIRED, per round number each round's samples; INDEPENDENT, the samples; GROWTH, a (numerator,
    denominator) pair of samples on each side; PREDICTION, the value and the rounds' medians; BOUND,
    the value alone."""

    case: str
    numerator: object
    denominator: object = ()
    baseline: str = ""  # which baseline, where a case has several
    same: str = ""  # why the two sides are one thing (then nothing was compared)
    note: str = ""  # shown beside the case's figures


@dataclass(frozen=True)
class Case:
    """A comparison judged: its ratio, its interval at the claim's level and at the corrected one, its
    verdict (HOLDS, FAILS, INCONCLUSIVE, NOT_COMPARED, NOT_MEASURED)."""

    label: str
    status: str
    ratio: float | None = None
    interval: tuple[float, float] | None = None
    corrected: tuple[float, float] | None = None
    note: str = ""

    def text(self) -> str:
        """'<label> <ratio> [<low>, <high>] <verdict>' for the claim's table."""
        if self.ratio is None:
            return f"{self.label}: {self.status}" + (f" ({self.note})" if self.note else "")
        span = f" [{self.interval[0]:.3g}, {self.interval[1]:.3g}]" if self.interval else ""
        return f"{self.label} {self.ratio:.3g}{span} {self.status}" + (f" ({self.note})" if self.note else "")


# Order in which a case decides its claim: the first status present is the claim's.
_DECIDES = (FAILS, INCONCLUSIVE, NOT_MEASURED, NOT_COMPARED, HOLDS)


@dataclass(frozen=True)
class Claim:
    """A claim judged on the rows: its declaration, every case's verdict, and the claim's."""

    spec: ClaimSpec
    cases: tuple[Case, ...] = ()
    level: float = LEVEL
    not_applicable: str = ""  # why the setting that measured it cannot judge the claim
    detail: str = ""  # where it was measured, or what is missing to measure it
    comparisons: int = 0  # m: the comparisons the correction for "does not hold" is over

    family = property(lambda self: self.spec.family)
    statement = property(lambda self: self.spec.statement)
    ratio = property(lambda self: self.spec.ratio)
    paper = property(lambda self: self.spec.paper)
    target = property(lambda self: self.spec.target)
    at_least = property(lambda self: self.spec.at_least)
    at_most = property(lambda self: self.spec.at_most)
    threshold = property(lambda self: self.spec.threshold)

    @property
    def status(self) -> str:
        """The claim's verdict: not applicable here, or the first of does not hold / inconclusive / not
        measured / not compared / holds among its cases (not measured without cases)."""
        if self.not_applicable:
            return NOT_APPLICABLE
        found = {c.status for c in self.cases}
        return next((s for s in _DECIDES if s in found), NOT_MEASURED)

    @property
    def deciding(self) -> Case | None:
        """The case that decides the verdict (of those with the deciding status, the nearest the
        threshold); None without a measured case."""
        measured = [c for c in self.cases if c.ratio is not None]
        if not measured:
            return None
        status = self.status if self.status in {c.status for c in measured} else None
        return min((c for c in measured if status is None or c.status == status), key=self._margin)

    def _margin(self, c: Case) -> float:
        low, high = c.interval or (c.ratio, c.ratio)
        assert low is not None and high is not None
        return min((low - self.at_least) if self.at_least is not None else math.inf,
                   (self.at_most - high) if self.at_most is not None else math.inf)

    @property
    def measured(self) -> float | None:
        """The deciding case's ratio."""
        case = self.deciding
        return case.ratio if case else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The deciding case's interval at the claim's level."""
        case = self.deciding
        return case.interval if case else None

    @property
    def samples_to_decide(self) -> float | None:
        """For an inconclusive claim: how many times its samples would narrow the deciding case's interval
        to the threshold it straddles, if the ratio and the spread stay (the half-width shrinks as one
        over the square root of the samples); inf when the ratio sits on the threshold. None otherwise."""
        case = self.deciding
        if self.status != INCONCLUSIVE or case is None or not case.interval or not case.ratio:
            return None
        low, high = case.interval
        half = (math.log(high) - math.log(low)) / 2
        straddled = [t for t in (self.at_least, self.at_most) if t is not None and low < t < high]
        distance = min(abs(math.log(case.ratio / t)) for t in straddled) if straddled else 0.0
        return (half / distance) ** 2 if distance > 0 else math.inf

    @property
    def error_control(self) -> str:
        """How the verdict's error rates are held, in words."""
        if self.spec.design is Design.BOUND:
            return "exact values against the bound"
        m = max(self.comparisons, 1)
        below = 1 - (1 - self.level) / m
        return (f"holds: every comparison's {self.level:.1%} interval; does not hold: one at {below:.2%}"
                + (f" (Bonferroni over {m})" if m > 1 else ""))

    def record(self) -> dict[str, object]:
        """The claim as one table row."""
        low, high = self.interval or (None, None)
        more = self.samples_to_decide
        return {"family": self.family, "claim": self.statement, "status": self.status, "ratio": self.ratio,
                "measured": self.measured, "low": low, "high": high,
                "level": f"{self.level:.1%}" if self.interval else "", "threshold": self.threshold,
                "samples to decide": "" if more is None else "never (on the threshold)" if math.isinf(more)
                else f"{max(more, 1.0):.1f}x",
                "paper": self.paper, "cases": "; ".join(c.text() for c in self.cases),
                "where": "; ".join(filter(None, (self.detail, self.not_applicable))),
                "design": self.spec.design.value, "selection": self.spec.selection.value,
                "error control": self.error_control, "make target": self.target}


def counts(claims: Sequence[Claim]) -> dict[str, int]:
    """How many claims have each status (holds, does not hold, ... not applicable here)."""
    return {s: sum(c.status == s for c in claims) for s in STATUSES}


def _ratio(design: Design, comparison: Comparison, level: float) -> tuple[float, tuple[float, float] | None, str]:
    """The comparison's ratio, its `level` interval and a note on samples left out (rounds one side lacks)."""
    num, den = comparison.numerator, comparison.denominator
    if design is Design.BOUND:
        return float(num), None, ""  # type: ignore[arg-type]
    if design is Design.PAIRED:
        assert isinstance(num, Mapping) and isinstance(den, Mapping)
        rounds = sorted(set(num) & set(den))
        lone = sorted(set(num) ^ set(den))
        if not rounds:
            raise ValueError("no round measured on both sides")
        ratio, interval = paired_ratio_interval([(num[r], den[r]) for r in rounds], level)
        return ratio, interval, (f"round(s) {', '.join(map(str, lone))} measured on one side only, left out"
                                 if lone else "")
    if design is Design.GROWTH:
        return (*ratio_of_ratios_interval(num, den, level), "")  # type: ignore[arg-type]
    if design is Design.PREDICTION:
        return (*ratio_interval([float(num)], den, level), "")  # type: ignore[arg-type]
    return (*ratio_interval(num, den, level), "")  # type: ignore[arg-type]


def verdict(spec: ClaimSpec, ratio: float, interval: tuple[float, float] | None,
             corrected: tuple[float, float] | None) -> str:
    """holds / does not hold / inconclusive of one comparison (see the module's rule). Only a BOUND's value
    is exact: a ratio of timings measured once a side has no interval, so no error rate, and decides
    nothing."""
    if interval is None and spec.design is not Design.BOUND:
        return INCONCLUSIVE
    low, high = interval or (ratio, ratio)
    if (spec.at_least is None or low >= spec.at_least) and (spec.at_most is None or high <= spec.at_most):
        return HOLDS
    low, high = corrected or (ratio, ratio)
    if (spec.at_least is not None and high < spec.at_least) or (spec.at_most is not None and low > spec.at_most):
        return FAILS
    return INCONCLUSIVE


def judge(spec: ClaimSpec, comparisons: Sequence[Comparison], rows: pd.DataFrame | None = None, *,
          missing: str = "", unmeasured: Sequence[str] = (), detail: str = "",
          level: float | None = None) -> Claim:
    """The claim's verdict from its comparisons (see the module's rule). `rows`: the rows the comparisons
    came from (where none, rows of the same setting), checked against the claim's requirements;
    `missing`: what to run where there is nothing to compare; `unmeasured`: cases the claim covers that
    were not measured; `detail`: where it was measured."""
    level = current_level() if level is None else level
    reason = "; ".join(filter(None, (r.missing(rows) for r in spec.requires))) if rows is not None and len(rows) else ""
    compared = [c for c in comparisons if not c.same]
    m = max(len(compared), 1)
    cases = []
    for c in comparisons:
        label = f"{c.case} against {c.baseline}" if c.baseline else c.case
        if c.same:
            cases.append(Case(label, NOT_COMPARED, note=c.same))
            continue
        try:
            ratio, interval, left_out = _ratio(spec.design, c, level)
            corrected = _ratio(spec.design, c, 1 - (1 - level) / m)[1] if m > 1 else interval
        except ValueError as exc:  # a side without samples: the case was not measured
            cases.append(Case(label, NOT_MEASURED, note=str(exc)))
            continue
        once = "" if interval or spec.design is Design.BOUND else ONCE
        note = "; ".join(filter(None, (c.note, left_out, once)))
        cases.append(Case(label, verdict(spec, ratio, interval, corrected), ratio, interval, corrected, note))
    cases += [Case(u, NOT_MEASURED) for u in unmeasured]
    if not cases:  # nothing measured; the rows given (of another step, on the same ranks) may say why
        return Claim(spec, level=level, not_applicable=reason, detail=missing)
    return Claim(spec, tuple(cases), level, reason, detail, len(compared))


def not_measured(spec: ClaimSpec, missing: str) -> Claim:
    """A claim whose rows are absent; `missing` says what to run to measure it."""
    return judge(spec, (), missing=missing)


def time_shared(rows: pd.DataFrame) -> str:
    """Why rows measured on CPUs with more ranks on a host than it has cores cannot judge a comparison of
    speeds ('' when every such run had a core per rank, or when the rows predate the `host_cpus`
    column): the ranks then take turns on the cores, and time-sharing, not the plan, sets the time."""
    if not {"device", "world_size", "nodelist", "host_cpus"} <= set(rows.columns):
        return ""
    cpu = rows[(rows["device"].astype(str) == "cpu") & (pd.to_numeric(rows["host_cpus"], errors="coerce") > 0)]
    cpu = cpu.reset_index(drop=True)  # rows concatenated from several files repeat index labels
    if cpu.empty:
        return ""
    per_host = pd.to_numeric(cpu["world_size"]) / cpu["nodelist"].astype(str).str.count(",").add(1)
    worst = (per_host / pd.to_numeric(cpu["host_cpus"])).idxmax()
    ranks, cores = per_host.loc[worst], int(cpu.loc[worst, "host_cpus"])
    if ranks <= cores:
        return ""
    return (f"{ranks:g} ranks shared {cores} CPU cores, so the ratio measures time-sharing; it takes a device "
            f"(GPU or core) per rank: a node with {ranks:g} GPUs, or {ranks:g} cores")


A_DEVICE_PER_RANK = Requirement("a device (GPU or CPU core) per rank", time_shared)


def level_for(looks: int) -> float:
    """The level of each look at a claim that may be looked at `looks` times (more samples after an
    inconclusive verdict): LEVEL's error spent evenly over the looks (Bonferroni), so that the chance of a
    wrong verdict over all of them is at most LEVEL's."""
    return 1 - (1 - LEVEL) / max(looks, 1)


def read_looks(results: Path) -> dict[str, int]:
    """Per family, the looks its claims may get, as the reproduction that measured `results` planned them
    (none recorded: one)."""
    found = read_json_object(results / LOOKS) or {}
    return {str(k): int(v) for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 1}


def write_looks(results: Path, looks: dict[str, int]) -> None:
    """Record the looks each family's claims may get, before the first: a report built later judges them
    at the same level."""
    results.mkdir(parents=True, exist_ok=True)
    atomic_write(results / LOOKS, json.dumps(looks, indent=2, sort_keys=True) + "\n")


METHOD = (f"each case's ratio of geometric means with its {LEVEL:.0%} t-interval (over paired rounds where jobs ran "
          "in turns, Welch's on log samples otherwise); holds when every case's interval clears the threshold, "
          "does not hold when one case's Bonferroni-corrected interval is below it, else inconclusive (so is a "
          "case of timings measured once a side: no interval)")


def spec_record(spec: ClaimSpec) -> dict[str, str]:
    """A declared claim as one row of the table of claims."""
    return {"family": spec.family, "claim": spec.statement, "system": spec.system, "baselines": spec.baselines,
            "cases": spec.cases, "design": spec.design.value, "selection": spec.selection.value,
            "threshold": spec.threshold,
            "error control": "exact values" if spec.design is Design.BOUND else
            "holds: every comparison at the claim's level; does not hold: Bonferroni over the comparisons",
            "applicable where": "; ".join(r.what for r in spec.requires) or "anywhere",
            "paper": spec.paper, "make target": spec.target}

