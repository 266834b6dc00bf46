"""Charts as PNG bytes, drawn with matplotlib's object API (Figure + Agg), never pyplot.

pyplot keeps global state and picks a GUI backend from the environment; a report built inside a
training script or a notebook must not open windows or leak figures, so every chart is a standalone
Figure rendered straight to PNG.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import blended_transform_factory

from rlhfkit.report.series import Series, ema

# tab10 without its red and grey, which mean "critical" and "info" on the health markers.
RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22"]
SEVERITY_COLORS = {"info": "#8c8c8c", "warning": "#e69500", "critical": "#c81e1e"}
DPI = 110
SIZE_LARGE = (6.4, 3.3)  # inches: the headline chart
SIZE = (4.6, 2.9)  # inches: every other metric chart
EVIDENCE_SIZE = (3.2, 1.6)  # inches: a finding's evidence, beside its row of the findings table
SPARSE = 30  # curves with at most this many points (evaluations) get a marker per point


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


@dataclass(frozen=True)
class Line:
    """One run's curve in a chart."""

    label: str
    color: str
    series: Series


@dataclass(frozen=True)
class Marker:
    """A health finding on the timeline: where, and how bad."""

    x: float
    severity: str


def _figure(size: tuple[float, float]):
    """A figure with one axes at fixed margins (inches). Fixed, not constrained layout: that solver
    doubles the time per chart, and a report draws dozens; y tick labels are short (see _plain_ticks)."""
    width, height = size
    fig = Figure(figsize=size)
    left, right, top, bottom = 0.62, 0.15, 0.32, 0.45
    fig.subplots_adjust(left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height)
    return fig, fig.add_subplot()


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _style(ax, x_label: str) -> None:
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8, color="#888888")
    ax.set_xlabel(x_label, fontsize=8, color="#555555")


def _plain_ticks(ax) -> None:
    """Tick labels that read on their own ("6e-05", "1.0002"), not matplotlib's offset or x1e-5 text,
    which lands under the title; digits are added until neighbouring ticks differ."""
    ticks = ax.get_yticks()
    digits = next((d for d in range(3, 10) if len({f"{t:.{d}g}" for t in ticks}) == len(ticks)), 10)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.{digits}g}"))


def _draw_line(ax, line: Line, smooth: float) -> int:
    """Draw one run's curve (raw faint behind the EMA when smoothing); returns its count of non-finite values."""
    s = line.series
    finite = np.isfinite(s.y)
    sparse = len(s) <= SPARSE
    marker = dict(marker="o", markersize=3.5) if sparse else {}
    if smooth > 0 and not sparse:
        ax.plot(s.x[finite], s.y[finite], color=line.color, linewidth=1.0, alpha=0.25)
        ax.plot(s.x, ema(s.y, smooth), color=line.color, linewidth=1.8, label=line.label)
    else:
        # Sparse curves (evaluations) are not smoothed: each point is already an average over many prompts.
        ax.plot(s.x[finite], s.y[finite], color=line.color, linewidth=1.6, label=line.label, **marker)
    bad = ~finite
    if bad.any():
        # NaN/inf cannot be drawn on the value axis; mark where they happened along the top edge instead.
        top = blended_transform_factory(ax.transData, ax.transAxes)
        ax.plot(s.x[bad], np.full(bad.sum(), 0.97), transform=top, linestyle="none", marker="x", color=line.color,
                markersize=6, markeredgewidth=1.8, clip_on=False)  # fmt: skip
    return int(bad.sum())


def line_chart(
    title: str,
    lines: Sequence[Line],
    *,
    x_label: str,
    smooth: float = 0.0,
    markers: Sequence[Marker] = (),
    size: tuple[float, float] = SIZE,
) -> bytes:
    """A metric's curves, one line per run; health findings as dashed vertical lines by severity."""
    fig, ax = _figure(size)
    _style(ax, x_label)
    # At the figure's corner, not the axes': the top y tick label would run into an axes-aligned title.
    top = 1 - 0.06 / size[1]
    fig.text(0.015, top, title, fontsize=10, fontweight="bold", ha="left", va="top")
    nonfinite = sum(_draw_line(ax, line, smooth) for line in lines)
    for m in markers:
        ax.axvline(m.x, color=SEVERITY_COLORS.get(m.severity, "#8c8c8c"), linestyle="--", linewidth=1.1, alpha=0.8,
                   zorder=0)  # fmt: skip
    if nonfinite:
        fig.text(0.985, top, f"{nonfinite} NaN/inf (x)", fontsize=8, ha="right", va="top",
                 color=SEVERITY_COLORS["critical"])  # fmt: skip
    if len(lines) > 1:
        ax.legend(fontsize=7, frameon=False)
    _plain_ticks(ax)
    return _png(fig)


def sparkline(lines: Sequence[Line], *, smooth: float, width: float = 2.5) -> bytes:
    """A bare trend line per run for the summary tiles: no axes, the last value marked."""
    fig = Figure(figsize=(width, 0.62))
    fig.subplots_adjust(left=0.02, right=0.97, top=0.9, bottom=0.1)
    ax = fig.add_subplot()
    ax.set_axis_off()
    for line in lines:
        s = line.series
        y = s.y if len(s) <= SPARSE else ema(s.y, smooth)
        finite = np.isfinite(y)
        ax.plot(s.x[finite], y[finite], color=line.color, linewidth=1.5)
        if finite.any():
            ax.plot(s.x[finite][-1:], y[finite][-1:], marker="o", markersize=3.5, color=line.color)
    return _png(fig)


def health_timeline(
    rows: Sequence[tuple[str, Sequence[Marker]]], *, x_label: str, x_max: float | None = None
) -> bytes:
    """Findings over training: one row per (run, rule), a marker per finding coloured by severity."""
    height = 0.9 + 0.32 * max(1, len(rows))
    fig = Figure(figsize=(9.5, height), layout="constrained")
    ax = fig.add_subplot()
    _style(ax, x_label)
    ax.grid(True, axis="x", color="#e6e6e6")
    ax.grid(False, axis="y")
    seen: set[str] = set()
    for i, (_, markers) in enumerate(rows):
        for severity in SEVERITY_COLORS:
            xs = [m.x for m in markers if m.severity == severity]
            if xs:
                ax.scatter(xs, [i] * len(xs), color=SEVERITY_COLORS[severity], s=36, marker="o",
                           label=severity if severity not in seen else None, zorder=3)  # fmt: skip
                seen.add(severity)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()
    if x_max:
        ax.set_xlim(0, x_max * 1.01)
    if seen:
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def evidence_chart(
    name: str, points: Sequence[tuple[float, float]], step: float, threshold: float | None, severity: str
) -> bytes:
    """A health finding's evidence: `name`'s values around the finding's `step` (marked), and the threshold it
    crossed as a horizontal line."""
    fig, ax = _figure(EVIDENCE_SIZE)
    _style(ax, "step")
    fig.text(0.015, 1 - 0.06 / EVIDENCE_SIZE[1], name, fontsize=8, fontweight="bold", ha="left", va="top")
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    finite = np.isfinite(y)
    color = SEVERITY_COLORS.get(severity, "#8c8c8c")
    ax.plot(x[finite], y[finite], color="#4c72b0", linewidth=1.4, marker="o", markersize=2.5)
    ax.axvline(step, color=color, linestyle="--", linewidth=1.1)
    if threshold is not None and np.isfinite(threshold):
        ax.axhline(threshold, color=color, linestyle=":", linewidth=1.2)
    _plain_ticks(ax)
    return _png(fig)
