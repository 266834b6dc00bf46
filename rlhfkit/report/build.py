"""`rlhfkit report RUN [RUN ...] --out DIR`: runs in (rlhfkit run directories, or anything `rlhfkit doctor`
reads), report.html and PNGs out."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import numpy as np

from rlhfkit.errors import ReportError
from rlhfkit.metrics import registry as M
from rlhfkit.report import charts, page
from rlhfkit.report.rundata import Run, load_run, unique_names
from rlhfkit.report.series import (
    HEADLINE,
    chart_sections,
    detect_trainer,
    first_last,
    meaning,
    metric_names,
    series,
    steps_to_x,
    summary_metrics,
    x_key,
)

REPORT_FILE = "report.html"
RUN_HELP = (
    "One or more runs, of any of these kinds: an rlhfkit run directory (a training run's output_dir, with "
    "metrics.jsonl); a TRL (transformers Trainer) run: its trainer_state.json, a checkpoint-* directory holding one, "
    "an output_dir of checkpoint-* (the newest is read), a log_history list saved alone as JSON, TensorBoard event "
    "files (the output_dir or runs/), a W&B offline run (offline-run-*, its .wandb file, or wandb/), W&B history "
    "exported as .csv, or a Hub repo id (user/run, see --revision); verl's console log or JSONL."
)
SPARKLINE_SMOOTH = 0.8


def _slug(name: str, taken: set[str]) -> str:
    """A file name for a metric's PNG ("objective/kl" -> "objective-kl"), distinct from those taken."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("/", "-")).strip("._") or "metric"
    candidate, i = slug, 2
    while candidate in taken:
        candidate, i = f"{slug}-{i}", i + 1
    taken.add(candidate)
    return candidate


def _markers(runs: Sequence[Run], key: str) -> dict[str, list[charts.Marker]]:
    """Health findings per metric they name, placed on the x-axis."""
    out: dict[str, list[charts.Marker]] = {}
    for run in runs:
        for f in run.findings or []:
            x = float(steps_to_x(run, np.array([f["step"]]), key)[0])
            for name in f["metrics"]:
                out.setdefault(str(name), []).append(charts.Marker(x, f["severity"]))
    return out


def _timeline(runs: Sequence[Run], key: str, x_max: float) -> bytes | None:
    rows: list[tuple[str, list[charts.Marker]]] = []
    for run in runs:
        by_rule: dict[str, list[charts.Marker]] = {}
        for f in run.findings or []:
            x = float(steps_to_x(run, np.array([f["step"]]), key)[0])
            by_rule.setdefault(f["rule"], []).append(charts.Marker(x, f["severity"]))
        rows += [(rule if len(runs) == 1 else f"{run.name}: {rule}", m) for rule, m in by_rule.items()]
    return charts.health_timeline(rows, x_label=key, x_max=x_max) if rows else None


def _last_finite(run: Run, name: str) -> float | None:
    for row in reversed(run.metrics):
        if name in row and np.isfinite(row[name]):
            return row[name]
    return None


def _run_summary(run: Run, color: str, key: str, metrics: Sequence[str]) -> page.RunSummary:
    updates = {row["step"] for row in run.metrics if any(not k.startswith("eval/") and k != "step" for k in row)}
    episodes = _last_finite(run, M.EPISODE.name)
    eps = _last_finite(run, M.EPS.name)  # episodes per second since the start of training
    seconds = episodes / eps if episodes is not None and eps else None
    return page.RunSummary(
        name=run.name,
        color=color,
        trainer=detect_trainer(metric_names(run)),
        updates=len(updates),
        episodes=episodes,
        seconds=seconds,
        findings=run.findings,
        values={m: first_last(s) for m in metrics if len(s := series(run, m, key))},
    )


def _revisions(runs: Sequence[str | os.PathLike], revision: str | None) -> list[str | None]:
    """The revision to read each run at: `revision` for the Hub repo ids (the runs that are no local path), so one
    report can compare a Hub run at a revision with local runs; ReportError when every run is local."""
    hub = [not Path(run).exists() for run in runs]
    if revision is not None and not any(hub):
        raise ReportError(
            f"--revision {revision} is for Hub repo ids (user/run), and every RUN is a local path: drop it"
        )
    return [revision if is_hub else None for is_hub in hub]


def build_report(
    runs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    smooth: float = 0.6,
    metrics: Sequence[str] | None = None,
    revision: str | None = None,
) -> Path:
    """Write report.html (self-contained) and one PNG per chart into `out_dir`; return the HTML's path.

    runs: rlhfkit run directories (an output_dir each), or anything `rlhfkit doctor` reads (rundata.load_run: a
        TRL run's trainer_state.json, TensorBoard or W&B logs, a Hub repo id, ...), mixed as you like; the legend
        shows each run's run_name (or, for the others, the file, directory or repo id).
    smooth: TensorBoard-style EMA weight in [0, 1) for dense curves (0 = raw). The default is TensorBoard's
        0.6: a single PPO update is noisy, and the raw curve stays drawn, faint, behind the smoothed one.
    metrics: names or globs ("objective/*") to chart, in that order; default: all, crucial values first.
    revision: the revision (branch, tag or commit) to read the Hub repo ids among `runs` at; local runs are read as
        they are.
    Raises ReportError for unusable input (no run to read at a path, bad smoothing, no match).
    """
    if not 0 <= smooth < 1:
        raise ReportError(f"--smooth must be in [0, 1) (an EMA weight like TensorBoard's slider), got {smooth}")
    if not runs:
        raise ReportError("give at least one run")
    loaded = [load_run(path, rev) for path, rev in zip(runs, _revisions(runs, revision))]
    unique_names(loaded)
    key = x_key(loaded)
    names = list(dict.fromkeys(n for run in loaded for n in metric_names(run)))
    trainers = {detect_trainer(metric_names(run)) for run in loaded}
    sections = chart_sections(names, trainers, list(metrics) if metrics else None)
    if metrics and not sections[0][1]:
        raise ReportError(f"--metrics {' '.join(metrics)} match none of the logged metrics ({', '.join(names)})")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    colors = [charts.run_color(i) for i in range(len(loaded))]
    markers = _markers(loaded, key)
    taken: set[str] = set()
    chart_sections_out: list[tuple[str, list[page.Chart]]] = []
    x_max = 0.0
    for title, members in sections:
        cards = []
        for name in members:
            lines = [charts.Line(run.name, color, series(run, name, key)) for run, color in zip(loaded, colors)]
            lines = [line for line in lines if len(line.series)]
            x_max = max([x_max, *(float(np.nanmax(line.series.x)) for line in lines)])
            size = charts.SIZE_LARGE if name == HEADLINE or title == "Crucial values" else charts.SIZE
            png = charts.line_chart(name, lines, x_label=key, smooth=smooth, markers=markers.get(name, ()), size=size)
            slug = _slug(name, taken)
            (out / f"{slug}.png").write_bytes(png)
            nonfinite = sum(int((~np.isfinite(line.series.y)).sum()) for line in lines)
            cards.append(page.Chart(name, png, slug, meaning(name), nonfinite))
        chart_sections_out.append((title, cards))

    timeline = _timeline(loaded, key, x_max)
    if timeline is not None:
        (out / f"{_slug('health-timeline', taken)}.png").write_bytes(timeline)

    headline = summary_metrics(trainers, names)
    summaries = [_run_summary(run, color, key, headline) for run, color in zip(loaded, colors)]
    sparklines = {}
    for i, name in enumerate(headline):
        lines = [charts.Line(run.name, color, series(run, name, key)) for run, color in zip(loaded, colors)]
        # A dense curve's sparkline is smoothed even in a raw report: it shows a trend, not the noise.
        width = 3.3 if i == 0 else 2.5
        sparklines[name] = charts.sparkline(lines, smooth=max(smooth, SPARKLINE_SMOOTH), width=width)
    kinds = ", ".join(sorted(t.upper() for t in trainers))
    title = f"rlhfkit report: {loaded[0].name}" if len(loaded) == 1 else f"rlhfkit report: {len(loaded)} runs"
    subtitle = f"{kinds} · generated {datetime.now():%Y-%m-%d %H:%M} from " + ", ".join(str(r.path) for r in loaded)
    smoothing = f"EMA smoothing {smooth:g} (raw curves faint behind)" if smooth > 0 else "raw values (no smoothing)"
    body = [
        page.origin_block(loaded),
        page.notes_block(loaded),
        page.before_after_section(loaded),
        page.summary_section(summaries, headline, sparklines),
        page.charts_section(chart_sections_out, f"x-axis: {key}; {smoothing}; one line per run."),
        page.health_section(loaded, timeline),
        page.samples_section(loaded),
        page.config_section(loaded),
    ]
    report = out / REPORT_FILE
    report.write_text(page.page(title, subtitle, body), encoding="utf-8")
    return report


def cmd_report(argv: Sequence[str]) -> int:
    """`rlhfkit report`: exit status 0 with the report's path printed, 2 with a one-line error."""
    parser = argparse.ArgumentParser(
        prog="rlhfkit report",
        description="Render runs into a self-contained report.html (and PNGs): metric curves across runs, health "
        "findings, completion samples and config differences. A run is an rlhfkit run directory, or anything "
        "`rlhfkit doctor` reads (its charts and health findings only: the doctor's findings on its logged metrics).",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help=RUN_HELP)
    parser.add_argument("--out", required=True, metavar="DIR", help="Directory to write report.html and PNGs into.")
    parser.add_argument(
        "--smooth",
        type=float,
        default=0.6,
        metavar="WEIGHT",
        help="EMA smoothing weight in [0, 1) for per-update curves, as TensorBoard's slider (default 0.6; 0: raw). "
        "The raw curve is drawn faint behind.",
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        metavar="NAME",
        help="Only these metrics, in this order; globs allowed, e.g. 'objective/*' eval/task_success.",
    )
    parser.add_argument(
        "--revision",
        metavar="REV",
        help="The branch, tag or commit to read the RUNs that are Hub repo ids at (default: main); local RUNs are read "
        "as they are.",
    )
    ns = parser.parse_args(list(argv))
    try:
        path = build_report(ns.runs, ns.out, smooth=ns.smooth, metrics=ns.metrics, revision=ns.revision)
    except ReportError as e:
        print(f"rlhfkit report: error: {e}", file=sys.stderr)
        return 2
    print(f"Report: {path}")
    return 0
