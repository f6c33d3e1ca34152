"""The claims' one judge: samples from known distributions give each verdict, rounds pair by their
number, "does not hold" is corrected for the comparisons, and the error rates of every design hold in
simulation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import one_case_claim
from hypothesis import given, settings
from hypothesis import strategies as st

from reproflow.reporting.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    NOT_COMPARED,
    NOT_MEASURED,
    ONCE,
    Case,
    Claim,
    ClaimSpec,
    Comparison,
    Design,
    Requirement,
    counts,
    judge,
    verdict,
)


def samples(rng: np.random.Generator, median: float, spread: float, n: int) -> np.ndarray:
    """Log-normal samples (iteration times are positive and skewed)."""
    return median * np.exp(rng.normal(0.0, spread, n))


def spec(design: Design = Design.INDEPENDENT, **kwargs: object) -> ClaimSpec:
    fields: dict[str, object] = {"family": "f", "statement": "a is faster than b", "ratio": "b / a", "paper": "",
                                 "system": "a", "baselines": "b", "design": design, "at_least": 1.0}
    return ClaimSpec(**{**fields, **kwargs})  # type: ignore[arg-type]


def one_case(measured: float | None, interval: tuple[float, float] | None = None, **kwargs: object) -> Claim:
    return one_case_claim(measured, interval, **kwargs)


@pytest.mark.parametrize(("true_ratio", "spread", "n", "expected"), [
    (1.30, 0.05, 10, HOLDS),          # clearly above 1
    (0.80, 0.05, 10, FAILS),          # clearly below 1
    (1.00, 0.10, 10, INCONCLUSIVE),   # on the threshold: no number of samples decides it
    (1.02, 0.30, 3, INCONCLUSIVE),    # just above 1; three noisy samples straddle 1 in 97 % of draws
])
def test_known_distributions_give_each_verdict(true_ratio: float, spread: float, n: int, expected: str) -> None:
    rng = np.random.default_rng(3)
    c = judge(spec(), [Comparison("c", samples(rng, 100 * true_ratio, spread, n), samples(rng, 100, spread, n))])
    assert c.status == expected, (c.measured, c.interval)
    assert c.interval is not None and c.interval[0] <= c.measured <= c.interval[1]


def test_a_prediction_within_bounds_and_a_value_against_a_bound() -> None:
    """'predicted within 10 % of measured': one exact number over the rounds' medians; an error against
    a bound is exact."""
    rng = np.random.default_rng(3)
    medians = samples(rng, 100, 0.02, 8)
    within = spec(Design.PREDICTION, at_least=0.9, at_most=1.1)
    assert judge(within, [Comparison("c", 104.0, medians)]).status == HOLDS
    assert judge(within, [Comparison("c", 125.0, medians)]).status == FAILS
    assert judge(within, [Comparison("c", 110.0, medians)]).status == INCONCLUSIVE
    exact = spec(Design.BOUND, at_least=None, at_most=1e-9)
    assert judge(exact, [Comparison("a", 1e-13), Comparison("b", 2e-13)]).status == HOLDS
    worst = judge(exact, [Comparison("a", 1e-13), Comparison("b", 1e-6)])
    assert worst.status == FAILS and worst.measured == 1e-6 and worst.error_control == "exact values against the bound"


def test_rounds_pair_by_their_number_and_a_missing_round_is_said() -> None:
    """The machine runs at another speed each round, alike for both sides: paired by round number the
    ratio is the true 1.2 exactly; one round missing on one side is left out and said, where pairing by
    position would set round 2's baseline against round 3's system."""
    speed = {1: 1.0, 2: 3.0, 3: 0.5, 4: 2.0}
    baseline = {r: [120.0 * s] * 3 for r, s in speed.items()}
    system = {r: [100.0 * s] * 3 for r, s in speed.items() if r != 2}
    c = judge(spec(Design.PAIRED), [Comparison("gpt", baseline, system)])
    (case,) = c.cases
    assert case.ratio == pytest.approx(1.2) and case.interval == (pytest.approx(1.2), pytest.approx(1.2))
    assert case.note == "round(s) 2 measured on one side only, left out" and c.status == HOLDS
    lone = judge(spec(Design.PAIRED), [Comparison("t5", baseline, {})])
    assert lone.status == NOT_MEASURED and lone.cases[0].note == "no round measured on both sides"


def test_a_claim_over_several_cases_and_baselines() -> None:
    """Holds only where every comparison holds; does not hold where one is below; a declared case not
    measured keeps it from holding; a case whose sides are one thing compared nothing."""
    def c(r: float, lo: float, hi: float, label: str = "c") -> Case:
        return Case(label, verdict(spec(), r, (lo, hi), (lo, hi)), r, (lo, hi), (lo, hi))

    ok, close, unsure, bad = c(1.2, 1.1, 1.3), c(1.1, 1.05, 1.2), c(1.05, 0.9, 1.2), c(0.85, 0.8, 0.9)
    same = Case("itself", NOT_COMPARED, note="the baseline itself")
    missing = Case("t5", NOT_MEASURED)
    assert Claim(spec(), (ok, close)).status == HOLDS and Claim(spec(), (ok, close)).deciding is close
    assert Claim(spec(), (ok, unsure, close)).deciding is unsure
    assert Claim(spec(), (ok, unsure, bad, missing)).status == FAILS
    assert Claim(spec(), (ok, unsure, missing)).status == INCONCLUSIVE
    assert Claim(spec(), (ok, missing)).status == NOT_MEASURED and Claim(spec(), (ok, missing)).measured == 1.2
    assert Claim(spec(), (ok, same)).status == NOT_COMPARED and Claim(spec(), (same,)).measured is None
    record = Claim(spec(), (ok, missing)).record()
    assert record["cases"] == "c 1.2 [1.1, 1.3] holds; t5: not measured"
    assert {"design", "selection", "error control"} <= set(record)
    assert counts([Claim(spec())]) == {HOLDS: 0, FAILS: 0, INCONCLUSIVE: 0, NOT_MEASURED: 1, NOT_COMPARED: 0,
                                       NOT_APPLICABLE: 0}
    judged = judge(spec(), [Comparison("gpt", [1.2, 1.21, 1.19], [1.0, 1.01, 0.99], baseline="ddp"),
                            Comparison("gpt", (), baseline="alpa", same="alpa's plan is CFP's")],
                   unmeasured=["moe"])
    assert [x.label for x in judged.cases] == ["gpt against ddp", "gpt against alpa", "moe"]
    assert judged.comparisons == 1 and judged.status == NOT_MEASURED


def test_does_not_hold_is_corrected_for_the_comparisons() -> None:
    """One case clearly below its 95 % interval but not below its interval at 1 - 0.05 / 4: alone it does
    not hold; among four comparisons it is inconclusive (Bonferroni), while holds needs nothing more."""
    rng = np.random.default_rng(2)
    for _ in range(200):
        low, high = samples(rng, 92, 0.08, 8), samples(rng, 100, 0.08, 8)
        alone = judge(spec(), [Comparison("c", low, high)])
        if alone.status == FAILS and alone.cases[0].interval[1] > 0.97:
            break
    else:
        raise AssertionError("no draw just below 1")
    fine = [Comparison(f"ok{i}", [150.0, 151.0, 149.0], [100.0, 101.0, 99.0]) for i in range(3)]
    among = judge(spec(), [Comparison("c", low, high), *fine])
    assert among.comparisons == 4 and among.status == INCONCLUSIVE
    case = among.cases[0]
    assert case.corrected[0] < case.interval[0] and case.corrected[1] > 1 > case.interval[1]
    assert "Bonferroni over 4" in among.error_control and "98.75%" in among.error_control


def test_an_inconclusive_claim_says_how_many_more_samples_would_decide_it() -> None:
    """The interval narrows as one over the square root of the samples: drawing that many times the
    samples from the same distributions decides the claim about as often as not, or more."""
    rng = np.random.default_rng(5)

    def drawn(n: int) -> Claim:
        return judge(spec(), [Comparison("c", samples(rng, 106, 0.08, n), samples(rng, 100, 0.08, n))])

    few = drawn(6)
    assert few.status == INCONCLUSIVE
    more = few.samples_to_decide
    assert more is not None and 1 < more < 100, more
    decided = sum(drawn(math.ceil(6 * more * 2)).status == HOLDS for _ in range(40))
    assert decided >= 20, decided
    assert few.record()["samples to decide"] == f"{more:.1f}x"
    on_it = one_case(1.0, (0.9, 1.1))
    assert on_it.samples_to_decide == math.inf and on_it.record()["samples to decide"] == "never (on the threshold)"


def test_a_claim_the_setting_cannot_judge_is_not_applicable_here() -> None:
    """The requirement is checked on the claim's rows, however the step was started: the ratios are kept
    and shown, the reason is in the record; with nothing measured, rows of the same setting say why."""
    shared = Requirement("a core per rank", lambda rows: "4 ranks on 2 cores" if (rows["ranks"] > 2).any() else "")
    s = spec(requires=(shared,))
    rows = pd.DataFrame({"ranks": [4]})
    na = judge(s, [Comparison("c", [1.3, 1.31], [1.0, 1.01])], rows)
    assert na.status == NOT_APPLICABLE and na.measured == pytest.approx(1.3, rel=0.01) and na.samples_to_decide is None
    assert "4 ranks on 2 cores" in na.record()["where"]
    assert judge(s, [Comparison("c", [1.3, 1.31], [1.0, 1.01])], pd.DataFrame({"ranks": [2]})).status == HOLDS
    untimed = judge(s, (), rows, missing="not timed")
    assert untimed.status == NOT_APPLICABLE and untimed.record()["where"] == "not timed; 4 ranks on 2 cores"
    assert judge(s, (), missing="not timed").status == NOT_MEASURED


def test_the_claims_as_a_forest_plot(tmp_path) -> None:
    """One row per claim, a figure only where some claim has a ratio."""
    from reproflow.reporting.figures import forest_plot

    missing = one_case(None)
    assert forest_plot([missing], tmp_path) == []
    claims = [one_case(1.3, (1.1, 1.5)), missing, one_case(0.5, (0.4, 0.6), at_least=0.9, at_most=1.1)]
    written = forest_plot(claims, tmp_path)
    assert [p.name for p in written] == ["claims_forest.png", "claims_forest.pdf"]
    assert all(p.stat().st_size > 0 for p in written)


def test_the_claims_picture_shows_ratios_on_a_linear_axis_and_tolerances_apart() -> None:
    """An error bound of 1e-9 and a growth of x548 beside ratios near 1 get a log panel of their own, so
    every ratio's interval and threshold lies inside a linear axis that can resolve them."""
    import matplotlib.pyplot as plt

    from reproflow.reporting.figures import claims_figure

    ratios = [one_case(1.15, (0.97, 1.36), statement="a"), one_case(2.2, (1.9, 2.5), statement="b"),
              one_case(0.53, None, statement="c", at_least=None, at_most=0.99)]
    error = one_case(2e-16, None, statement="exact", at_least=None, at_most=1e-9)
    growth = one_case(548.0, None, statement="grows")
    fig = claims_figure([ratios[0], error, *ratios[1:], growth])
    try:
        ratio_ax, error_ax = fig.axes
        assert ratio_ax.get_xscale() == "linear" and error_ax.get_xscale() == "log"
        low, high = ratio_ax.get_xlim()
        assert low <= 0.53 and 2.5 <= high < 4  # every interval inside, 1.0 not squeezed to a dot
        assert [t.get_text() for t in ratio_ax.get_yticklabels()] == ["f: c", "f: b", "f: a"]
        assert error_ax.get_xlim()[0] < 2e-16 < 1e-9 < 548 < error_ax.get_xlim()[1]
    finally:
        plt.close(fig)


def test_the_claims_picture_shades_where_a_claim_holds_on_measured_rows_only() -> None:
    """A row not measured holds nowhere: its bound is drawn, no band; a measured row with a bound is shaded."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from reproflow.reporting.figures import claims_figure

    fig = claims_figure([one_case(1.2, (1.1, 1.3), statement="m", at_least=1.05),
                         one_case(None, statement="n", at_least=1.05), one_case(0.9, (0.8, 1.0), statement="o")])
    try:
        (ax,) = fig.axes
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        rows = sorted(round(float(b.get_paths()[0].vertices[:, 1].mean())) for b in bands)
        assert rows == [0, 2]  # the rows from the bottom: "o" and "m"; "n", not measured, has none
    finally:
        plt.close(fig)


def test_a_claim_that_may_be_looked_at_twice_is_judged_at_the_stricter_level(tmp_path) -> None:
    """A reproduction that may rerun a step for more samples records two looks for its family; every
    interval of that family's claims is then at level_for(2), in the report and in claims.csv alike."""
    from types import SimpleNamespace

    from reproflow.reporting.claims import level_for, read_looks, write_looks
    from reproflow.reporting.intervals import LEVEL
    from reproflow.reporting.report import _claims

    a, b = [1.0, 1.1, 0.9, 1.05], [0.5, 0.55, 0.45, 0.5]
    module = SimpleNamespace(claims=lambda rows, out: [judge(spec(), [Comparison("c", a, b)])])
    (once,) = _claims(module, pd.DataFrame(), tmp_path, 1)
    (twice,) = _claims(module, pd.DataFrame(), tmp_path, 2)
    assert once.level == LEVEL and twice.level == level_for(2) == 0.975
    assert twice.measured == once.measured
    assert twice.interval[0] < once.interval[0] and twice.interval[1] > once.interval[1]
    assert twice.record()["level"] == "97.5%"
    assert read_looks(tmp_path) == {}
    write_looks(tmp_path, {"aceso": 2, "param_comms": 1})
    assert read_looks(tmp_path) == {"aceso": 2, "param_comms": 1}


def test_every_design_keeps_its_error_rates_in_simulation() -> None:
    """Under the null (every side equally fast), each design as the judge runs it reaches a false holds
    and a false does-not-hold at most at the one-sided 2.5 % (within three standard errors of 1500
    draws); the two ways verdicts used to be drawn (the fastest baseline picked on the judging samples,
    the worst of several cases without a correction) exceed it, so the bound can fail."""
    from reproflow.reporting.simulation import SCENARIOS, rates

    repeats = 1500
    bound = 0.025 + 3 * math.sqrt(0.025 * 0.975 / repeats)
    for scenario in SCENARIOS:
        found = rates(scenario, 1.0, repeats, seed=3)
        if scenario.name.startswith("not used"):
            assert found[FAILS] > bound, (scenario.name, found)
        else:
            assert found[HOLDS] <= bound and found[FAILS] <= bound, (scenario.name, found)


ONE_SAMPLE_A_SIDE = {
    Design.PAIRED: lambda a, b: Comparison("c", {1: [a]}, {1: [b]}),
    Design.INDEPENDENT: lambda a, b: Comparison("c", [a], [b]),
    Design.GROWTH: lambda a, b: Comparison("c", ([a], [b]), ([b], [a])),
    Design.PREDICTION: lambda a, b: Comparison("c", a, [b]),
}


@settings(max_examples=200, deadline=None)
@given(design=st.sampled_from(list(ONE_SAMPLE_A_SIDE)), a=st.floats(1e-6, 1e6), b=st.floats(1e-6, 1e6),
       threshold=st.floats(0.01, 100.0))
def test_a_timing_measured_once_a_side_decides_nothing(design: Design, a: float, b: float, threshold: float) -> None:
    """However far the two numbers are apart, a ratio of timings with one sample a side has no interval:
    inconclusive, saying why and what to measure; only a BOUND's value is exact."""
    claim = judge(spec(design, at_least=threshold), [ONE_SAMPLE_A_SIDE[design](a, b)])
    assert claim.status == INCONCLUSIVE and claim.interval is None and ONCE in claim.cases[0].note, claim.record()
    exact = judge(spec(Design.BOUND, at_least=threshold), [Comparison("c", a / b)])
    assert exact.status == (HOLDS if a / b >= threshold else FAILS)
