"""The papers' claims as relative checks that survive a change of hardware.

Each family's `analysis/<family>.py` may define `claims(frame, reports) -> list[Claim]`: from its
result rows (and the tables already written under `reports`) it states each claim of its paper as a
ratio with a threshold, so a claim holds or does not hold on whatever machine measured it, and is
"not measured" when the rows it needs are missing. The paper's own ratio sits beside the measured one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured"


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

    @property
    def status(self) -> str:
        """holds / does not hold / not measured."""
        if self.measured is None or math.isnan(self.measured):
            return NOT_MEASURED
        low_ok = self.at_least is None or self.measured >= self.at_least
        high_ok = self.at_most is None or self.measured <= self.at_most
        return HOLDS if low_ok and high_ok else FAILS

    @property
    def threshold(self) -> str:
        """The condition on the ratio, e.g. '>= 1' or '<= 0.1'."""
        parts = []
        if self.at_least is not None:
            parts.append(f">= {self.at_least:g}")
        if self.at_most is not None:
            parts.append(f"<= {self.at_most:g}")
        return " and ".join(parts)

    def record(self) -> dict[str, object]:
        """The claim as one table row."""
        return {"family": self.family, "claim": self.statement, "status": self.status, "ratio": self.ratio,
                "measured": self.measured, "threshold": self.threshold, "paper": self.paper,
                "where": self.detail, "make target": self.target}


def not_measured(family: str, statement: str, ratio: str, missing: str, **kwargs: object) -> Claim:
    """A claim whose rows are absent; `missing` says what to run to measure it."""
    return Claim(family, statement, ratio, None, detail=missing, **kwargs)  # type: ignore[arg-type]


def counts(claims: list[Claim]) -> dict[str, int]:
    """How many claims hold, do not hold and are not measured."""
    return {s: sum(c.status == s for c in claims) for s in (HOLDS, FAILS, NOT_MEASURED)}
