"""The papers' claims as relative checks that survive a change of hardware.

Each family's `analysis/<family>.py` may define `claims(frame, reports) -> list[Claim]`: from its
result rows (and the tables already written under `reports`) it states each claim of its paper as a
ratio with a threshold, so a claim holds or does not hold on whatever machine measured it, and is
"not measured" when the rows it needs are missing. The paper's own ratio sits beside the measured one.

Where the rows hold repeated samples (iterations, repeats), a claim carries a confidence interval of
its ratio (`ratio_interval`: a Welch t-interval on the logarithms, i.e. on the ratio of geometric
means) and its verdict is three-valued: it holds when the whole interval is on the claim's side of the
threshold, does not hold when the whole interval is on the other side, and is inconclusive when the
interval straddles it; a single noisy ratio would decide by chance. Jobs of two configurations run in
turns take the interval over the pairs (`paired_ratio_interval`): between jobs a shared machine's speed
drifts more than within one. A ratio of a single value to a
median (a predicted time over measured iterations) takes the median's distribution-free interval
(`median_ratio_interval`; over runs of one configuration in separate jobs, each with the value taken
beside it, the span of theirs: `replicated_ratio_interval`). A claim the hardware at hand cannot judge
(its mechanism needs a device per rank, say) is "not applicable here", with the ratio still shown and
the reason beside it. A comparison whose two sides are one thing (a search that returned the baseline
itself) is "not compared", never "holds": nothing was measured against anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

# scipy.special, not scipy.stats: the t quantile is stdtrit either way, and scipy.stats takes half a second to
# import, which every compare, history and report command would pay.
from scipy import special

from reproflow.spec.errors import NOT_APPLICABLE
from reproflow.store.files import atomic_write, read_json_object

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
NOT_MEASURED, NOT_COMPARED = "not measured", "not compared"
STATUSES = (HOLDS, FAILS, INCONCLUSIVE, NOT_MEASURED, NOT_COMPARED, NOT_APPLICABLE)
LEVEL = 0.95  # confidence of the intervals, over all the looks a claim may get
# The level the interval functions take when given none: LEVEL, or a stricter one for a claim that may be
# looked at again with more samples (`at_level`).
_LEVEL: ContextVar[float] = ContextVar("claims_level", default=LEVEL)
LOOKS = "looks.json"  # in a results folder: the looks each family's claims may get (app.reproduce writes it)


def current_level() -> float:
    """The confidence the interval functions use where they are given none."""
    return _LEVEL.get()


def level_for(looks: int) -> float:
    """The level of each look at a claim that may be looked at `looks` times (more samples after an
    inconclusive verdict): LEVEL's error spent evenly over the looks (Bonferroni), so that the chance of a
    wrong verdict over all of them is at most LEVEL's."""
    return 1 - (1 - LEVEL) / max(looks, 1)


@contextmanager
def at_level(level: float) -> Iterator[None]:
    """The interval functions' level within the block."""
    token = _LEVEL.set(level)
    try:
        yield
    finally:
        _LEVEL.reset(token)


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
METHOD = (f"{LEVEL:.0%} Welch t-interval on log samples (ratio of geometric means); for a value over a median, "
          "the median's order-statistic interval")


@dataclass(frozen=True)
class Claim:
    """One claim of a paper, checked on the measured rows.

    `measured` is the ratio the check compares with `at_least` and/or `at_most` (None: not measured);
    `paper` the same ratio in the paper or its artifact, with where it comes from; `detail` where the
    ratio was measured (cases, settings) or what is missing to measure it.
    """

    family: str
    statement: str
    ratio: str
    measured: float | None
    at_least: float | None = None
    at_most: float | None = None
    paper: str = ""
    detail: str = ""
    target: str = ""
    interval: tuple[float, float] | None = None  # `level` confidence interval of `measured`
    not_applicable: str = ""  # why the hardware that measured it cannot judge the claim
    # Why the two sides of the ratio are one and the same (the search returned the baseline's config):
    # then the claim compared nothing, whatever the ratio.
    same_on_both_sides: str = ""
    level: float = LEVEL  # of the interval: stricter than LEVEL where the claim may be looked at again

    @property
    def status(self) -> str:
        """holds / does not hold / inconclusive (only with an interval) / not measured / not compared /
        not applicable."""
        if self.not_applicable:
            return NOT_APPLICABLE
        if self.same_on_both_sides:
            return NOT_COMPARED
        if self.measured is None or math.isnan(self.measured):
            return NOT_MEASURED
        low, high = self.interval or (self.measured, self.measured)
        if (self.at_least is None or low >= self.at_least) and (self.at_most is None or high <= self.at_most):
            return HOLDS
        if (self.at_least is not None and high < self.at_least) or (self.at_most is not None and low > self.at_most):
            return FAILS
        return INCONCLUSIVE

    @property
    def threshold(self) -> str:
        """The condition on the ratio, e.g. '>= 1' or '<= 0.1'."""
        parts = []
        if self.at_least is not None:
            parts.append(f">= {self.at_least:g}")
        if self.at_most is not None:
            parts.append(f"<= {self.at_most:g}")
        return " and ".join(parts)

    @property
    def samples_to_decide(self) -> float | None:
        """For an inconclusive claim: how many times its samples would narrow the interval to the
        threshold it straddles, if the ratio and the spread stay (the half-width shrinks as one over
        the square root of the samples); inf when the ratio sits on the threshold. None otherwise."""
        if self.status != INCONCLUSIVE or not self.interval or not self.measured:
            return None
        low, high = self.interval
        half = (math.log(high) - math.log(low)) / 2
        straddled = [t for t in (self.at_least, self.at_most) if t is not None and low < t < high]
        distance = min(abs(math.log(self.measured / t)) for t in straddled) if straddled else 0.0
        return (half / distance) ** 2 if distance > 0 else math.inf

    def record(self) -> dict[str, object]:
        """The claim as one table row."""
        low, high = self.interval or (None, None)
        more = self.samples_to_decide
        return {"family": self.family, "claim": self.statement, "status": self.status, "ratio": self.ratio,
                "measured": self.measured, "low": low, "high": high,
                "level": f"{self.level:.1%}" if self.interval else "", "threshold": self.threshold,
                "samples to decide": "" if more is None else "never (on the threshold)" if math.isinf(more)
                else f"{max(more, 1.0):.1f}x",
                "paper": self.paper,
                "where": "; ".join(filter(None, (self.detail, self.not_applicable, self.same_on_both_sides))),
                "make target": self.target}


def not_measured(family: str, statement: str, ratio: str, missing: str, **kwargs: object) -> Claim:
    """A claim whose rows are absent; `missing` says what to run to measure it."""
    return Claim(family, statement, ratio, None, detail=missing, **kwargs)  # type: ignore[arg-type]


def counts(claims: list[Claim]) -> dict[str, int]:
    """How many claims have each status (holds, does not hold, ... not applicable here)."""
    return {s: sum(c.status == s for c in claims) for s in STATUSES}


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float],
                   level: float | None = None) -> tuple[float, tuple[float, float] | None]:
    """The ratio of the two samples' geometric means and its `level` confidence interval (Welch's t on
    the logarithms; a side with one value counts as exact). No interval where neither side repeats."""
    level = current_level() if level is None else level
    la, lb = _logs(numerator, denominator)
    ratio, low, high = log_ratio_intervals(*(np.array([v]) for v in (
        la.mean(), la.var(ddof=1) if len(la) > 1 else 0.0, len(la), lb.mean(),
        lb.var(ddof=1) if len(lb) > 1 else 0.0, len(lb))), level=level)
    return float(ratio[0]), (None if np.isnan(low[0]) else (float(low[0]), float(high[0])))


def log_ratio_intervals(mean_a: np.ndarray, var_a: np.ndarray, n_a: np.ndarray, mean_b: np.ndarray,
                        var_b: np.ndarray, n_b: np.ndarray,
                        level: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`ratio_interval` of many pairs of samples at once, from each side's count and the mean and
    variance of its logarithms (what the run catalog keeps): ratios a / b with the interval's ends,
    NaN where neither side repeats."""
    level = current_level() if level is None else level
    parts = [np.where(n > 1, v / np.maximum(n, 1), 0.0) for v, n in ((var_a, n_a), (var_b, n_b))]
    se2 = parts[0] + parts[1]
    denominators = sum(np.where(p > 0, p ** 2 / np.maximum(n - 1, 1), 0.0) for p, n in zip(parts, (n_a, n_b),
                                                                                           strict=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(denominators > 0, se2 ** 2 / denominators, 1.0)
    half = special.stdtrit(df, (1 + level) / 2) * np.sqrt(se2)
    ratio = np.exp(mean_a - mean_b)
    repeats = (n_a > 1) | (n_b > 1)
    return ratio, np.where(repeats, ratio * np.exp(-half), np.nan), np.where(repeats, ratio * np.exp(half), np.nan)


def pooled_ratio_interval(pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
                          level: float | None = None) -> tuple[float, tuple[float, float] | None]:
    """The geometric mean over cases of each case's ratio of geometric means (numerator samples over
    denominator samples), with its `level` confidence interval: Welch's t on the mean of the cases' log
    ratios, degrees of freedom by Welch-Satterthwaite over every sample. One case: `ratio_interval`."""
    level = current_level() if level is None else level
    if not pairs:
        raise ValueError("pooled_ratio_interval needs at least one case")
    diffs, parts = [], []
    for numerator, denominator in pairs:
        la, lb = _logs(numerator, denominator)
        diffs.append(la.mean() - lb.mean())
        parts += [(x.var(ddof=1) / len(x) / len(pairs) ** 2, len(x) - 1) for x in (la, lb) if len(x) > 1]
    return _welch(float(np.mean(diffs)), parts, level)


def ratio_of_ratios_interval(first: tuple[Sequence[float], Sequence[float]],
                             second: tuple[Sequence[float], Sequence[float]],
                             level: float | None = None) -> tuple[float, tuple[float, float] | None]:
    """How many times the first ratio of geometric means (numerator samples over denominator samples)
    is the second's, with its `level` confidence interval: Welch's t on the difference of the two log
    ratios, degrees of freedom by Welch-Satterthwaite over the four samples."""
    level = current_level() if level is None else level
    (a, b), (c, d) = _logs(*first), _logs(*second)
    parts = [(x.var(ddof=1) / len(x), len(x) - 1) for x in (a, b, c, d) if len(x) > 1]
    return _welch(float(a.mean() - b.mean() - c.mean() + d.mean()), parts, level)


def _welch(log_ratio: float, parts: Sequence[tuple[float, int]],
           level: float) -> tuple[float, tuple[float, float] | None]:
    """exp(log_ratio) and its t interval from the parts of its squared standard error, each with its
    degrees of freedom; no interval without parts."""
    ratio = math.exp(log_ratio)
    if not parts:
        return ratio, None
    se2 = sum(v for v, _ in parts)
    if se2 == 0:
        return ratio, (ratio, ratio)
    df = se2 ** 2 / sum(v ** 2 / d for v, d in parts if v > 0)
    half = float(special.stdtrit(df, (1 + level) / 2)) * math.sqrt(se2)
    return ratio, (ratio * math.exp(-half), ratio * math.exp(half))


def paired_ratio_interval(pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
                          level: float | None = None) -> tuple[float, tuple[float, float] | None]:
    """Jobs run in turns, a pair at a time: the geometric mean over pairs of each pair's ratio of
    geometric means (numerator's job over denominator's), with a t interval over the pairs' log ratios
    (n - 1 degrees of freedom). Its spread is the one between jobs, a machine's speed drifting over
    minutes, which no one job's samples show. One pair: `ratio_interval` of its samples."""
    level = current_level() if level is None else level
    if len(pairs) < 2:
        return pooled_ratio_interval(pairs, level)
    logs = [la.mean() - lb.mean() for la, lb in (_logs(n, d) for n, d in pairs)]
    ratio = float(np.exp(np.mean(logs)))
    half = float(special.stdtrit(len(logs) - 1, (1 + level) / 2)) * float(np.std(logs, ddof=1)) / math.sqrt(len(logs))
    return ratio, (ratio * math.exp(-half), ratio * math.exp(half))


def _logs(numerator: Sequence[float], denominator: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' logarithms; a ratio needs positive samples on both."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if not len(a) or not len(b) or (a <= 0).any() or (b <= 0).any():
        raise ValueError("ratio intervals need positive samples on both sides")
    return np.log(a), np.log(b)


def median_ratio_interval(value: float, samples: Sequence[float],
                          level: float | None = None) -> tuple[float, tuple[float, float] | None]:
    """`value` over the samples' median, with the `level` interval of the median from order statistics
    (distribution-free: one slow iteration moves neither end much). Its coverage is the binomial's, at
    least `level` from 6 samples on; with fewer, the interval is the samples' range. None for one sample."""
    level = current_level() if level is None else level
    x = np.sort(np.asarray(samples, dtype=float))
    if not len(x) or (x <= 0).any() or value <= 0:
        raise ValueError("median ratio intervals need a positive value and positive samples")
    ratio = float(value / np.median(x))
    if len(x) == 1:
        return ratio, None
    # The j-th and (n + 1 - j)-th smallest cover the median unless at most j - 1 samples fall on one side.
    from scipy import stats  # only here (see the import of scipy.special)

    j = max(int(stats.binom.ppf((1 - level) / 2, len(x), 0.5)), 1)
    return ratio, (float(value / x[len(x) - j]), float(value / x[j - 1]))


def replicated_ratio_interval(pairs: Sequence[tuple[float, Sequence[float]]],
                              level: float | None = None) -> tuple[float, tuple[float, float] | None]:
    """The first (value, run)'s value over its run's median, with an interval spanning every pair's
    `median_ratio_interval` (runs of one configuration in separate jobs, each with the value taken beside
    it): where the jobs ran at different speeds and the values did not follow, the interval says so, and
    no verdict is drawn from whichever job happened to be counted."""
    found = [median_ratio_interval(value, run, level) for value, run in pairs]
    ends = [e for ratio, interval in found for e in (ratio, *(interval or ()))]
    return found[0][0], (min(ends), max(ends)) if len(ends) > 1 else None


def time_shared(rows: pd.DataFrame) -> str:
    """Why rows measured on CPUs with more ranks on a host than it has cores cannot judge a speed-up that
    comes from more devices working at once ('' when every such run had a core per rank, or when the
    rows predate the `host_cpus` column)."""
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


def deciding(cases: Sequence[Claim], detail: str | None = None) -> Claim:
    """The case that decides a claim that must hold for every case (every model, every size): one that
    does not hold, else one that is inconclusive, else one that compared a thing with itself (the claim
    then does not hold for every case: it was not compared), else the one nearest the threshold; a case
    the hardware cannot judge only when no case can be judged. With `detail`, it replaces the case's own
    (every case's figures, say)."""
    rank = {FAILS: 0, INCONCLUSIVE: 1, NOT_COMPARED: 2, HOLDS: 3, NOT_APPLICABLE: 4}

    def margin(c: Claim) -> float:
        low, high = c.interval or (c.measured, c.measured)
        assert low is not None and high is not None
        return min((low - c.at_least) if c.at_least is not None else math.inf,
                   (c.at_most - high) if c.at_most is not None else math.inf)

    worst = min((c for c in cases if c.status in rank), key=lambda c: (rank[c.status], margin(c)))
    return worst if detail is None else replace(worst, detail=detail)
