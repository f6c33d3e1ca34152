"""Confidence intervals of ratios of measured times, the statistics every verdict and comparison uses.

A ratio of two samples of times is the ratio of their geometric means, with Welch's t-interval on the
logarithms (`ratio_interval`, many at once from summaries: `log_ratio_intervals`). Jobs of two
configurations run in turns take the interval over the pairs (`paired_ratio_interval`): between jobs a
shared machine's speed drifts more than within one. How many times one ratio is another
(`ratio_of_ratios_interval`): Welch's t on the difference of the log ratios. Every function takes its
confidence level, or the one `at_level` set (LEVEL when none).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

# scipy.special, not scipy.stats: the t quantile is stdtrit either way, and scipy.stats takes half a second to
# import, which every compare, history and report command would pay.
from scipy import special

LEVEL = 0.95  # two-sided confidence of the intervals, over all the looks a claim may get
# The level the interval functions take when given none: LEVEL, or a stricter one (`at_level`).
_LEVEL: ContextVar[float] = ContextVar("claims_level", default=LEVEL)


def current_level() -> float:
    """The confidence the interval functions use where they are given none."""
    return _LEVEL.get()


@contextmanager
def at_level(level: float) -> Iterator[None]:
    """The interval functions' level within the block."""
    token = _LEVEL.set(level)
    try:
        yield
    finally:
        _LEVEL.reset(token)


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
    if not pairs:
        raise ValueError("paired_ratio_interval needs at least one pair")
    if len(pairs) < 2:
        return ratio_interval(*pairs[0], level=level)
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
