"""Claim verdicts with confidence intervals: samples from known distributions give each verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reproflow.reporting.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    NOT_COMPARED,
    NOT_MEASURED,
    Claim,
    counts,
    deciding,
    median_ratio_interval,
    paired_ratio_interval,
    pooled_ratio_interval,
    ratio_interval,
    ratio_of_ratios_interval,
    replicated_ratio_interval,
)


def samples(rng: np.random.Generator, median: float, spread: float, n: int) -> np.ndarray:
    """Log-normal samples (iteration times are positive and skewed)."""
    return median * np.exp(rng.normal(0.0, spread, n))


def claim(num: np.ndarray, den: np.ndarray, **threshold: float) -> Claim:
    ratio, interval = ratio_interval(num, den)
    return Claim("f", "a is faster than b", "a / b", ratio, interval=interval, **threshold)


@pytest.mark.parametrize(("true_ratio", "spread", "n", "verdict"), [
    (1.30, 0.05, 10, HOLDS),          # clearly above 1
    (0.80, 0.05, 10, FAILS),          # clearly below 1
    (1.00, 0.10, 10, INCONCLUSIVE),   # on the threshold: no number of samples decides it
    (1.02, 0.30, 3, INCONCLUSIVE),    # just above 1; three noisy samples straddle 1 in 97 % of draws
])
def test_known_distributions_give_each_verdict(true_ratio: float, spread: float, n: int, verdict: str) -> None:
    rng = np.random.default_rng(3)
    c = claim(samples(rng, 100 * true_ratio, spread, n), samples(rng, 100, spread, n), at_least=1.0)
    assert c.status == verdict, (c.measured, c.interval)
    assert c.interval is not None and c.interval[0] <= c.measured <= c.interval[1]


def test_an_upper_bound_claim_and_an_exact_side() -> None:
    """'predicted within 10 % of measured': the prediction is one exact number, the measurements vary."""
    rng = np.random.default_rng(3)
    measured = samples(rng, 100, 0.02, 8)
    assert claim([104.0], measured, at_least=0.9, at_most=1.1).status == HOLDS
    assert claim([125.0], measured, at_least=0.9, at_most=1.1).status == FAILS
    assert claim([110.0], measured, at_least=0.9, at_most=1.1).status == INCONCLUSIVE
    ratio, interval = ratio_interval([5.0], [2.0])  # neither side repeats: a point, judged as before
    assert ratio == 2.5 and interval is None
    assert Claim("f", "s", "r", ratio, at_least=1.0).status == HOLDS


def test_the_interval_covers_the_true_ratio_as_often_as_it_says() -> None:
    """Over many draws, the 95 % interval holds the true ratio about 95 % of the time (not 60, not 100)."""
    rng = np.random.default_rng(11)
    hits = 0
    trials = 400
    for _ in range(trials):
        _, (low, high) = ratio_interval(samples(rng, 120, 0.2, 6), samples(rng, 100, 0.1, 4))
        hits += low <= 1.2 <= high
    assert 0.91 <= hits / trials <= 0.98


def test_a_ratio_pooled_over_cases() -> None:
    """Several cases (receiver counts, say), each a few noisy samples a side: the pooled geometric mean
    covers the true common ratio about 95 % of the time, and one case gives `ratio_interval`."""
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(300):
        pairs = [(samples(rng, 50 * k * 1.1, 0.15, 5), samples(rng, 50 * k, 0.15, 5)) for k in (1, 2, 4)]
        _, (low, high) = pooled_ratio_interval(pairs)
        hits += low <= 1.1 <= high
    assert 0.91 <= hits / 300 <= 0.98
    one = (samples(rng, 120, 0.2, 6), samples(rng, 100, 0.1, 4))
    assert pooled_ratio_interval([one]) == ratio_interval(*one)
    ratio, _ = pooled_ratio_interval([([2.0], [1.0]), ([1.0], [2.0])])  # 2x and 0.5x: a geometric mean of 1
    assert ratio == pytest.approx(1.0)


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
    covers the true ratio about 95 % of the time, where the samples pooled within jobs cover it far less."""
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
        low, high = pooled_ratio_interval(pairs)[1]
        pooled += low <= 1.1 <= high
    assert 0.91 <= paired / 300 <= 0.98 and pooled / 300 < 0.8
    one = (samples(rng, 120, 0.2, 6), samples(rng, 100, 0.1, 4))
    assert paired_ratio_interval([one]) == ratio_interval(*one)
    ratio, interval = paired_ratio_interval([([2.0, 2.0], [1.0]), ([4.0], [2.0, 2.0])])
    assert ratio == pytest.approx(2.0) and interval == (pytest.approx(2.0), pytest.approx(2.0))


def test_the_case_that_decides_a_claim_over_several() -> None:
    """Every model must hold: one that fails decides, else one that is inconclusive, else the nearest."""
    def case(r: float, low: float, high: float) -> Claim:
        return Claim("f", "s", "r", r, at_least=1.0, interval=(low, high))
    ok, close, unsure, bad = case(1.2, 1.1, 1.3), case(1.1, 1.05, 1.2), case(1.05, 0.9, 1.2), case(0.85, 0.8, 0.9)
    assert deciding([ok, close]) is close and deciding([ok, unsure, close]) is unsure
    assert deciding([ok, unsure, bad]) is bad and deciding([bad]).status == FAILS
    two_sided = [Claim("f", "s", "r", r, at_least=0.9, at_most=1.1) for r in (0.95, 1.08, 1.02)]
    assert deciding(two_sided).measured == 1.08
    assert counts([Claim("f", "s", "r", None)]) == {HOLDS: 0, FAILS: 0, INCONCLUSIVE: 0, NOT_MEASURED: 1,
                                                   NOT_COMPARED: 0, NOT_APPLICABLE: 0}


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="positive samples"):
        ratio_interval([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="positive samples"):
        ratio_interval([], [1.0])


def test_an_inconclusive_claim_says_how_many_more_samples_would_decide_it() -> None:
    """The interval narrows as one over the square root of the samples: drawing that many times the
    samples from the same distributions decides the claim about as often as not, or more."""
    rng = np.random.default_rng(5)
    few = claim(samples(rng, 106, 0.08, 6), samples(rng, 100, 0.08, 6), at_least=1.0)
    assert few.status == INCONCLUSIVE
    more = few.samples_to_decide
    assert more is not None and 1 < more < 100, more
    decided = sum(claim(samples(rng, 106, 0.08, math.ceil(6 * more * 2)), samples(rng, 100, 0.08,
                                                                                  math.ceil(6 * more * 2)),
                        at_least=1.0).status == HOLDS for _ in range(40))
    assert decided >= 20, decided
    assert few.record()["samples to decide"] == f"{more:.1f}x"
    on_it = Claim("f", "s", "r", 1.0, at_least=1.0, interval=(0.9, 1.1))
    assert on_it.samples_to_decide == math.inf and on_it.record()["samples to decide"] == "never (on the threshold)"
    assert claim([104.0], samples(rng, 100, 0.02, 8), at_least=0.9, at_most=1.1).samples_to_decide is None


def test_a_value_over_a_median_and_its_order_statistic_interval() -> None:
    """A prediction over measured iterations: the median's interval covers the true median at least 95 %
    of the time from 6 samples on, and a few very slow iterations move neither the ratio nor the verdict
    (they would move a geometric mean's)."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(400):
        _, (low, high) = median_ratio_interval(95.0, samples(rng, 100, 0.1, 20))
        hits += low <= 0.95 <= high
    assert 0.94 <= hits / 400 <= 0.995
    steady = samples(rng, 100, 0.02, 20)
    slow = np.concatenate([steady[:17], [180.0, 200.0, 220.0]])
    for times in (steady, slow):
        ratio, interval = median_ratio_interval(96.0, times)
        assert Claim("f", "s", "r", ratio, at_least=0.9, at_most=1.1, interval=interval).status == HOLDS
    _, geometric = ratio_interval([96.0], slow)
    assert Claim("f", "s", "r", _, at_least=0.9, at_most=1.1, interval=geometric).status != HOLDS
    assert median_ratio_interval(2.0, [4.0]) == (0.5, None)
    # One configuration run by two jobs at two speeds: the interval spans both jobs' intervals; with a
    # value taken beside each job that follows its speed, the two agree.
    fast, slow = [64.0, 66.0, 70.0], [96.0, 100.0, 104.0]
    assert replicated_ratio_interval([(66.0, fast), (66.0, slow)]) == (1.0, (66 / 104, 66 / 64))
    assert replicated_ratio_interval([(66.0, fast), (100.0, slow)]) == (1.0, (66 / 70, 100 / 96))
    assert replicated_ratio_interval([(66.0, fast)]) == median_ratio_interval(66.0, fast)
    assert replicated_ratio_interval([(2.0, [4.0])]) == (0.5, None)
    assert replicated_ratio_interval([(2.0, [4.0]), (2.0, [2.0])]) == (0.5, (0.5, 1.0))
    assert median_ratio_interval(2.0, [1.0, 2.0, 4.0]) == (1.0, (0.5, 2.0))  # three samples: their range
    with pytest.raises(ValueError, match="positive"):
        median_ratio_interval(1.0, [1.0, -1.0])


def test_a_claim_the_hardware_cannot_judge_is_not_applicable_here() -> None:
    """Its ratio is kept and shown, the reason is in the record, and it never decides a claim."""
    na = Claim("f", "tiles are faster", "r", 0.95, at_least=1.0, interval=(0.9, 1.0),
               not_applicable="5 ranks on 2 cores")
    assert na.status == NOT_APPLICABLE and na.samples_to_decide is None
    assert na.record()["status"] == NOT_APPLICABLE and "5 ranks on 2 cores" in na.record()["where"]
    ok = Claim("f", "s", "r", 1.2, at_least=1.0, interval=(1.1, 1.3))
    assert deciding([na, ok]) is ok and counts([na, ok])[NOT_APPLICABLE] == 1
    assert deciding([na]) is na  # no case can be judged: the claim cannot be either
    assert deciding([na, ok], detail="every case").detail == "every case"


def test_the_claims_as_a_forest_plot(tmp_path) -> None:
    """One row per claim, a figure only where some claim has a ratio."""
    from reproflow.reporting.figures import forest_plot

    missing = Claim("x", "not measured yet", "r", None, at_least=1.0)
    assert forest_plot([missing], tmp_path) == []
    claims = [Claim("x", "holds", "r", 1.3, at_least=1.0, interval=(1.1, 1.5)), missing,
              Claim("x", "fails", "r", 0.5, at_least=0.9, at_most=1.1, interval=(0.4, 0.6))]
    written = forest_plot(claims, tmp_path)
    assert [p.name for p in written] == ["claims_forest.png", "claims_forest.pdf"]
    assert all(p.stat().st_size > 0 for p in written)


def test_the_claims_picture_shows_ratios_on_a_linear_axis_and_tolerances_apart() -> None:
    """An error bound of 1e-9 and a growth of x548 beside ratios near 1 get a log panel of their own, so
    every ratio's interval and threshold lies inside a linear axis that can resolve them."""
    import matplotlib.pyplot as plt

    from reproflow.reporting.figures import claims_figure

    ratios = [Claim("x", "a", "r", 1.15, at_least=1.0, interval=(0.97, 1.36)),
              Claim("x", "b", "r", 2.2, at_least=1.0, interval=(1.9, 2.5)),
              Claim("x", "c", "r", 0.53, at_most=0.99)]
    error = Claim("x", "exact", "r", 2e-16, at_most=1e-9)
    growth = Claim("x", "grows", "r", 548.0, at_least=1.0)
    fig = claims_figure([ratios[0], error, *ratios[1:], growth])
    try:
        ratio_ax, error_ax = fig.axes
        assert ratio_ax.get_xscale() == "linear" and error_ax.get_xscale() == "log"
        low, high = ratio_ax.get_xlim()
        assert low <= 0.53 and 2.5 <= high < 4  # every interval inside, 1.0 not squeezed to a dot
        assert [t.get_text() for t in ratio_ax.get_yticklabels()] == ["x: c", "x: b", "x: a"]
        assert error_ax.get_xlim()[0] < 2e-16 < 1e-9 < 548 < error_ax.get_xlim()[1]
    finally:
        plt.close(fig)


def test_a_claim_that_may_be_looked_at_twice_is_judged_at_the_stricter_level(tmp_path) -> None:
    """A reproduction that may rerun a step for more samples records two looks for its family; every
    interval of that family's claims is then at level_for(2), in the report and in claims.csv alike."""
    from types import SimpleNamespace

    import pandas as pd

    from reproflow.reporting.claims import LEVEL, level_for, read_looks, write_looks
    from reproflow.reporting.report import _claims

    a, b = [1.0, 1.1, 0.9, 1.05], [0.5, 0.55, 0.45, 0.5]
    module = SimpleNamespace(claims=lambda rows, out: [
        Claim("f", "s", "r", *ratio_interval(a, b)[:1], at_least=1.0, interval=ratio_interval(a, b)[1])])
    (once,) = _claims(module, pd.DataFrame(), tmp_path, 1)
    (twice,) = _claims(module, pd.DataFrame(), tmp_path, 2)
    assert once.level == LEVEL and twice.level == level_for(2) == 0.975
    assert twice.measured == once.measured
    assert twice.interval[0] < once.interval[0] and twice.interval[1] > once.interval[1]
    assert twice.record()["level"] == "97.5%"
    assert read_looks(tmp_path) == {}
    write_looks(tmp_path, {"aceso": 2, "param_comms": 1})
    assert read_looks(tmp_path) == {"aceso": 2, "param_comms": 1}
