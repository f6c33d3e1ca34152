"""The error rates of the claims' verdicts, by simulation: each design of `claims` run many times on
samples drawn with a known true ratio, through `judge` itself.

Under the null (every case and baseline exactly as fast as the system, the claim's threshold 1) a
*holds* is a false one, and so is a *does not hold*; under a true effect of 10 % the rates say how often
each verdict is reached. Beside the designs as `judge` runs them, two ways the verdicts used to be drawn
show what the rule guards against: the fastest of several baselines picked on the samples that judge it,
and several cases decided by the worst without a correction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from reproflow.reporting.claims import FAILS, HOLDS, INCONCLUSIVE, ClaimSpec, Comparison, Design, Selection, judge

SPREAD = 0.10  # log-normal spread of one sample (a step, an iteration): 10 %, as on a loaded shared machine
SAMPLES = 10  # samples a side of a comparison
SCREEN = 2  # samples a side of a screen
ROUNDS, PER_ROUND, DRIFT = 4, 6, 0.08  # paired rounds: iterations a training, the machine's drift between rounds
K = 4  # baselines or cases where a design has several


def _spec(design: Design, selection: Selection = Selection.NONE) -> ClaimSpec:
    return ClaimSpec(family="simulated", statement="the system is at least as fast", ratio="baseline / system",
                     paper="", system="system", baselines="baseline", design=design, selection=selection,
                     at_least=1.0)


def _draw(rng: np.random.Generator, median: float, n: int = SAMPLES) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, SPREAD, n))


def _paired(rng: np.random.Generator, effect: float) -> list[Comparison]:
    """One case, ROUNDS rounds of a training a side, each round's machine speed shared by both."""
    drift = np.exp(rng.normal(0.0, DRIFT, ROUNDS))
    return [Comparison("case", {r: _draw(rng, effect * d, PER_ROUND) for r, d in enumerate(drift, 1)},
                       {r: _draw(rng, d, PER_ROUND) for r, d in enumerate(drift, 1)})]


def _independent(rng: np.random.Generator, effect: float) -> list[Comparison]:
    return [Comparison("case", _draw(rng, effect), _draw(rng, 1.0))]


def _screened(rng: np.random.Generator, effect: float, on_judging_samples: bool = False) -> list[Comparison]:
    """K baselines, the fastest picked on a screen of their own samples (or on the judging ones)."""
    judged = [_draw(rng, effect) for _ in range(K)]
    screen = judged if on_judging_samples else [_draw(rng, effect, SCREEN) for _ in range(K)]
    fastest = min(range(K), key=lambda i: float(np.log(screen[i]).mean()))
    return [Comparison("case", judged[fastest], _draw(rng, 1.0))]


def _every(rng: np.random.Generator, effect: float) -> list[Comparison]:
    """K baselines, the system judged against each."""
    system = _draw(rng, 1.0)
    return [Comparison("case", _draw(rng, effect), system, baseline=f"b{i}") for i in range(K)]


def _cases(rng: np.random.Generator, effect: float) -> list[Comparison]:
    """K cases, one baseline each."""
    return [Comparison(f"case {i}", _draw(rng, effect), _draw(rng, 1.0)) for i in range(K)]


def _worst_uncorrected(comparisons: list[Comparison]) -> str:
    """The old rule: each case judged alone at the claim's level, the worst decides."""
    found = {judge(_spec(Design.INDEPENDENT), [c]).status for c in comparisons}
    return next(s for s in (FAILS, INCONCLUSIVE, HOLDS) if s in found)


@dataclass(frozen=True)
class Scenario:
    """A design as `judge` runs it (or, `judged_by`, as verdicts used to be drawn)."""

    name: str
    draw: Callable[[np.random.Generator, float], list[Comparison]]
    spec: ClaimSpec
    judged_by: Callable[[list[Comparison]], str] | None = None


SCENARIOS = (
    Scenario(f"paired rounds ({ROUNDS} rounds of {PER_ROUND}, {DRIFT:.0%} drift)", _paired, _spec(Design.PAIRED)),
    Scenario(f"independent samples ({SAMPLES} a side)", _independent, _spec(Design.INDEPENDENT)),
    Scenario(f"best of {K} with a screen of {SCREEN} each", _screened,
             _spec(Design.INDEPENDENT, Selection.SCREEN)),
    Scenario(f"{K} baselines, every candidate", _every, _spec(Design.INDEPENDENT, Selection.EVERY)),
    Scenario(f"{K} cases", _cases, _spec(Design.INDEPENDENT)),
    Scenario(f"not used: best of {K} picked on the judging samples",
             lambda rng, effect: _screened(rng, effect, on_judging_samples=True), _spec(Design.INDEPENDENT)),
    Scenario(f"not used: {K} cases, worst decides, no correction", _cases, _spec(Design.INDEPENDENT),
             _worst_uncorrected),
)
EFFECTS = {"null (equal)": 1.0, "system 10 % faster": 1.1, "system 10 % slower": 1 / 1.1}


def rates(scenario: Scenario, effect: float, repeats: int, seed: int = 1) -> dict[str, float]:
    """The share of `repeats` draws that reach each verdict, the baselines' times `effect` times the
    system's."""
    rng = np.random.default_rng(seed)
    verdicts = []
    for _ in range(repeats):
        comparisons = scenario.draw(rng, effect)
        verdicts.append(scenario.judged_by(comparisons) if scenario.judged_by else
                        judge(scenario.spec, comparisons).status)
    return {v: verdicts.count(v) / repeats for v in (HOLDS, INCONCLUSIVE, FAILS)}


def table(repeats: int, scenarios: Sequence[Scenario] = SCENARIOS, seed: int = 1) -> list[dict[str, object]]:
    """One row per scenario: the false holds and false does-not-hold rates under the null, and each
    verdict's rate under a 10 % effect either way."""
    out = []
    for s in scenarios:
        null = rates(s, EFFECTS["null (equal)"], repeats, seed)
        faster = rates(s, EFFECTS["system 10 % faster"], repeats, seed)
        slower = rates(s, EFFECTS["system 10 % slower"], repeats, seed)
        out.append({"design": s.name, "false holds": null[HOLDS], "false does not hold": null[FAILS],
                    "10 % faster: holds": faster[HOLDS], "10 % faster: inconclusive": faster[INCONCLUSIVE],
                    "10 % slower: does not hold": slower[FAILS],
                    "10 % slower: inconclusive": slower[INCONCLUSIVE]})
    return out
