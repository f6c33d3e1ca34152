"""The intervals every verdict and comparison uses: samples from known distributions, covered as often
as the level says."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reproflow.reporting.intervals import paired_ratio_interval, ratio_interval, ratio_of_ratios_interval


def samples(rng: np.random.Generator, median: float, spread: float, n: int) -> np.ndarray:
    """Log-normal samples (iteration times are positive and skewed)."""
    return median * np.exp(rng.normal(0.0, spread, n))


def test_the_interval_covers_the_true_ratio_as_often_as_it_says() -> None:
    """Over many draws, the 95 % interval holds the true ratio about 95 % of the time (not 60, not 100)."""
    rng = np.random.default_rng(11)
    hits = 0
    trials = 400
    for _ in range(trials):
        _, (low, high) = ratio_interval(samples(rng, 120, 0.2, 6), samples(rng, 100, 0.1, 4))
        hits += low <= 1.2 <= high
    assert 0.91 <= hits / trials <= 0.98
    ratio, interval = ratio_interval([5.0], [2.0])  # neither side repeats: a point, no interval
    assert ratio == 2.5 and interval is None


def test_how_many_times_one_ratio_is_another() -> None:
    """A speed-up of 6 at many receivers against 1.05 at one: the ratio of the two ratios covers the true
    5.71 about 95 % of the time, and exact samples give it with no spread."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(300):
        many = (samples(rng, 600, 0.1, 10), samples(rng, 100, 0.2, 10))
        one = (samples(rng, 105, 0.1, 10), samples(rng, 100, 0.1, 10))
        _, (low, high) = ratio_of_ratios_interval(many, one)
        hits += low <= 6 / 1.05 <= high
    assert 0.91 <= hits / 300 <= 0.98
    assert ratio_of_ratios_interval(([6.0], [1.0]), ([2.0], [1.0])) == (pytest.approx(3.0), None)
    assert ratio_of_ratios_interval(([6.0, 6.0], [1.0]), ([2.0], [1.0, 1.0]))[1] == (pytest.approx(3.0),) * 2


def test_jobs_in_turns_take_the_interval_over_the_pairs() -> None:
    """Each job's speed drifts (a factor per job, alike for both configs of a pair): the pairs' interval
    covers the true ratio about 95 % of the time, where the samples of all jobs taken as one cover it
    far less."""
    rng = np.random.default_rng(7)
    paired = pooled = 0
    for _ in range(300):
        pairs = []
        for _ in range(4):
            drift = math.exp(rng.normal(0.0, 0.1))
            pairs.append((samples(rng, 110 * drift * math.exp(rng.normal(0.0, 0.05)), 0.05, 8),
                          samples(rng, 100 * drift * math.exp(rng.normal(0.0, 0.05)), 0.05, 8)))
        low, high = paired_ratio_interval(pairs)[1]
        paired += low <= 1.1 <= high
        low, high = ratio_interval(np.concatenate([a for a, _ in pairs]), np.concatenate([b for _, b in pairs]))[1]
        pooled += low <= 1.1 <= high
    assert 0.91 <= paired / 300 <= 0.98 and pooled / 300 < 0.88
    one = (samples(rng, 120, 0.2, 6), samples(rng, 100, 0.1, 4))
    assert paired_ratio_interval([one]) == ratio_interval(*one)
    ratio, interval = paired_ratio_interval([([2.0, 2.0], [1.0]), ([4.0], [2.0, 2.0])])
    assert ratio == pytest.approx(2.0) and interval == (pytest.approx(2.0), pytest.approx(2.0))


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="positive samples"):
        ratio_interval([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="positive samples"):
        ratio_interval([], [1.0])
    with pytest.raises(ValueError, match="at least one pair"):
        paired_ratio_interval([])
