"""`make bench`: how often `reproflow history` calls a change where there is none, and how often it finds one.

Generated years of nightly values (365 runs; the logarithm's run-to-run noise 2 %, normal or Student's t
with 3 degrees of freedom for the heavy tails of shared clusters), each searched by the change-point
function `reproflow history` uses, at its penalty and at BIC's (2 log n) beside it, and at its penalty
without the clipping of lone outliers:

- false alarms: the share of years without a change in which any change point is found;
- found: the share of years with one step (a 5 % or a 2 % drop at night 200) in which a change point
  lands within 3 nights of it.

And the nightly gate (`history --judge`): the share of a quiet year's nights, each judged against the
LAST nights before it, that fall outside its prediction interval.

-> <out>/history.csv (noise, change, penalty, years, share, 95 % interval by Wilson's score).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
from stamp import stamp

from reproflow.reporting.history import OUTLIER, PENALTY, change_points
from reproflow.reporting.nightly import ALARM, LAST, prediction_interval

NIGHTS, AT, NOISE = 365, 200, 0.02


def year(rng: np.random.Generator, drop: float, tails: bool) -> np.ndarray:
    """One year's logarithms: noise, and from night AT on a drop of `drop` (0.05: 5 %)."""
    noise = rng.standard_t(3, NIGHTS) * NOISE / math.sqrt(3) if tails else rng.normal(0, NOISE, NIGHTS)
    return noise + np.where(np.arange(NIGHTS) >= AT, math.log(1 - drop), 0.0)


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % score interval of a share k / n."""
    z, p = 1.96, k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (
        1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--years", type=int, default=1000, help="generated years per cell")
    args = parser.parse_args()
    rows = []
    for penalty, outlier, name in ((PENALTY, OUTLIER, f"{PENALTY:g} (reproflow's)"), (2.0, OUTLIER, "2 (BIC)"),
                                   (PENALTY, math.inf, f"{PENALTY:g}, outliers not clipped")):
        for tails in (False, True):
            for drop in (0.0, 0.05, 0.02):
                rng = np.random.default_rng(int(drop * 1000) + 7 * tails)
                hits = 0
                for _ in range(args.years):
                    cuts = change_points(year(rng, drop, tails), penalty, outlier)
                    hits += bool(cuts) if drop == 0 else any(abs(c - AT) <= 3 for c in cuts)
                low, high = wilson(hits, args.years)
                rows.append({"noise": "t3" if tails else "normal", "change": f"{drop:.0%} drop" if drop else "none",
                             "measure": "found" if drop else "false alarm", "penalty": name, "years": args.years,
                             "share": hits / args.years, "low": low, "high": high})
                print(rows[-1], flush=True)
    # The nightly gate (history --judge): a quiet year's nights each against the last LAST before it.
    for tails in (False, True):
        rng = np.random.default_rng(11 + tails)
        hits = total = 0
        for _ in range(args.years // 10):
            logs = year(rng, 0.0, tails)
            for night in range(LAST, NIGHTS):
                centre, half = prediction_interval(logs[night - LAST:night], 1 - ALARM)
                hits += abs(logs[night] - centre) > half
                total += 1
        low, high = wilson(hits, total)
        rows.append({"noise": "t3" if tails else "normal", "change": "none", "measure": "gate false alarm a night",
                     "penalty": f"history --judge, alarm {ALARM:g}", "years": args.years // 10,
                     "share": hits / total, "low": low, "high": high})
        print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp(pd.DataFrame(rows)).to_csv(out / "history.csv", index=False, float_format="%.4g")
    print(f"bench: wrote {out / 'history.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
