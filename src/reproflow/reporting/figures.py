"""Figures: saving one, and the claims as one picture (a forest plot): each claim's measured value and
interval over the range where it holds, coloured by its verdict, with the paper's figure beside it;
ratios near 1 on a linear axis, tolerances (errors against a bound far below 1) and ratios far from 1
in a log panel of their own."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reproflow.reporting.claims import FAILS, HOLDS, INCONCLUSIVE, Claim
from reproflow.store.files import file_stem

COLOURS = {HOLDS: "#2ca02c", FAILS: "#d62728", INCONCLUSIVE: "#ff7f0e"}
OTHER = "#7f7f7f"  # not measured, not compared, not applicable
NEAR = (0.1, 5.0)  # a claim whose value, interval and bounds lie within this is drawn on the linear axis


def near_one(c: Claim) -> bool:
    """Whether a linear axis around 1 can show the claim: not an error bound far below 1 (1e-9), not a
    growth far above it (busBW x500)."""
    return all(NEAR[0] <= x <= NEAR[1] for x in (c.measured, *(c.interval or ()), c.at_least, c.at_most)
               if _positive(x))


def forest_plot(claims: Sequence[Claim], out_dir: Path, name: str = "claims_forest") -> list[Path]:
    """`<name>.png` and `.pdf` of claims_figure; nothing when no claim has a value."""
    fig = claims_figure(claims)
    return save_figure(fig, out_dir, name) if fig is not None else []


def claims_figure(claims: Sequence[Claim]) -> Any:
    """The forest plot as a matplotlib figure: one row per claim, top to bottom in the given order within
    each panel (the ratios near 1, then the rest); None when no claim has a value."""
    import matplotlib.pyplot as plt

    if not any(_positive(c.measured) for c in claims):
        return None
    panels = [(group, log) for group, log in (([c for c in claims if near_one(c)], False),
                                               ([c for c in claims if not near_one(c)], True)) if group]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 0.55 * len(claims) + 1.3 * len(panels)), squeeze=False,
                             gridspec_kw={"height_ratios": [len(g) + 1 for g, _ in panels]})
    for ax, (group, log) in zip(axes[:, 0], panels, strict=True):
        _panel(ax, group, log)
    axes[0, 0].set_title("The papers' claims on these results (green: holds, red: does not hold, orange: "
                         "inconclusive, grey: not measured, not compared or not applicable)", fontsize=8)
    fig.tight_layout()
    return fig


def _panel(ax: Any, claims: Sequence[Claim], log: bool) -> None:
    """One axis of rows: ratios near 1 on a linear scale that shows every interval and threshold, or the
    rest on a log scale."""
    values = [x for c in claims for x in (c.measured, *(c.interval or ()), c.at_least, c.at_most) if _positive(x)]
    values = values or [1.0]
    if log:
        low, high = min(values) / 3, max(values) * 3
    else:
        values.append(1.0)
        pad = 0.08 * (max(values) - min(values)) or 0.1
        low, high = max(min(values) - pad, 0.0), max(values) + pad
    for row, c in enumerate(claims):
        y = len(claims) - 1 - row
        # Where the claim holds: at or above at_least and at or below at_most; shaded on measured rows with
        # a bound only (a row not measured holds nowhere).
        if _positive(c.measured) and (_positive(c.at_least) or _positive(c.at_most)):
            ax.fill_betweenx([y - 0.4, y + 0.4], c.at_least or low, c.at_most or high, color="#e8f5e8", lw=0)
        for bound in (c.at_least, c.at_most):
            if _positive(bound):
                ax.plot([bound, bound], [y - 0.4, y + 0.4], color="#2ca02c", lw=1, ls="--")
        colour = COLOURS.get(c.status, OTHER)
        if _positive(c.measured):
            lo, hi = c.interval or (c.measured, c.measured)
            ax.errorbar([c.measured], [y], xerr=[[c.measured - lo], [hi - c.measured]], fmt="o", color=colour,
                        ms=6, lw=2, capsize=4)
        value = f"{c.measured:.3g}" if _positive(c.measured) else "-"
        ax.text(1.01, y, textwrap.shorten(f"{value}: {c.status}; paper: {c.paper or '-'}", 70), fontsize=7,
                va="center", color=colour, transform=ax.get_yaxis_transform())
    if log:
        ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(-0.6, len(claims) - 0.4)
    ax.set_yticks(range(len(claims)), [textwrap.shorten(f"{c.family}: {c.statement}", 80)
                                       for c in reversed(claims)], fontsize=7)
    if not log:
        ax.axvline(1.0, color="black", lw=0.6)
    ax.set_xlabel("errors and ratios far from 1 (log scale)" if log else
                  "measured ratio (dot: the value, bar: its interval; shaded, dashed: where the claim holds)",
                  fontsize=8)


def new_figure(figsize: tuple[float, float], legend_room: float = 0.0) -> tuple[Any, Any]:
    """A matplotlib figure and its one axes, outside pyplot, the axes at fixed margins with `legend_room`
    (a fraction of the width) on the right for a legend beside them: what a command that draws a few
    figures and exits needs (pyplot's import, a second draw for a tight bounding box and a legend's
    search for the emptiest corner cost more than the drawing, docs/results.md)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    width, height = figsize
    left, bottom = 0.7 / width, 0.75 / height  # inches for the tick labels and axis labels
    return fig, fig.add_axes((left, bottom, 1 - legend_room - left - 0.2 / width, 1 - bottom - 0.35 / height))


def save_figure(fig: object, out_dir: Path, name: str, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """`<name>.png` and `<name>.pdf` (or `formats`) in `out_dir`; closes the figure. A pyplot figure is
    cropped to its tight bounding box; one of new_figure is saved as laid out."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{file_stem(name)}.{suffix}" for suffix in formats]
    pyplot = fig.canvas.manager is not None  # type: ignore[attr-defined]
    for path in paths:
        fig.savefig(path, dpi=130, bbox_inches="tight" if pyplot else None)  # type: ignore[attr-defined]
    if pyplot:  # pyplot keeps its figures open
        import matplotlib.pyplot as plt

        plt.close(fig)  # type: ignore[arg-type]
    return paths


def _positive(x: float | None) -> bool:
    return x is not None and not math.isnan(x) and x > 0
