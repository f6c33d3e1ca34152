"""Figures: saving one, and the claims as one picture (a forest plot): each claim's measured ratio and
interval on one log axis, over the range where it holds, coloured by its verdict, with the paper's
figure beside it."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

from reproflow.reporting.claims import FAILS, HOLDS, INCONCLUSIVE, Claim

COLOURS = {HOLDS: "#2ca02c", FAILS: "#d62728", INCONCLUSIVE: "#ff7f0e"}
OTHER = "#7f7f7f"  # not measured, not compared, not applicable


def forest_plot(claims: Sequence[Claim], out_dir: Path, name: str = "claims_forest") -> list[Path]:
    """`<name>.png` and `.pdf`: one row per claim, top to bottom in the given order; nothing when no
    claim has a ratio."""
    import matplotlib.pyplot as plt

    measured = [c.measured for c in claims if _positive(c.measured)]
    if not measured:
        return []
    ends = [x for c in claims for x in (*(c.interval or ()), c.at_least, c.at_most) if _positive(x)]
    low, high = min(measured + ends) / 1.6, max(measured + ends) * 1.6
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(claims) + 1.3))
    for row, c in enumerate(claims):
        y = len(claims) - 1 - row
        # Where the claim holds: at or above at_least and at or below at_most.
        ax.fill_betweenx([y - 0.4, y + 0.4], c.at_least or low, c.at_most or high, color="#e8f5e8", lw=0)
        colour = COLOURS.get(c.status, OTHER)
        if _positive(c.measured):
            lo, hi = c.interval or (c.measured, c.measured)
            ax.plot([lo, hi], [y, y], color=colour, lw=2.5, solid_capstyle="butt")
            ax.plot([c.measured], [y], "o", color=colour, ms=6)
        ax.text(1.01, y, textwrap.shorten(f"{c.status}; paper: {c.paper or '-'}", 70), fontsize=7, va="center",
                color=colour, transform=ax.get_yaxis_transform())
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(-0.6, len(claims) - 0.4)
    ax.set_yticks(range(len(claims)), [textwrap.shorten(f"{c.family}: {c.statement}", 80)
                                       for c in reversed(claims)], fontsize=7)
    ax.axvline(1.0, color="black", lw=0.6)
    ax.set_xlabel("measured ratio (log scale; dot: the value, bar: its interval; shaded: where the claim holds)")
    ax.set_title("The papers' claims on these results (green: holds, red: does not hold, orange: inconclusive, "
                 "grey: not measured, not compared or not applicable)", fontsize=8)
    return save_figure(fig, out_dir, name)


def save_figure(fig: object, out_dir: Path, name: str, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """`<name>.png` and `<name>.pdf` (or `formats`) in `out_dir`; closes the figure."""
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.{suffix}" for suffix in formats]
    for path in paths:
        fig.savefig(path, dpi=130, bbox_inches="tight")  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return paths


def _positive(x: float | None) -> bool:
    return x is not None and not math.isnan(x) and x > 0
