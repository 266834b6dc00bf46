"""The report page as one self-contained HTML string: inline CSS, charts as base64 PNG data URIs.

No script, no web font, no external URL: the page must look the same when opened offline, attached to
an issue or e-mailed. Every piece of run data goes through html.escape (completions are model output
and may hold anything, including "<script>").
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from rlhfkit.health.output import evidence
from rlhfkit.health.rules import SEVERITIES
from rlhfkit.report import charts
from rlhfkit.report.charts import SEVERITY_COLORS
from rlhfkit.report.rundata import Run
from rlhfkit.report.series import FirstLast, higher_is_better

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0;
       color: #1d1d1f; background: #f6f7f9; font-size: 14px; }
main { max-width: 1480px; margin: 0 auto; padding: 18px 28px 60px; }
h1 { font-size: 22px; margin: 6px 0 2px; }
h2 { font-size: 18px; margin: 30px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #d9dce1; }
h3 { font-size: 15px; margin: 18px 0 8px; }
h4 { font-size: 13px; margin: 14px 0 6px; color: #333; }
nav a { margin-right: 14px; color: #1f5fae; text-decoration: none; }
.sub { color: #5f6368; margin: 2px 0 10px; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #dde0e4; padding: 5px 9px; text-align: left; vertical-align: top; }
th { background: #eef0f3; font-weight: 600; font-size: 12.5px; }
.tiles { display: flex; flex-wrap: wrap; gap: 10px; margin: 14px 0 6px; }
.tile { background: #fff; border: 1px solid #dde0e4; border-radius: 6px; padding: 8px 10px; width: 250px; }
.tile img { display: block; width: 250px; height: auto; margin: 4px 0; }
.tile .trow { font-size: 14px; margin: 2px 0; }
.tile.headline { width: 330px; border: 2px solid #1f5fae; }
.tile.headline img { width: 330px; }
.tile.headline .trow { font-size: 19px; }
.fl { white-space: nowrap; font-variant-numeric: tabular-nums; }
.delta { font-size: 12px; font-weight: 600; white-space: nowrap; }
.good { color: #18794e; } .bad { color: #c81e1e; } .neutral { color: #6b7075; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 6px;
          vertical-align: -1px; }
.badge { display: inline-block; border-radius: 9px; padding: 1px 8px; font-size: 12px; color: #fff;
         margin: 1px 2px; white-space: nowrap; }
.badge.ok { background: #18794e; } .badge.none { background: #9aa0a6; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 12px; }
.grid.crucial { grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); }
figure { margin: 0; background: #fff; border: 1px solid #dde0e4; border-radius: 6px; padding: 6px; }
figure img { width: 100%; max-width: 760px; height: auto; display: block; margin: 0 auto; }
figcaption { font-size: 12px; color: #5f6368; padding: 4px 4px 2px; }
figcaption code { color: #1d1d1f; font-weight: 600; }
.warn { color: #c81e1e; font-weight: 600; }
.note { background: #fff8e1; border: 1px solid #f0d78c; border-radius: 6px; padding: 8px 12px; margin: 10px 0; }
table.samples td.text { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
                        white-space: pre-wrap; word-break: break-word; max-width: 640px; }
table.samples td div.scroll { max-height: 14em; overflow: auto; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.yes { color: #18794e; font-weight: 700; text-align: center; }
td.no { color: #c81e1e; font-weight: 700; text-align: center; }
.steps { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.config td:first-child { white-space: nowrap; }
.config td { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px;
             max-width: 520px; word-break: break-all; }
details { margin: 10px 0; } summary { cursor: pointer; color: #1f5fae; }
td.evidence img { display: block; width: 260px; height: auto; margin: 2px 0; }
"""


def fmt(value: Any) -> str:
    """A number as a person reads it: 4 significant digits, NaN/inf spelled out; anything else as text."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value.is_integer() and abs(value) < 1e7:
            return str(int(value))
        return f"{value:.4g}"
    return str(value)


def png_img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}">'


def swatch(color: str) -> str:
    return f'<span class="swatch" style="background:{escape(color)}"></span>'


def severity_badge(severity: str, text: str | None = None) -> str:
    color = SEVERITY_COLORS.get(severity, "#8c8c8c")
    return f'<span class="badge" style="background:{color}">{escape(text or severity)}</span>'


# ----------------------------------------------------------------------------------------------
# Summary


@dataclass(frozen=True)
class RunSummary:
    """One row of the one-glance summary."""

    name: str
    color: str
    trainer: str
    updates: int
    episodes: float | None
    seconds: float | None
    findings: list[dict[str, Any]] | None
    values: dict[str, FirstLast | None]


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _health_cell(findings: list[dict[str, Any]] | None) -> str:
    if findings is None:
        return '<span class="badge none" title="the health checks did not run">not checked</span>'
    if not findings:
        return '<span class="badge ok">no findings</span>'
    counts = {s: sum(f["severity"] == s for f in findings) for s in reversed(SEVERITIES)}
    return "".join(severity_badge(s, f"{n} {s}") for s, n in counts.items() if n)


def _change(name: str, fl: FirstLast | None) -> str:
    """First → last and the change, e.g. 0.449 → 0.570 ▲ +0.121; coloured when the metric has a right direction."""
    if fl is None:
        return '<span class="fl">no finite value</span>'
    delta = fl.delta
    if not math.isfinite(delta):
        css, arrow = "bad", "!"
    elif delta == 0:
        css, arrow = "neutral", "="
    else:
        arrow = "▲" if delta > 0 else "▼"
        css = ("good" if delta > 0 else "bad") if higher_is_better(name) else "neutral"
    window = f"mean of the first/last {fl.window} values" if fl.window > 1 else "first and last logged values"
    sign = "+" if delta > 0 else ""
    warn = f' <span class="warn">{fl.nonfinite} NaN/inf</span>' if fl.nonfinite else ""
    return (
        f'<span class="fl" title="{escape(window)}">{fmt(fl.first)} → {fmt(fl.last)}</span> '
        f'<span class="delta {css}">{arrow} {sign}{fmt(delta)}</span>{warn}'
    )


def summary_tile(name: str, rows: Sequence[RunSummary], sparkline: bytes | None, headline: bool) -> str:
    """One crucial value: its name, a sparkline of every run, and each run's first → last."""
    lines = []
    for r in rows:
        who = swatch(r.color) if len(rows) > 1 else ""
        change = _change(name, r.values[name]) if name in r.values else '<span class="neutral">not logged</span>'
        lines.append(f'<div class="trow">{who}{change}</div>')
    img = png_img(sparkline, f"trend of {name}") if sparkline else ""
    css = "tile headline" if headline else "tile"
    return f'<div class="{css}" data-metric="{escape(name)}"><code>{escape(name)}</code>{img}{"".join(lines)}</div>'


def summary_section(rows: Sequence[RunSummary], metrics: Sequence[str], sparklines: dict[str, bytes]) -> str:
    """The first screen: per run its size and health, then a tile per crucial value with its trend and
    first → last, headline first, so whether training worked reads at a glance."""
    head = "<tr><th>run</th><th>trainer</th><th>updates</th><th>episodes</th><th>time</th><th>health</th></tr>"
    body = "".join(
        f"<tr><td>{swatch(r.color)}<b>{escape(r.name)}</b></td><td>{escape(r.trainer.upper())}</td>"
        f'<td class="num">{r.updates}</td><td class="num">{fmt(r.episodes) if r.episodes is not None else "–"}</td>'
        f'<td class="num">{duration(r.seconds)}</td><td>{_health_cell(r.findings)}</td></tr>'
        for r in rows
    )
    tiles = "".join(summary_tile(m, rows, sparklines.get(m), i == 0) for i, m in enumerate(metrics))
    return (
        '<section id="summary"><h2>Summary</h2>'
        f'<table class="runs">{head}{body}</table>'
        f'<div class="tiles">{tiles}</div>'
        '<p class="sub">first → last over training (per-update curves: mean of ~5% of the values at each end, '
        "hover for details). Green: moved the way training should push it; red: the other way, or NaN; grey: no "
        "right direction.</p></section>"
    )


# ----------------------------------------------------------------------------------------------
# Charts


@dataclass(frozen=True)
class Chart:
    """One metric's chart card."""

    name: str
    png: bytes
    file: str
    meaning: str
    nonfinite: int


def chart_card(chart: Chart) -> str:
    warn = f' <span class="warn">{chart.nonfinite} NaN/inf values (x marks)</span>' if chart.nonfinite else ""
    meaning = f" – {escape(chart.meaning)}" if chart.meaning else ""
    return (
        f'<figure id="chart-{escape(chart.file)}" data-metric="{escape(chart.name)}">'
        f"{png_img(chart.png, chart.name)}"
        f"<figcaption><code>{escape(chart.name)}</code>{meaning}{warn}</figcaption></figure>"
    )


def charts_section(sections: Sequence[tuple[str, Sequence[Chart]]], subtitle: str) -> str:
    parts = ['<section id="charts"><h2>Metrics</h2>', f'<p class="sub">{escape(subtitle)}</p>']
    if not sections:
        parts.append(
            '<p class="sub">metrics.jsonl holds no metrics yet (a run that stopped before its first update).</p>'
        )
    for i, (title, section_charts) in enumerate(sections):
        css = "grid crucial" if i == 0 and title == "Crucial values" else "grid"
        parts.append(
            f'<h3>{escape(title)}</h3><div class="{css}">{"".join(chart_card(c) for c in section_charts)}</div>'
        )
    parts.append("</section>")
    return "".join(parts)


# ----------------------------------------------------------------------------------------------
# Health


MAX_EVIDENCE_FINDINGS = 40  # findings drawn with their evidence (the first, by step); the rest are listed


def evidence_charts(rows: Sequence[dict[str, float]], finding: dict[str, Any]) -> str:
    """A small chart per metric of a finding (two at most): its values around the finding's step, the step dashed
    and the threshold it crossed dotted."""
    names = list(finding["metrics"])[:2]
    around = evidence(rows, finding["step"], names, before=15, after=5)
    charts_html = []
    for name, points in around.items():
        if points:
            png = charts.evidence_chart(
                name, points, finding["step"], finding["thresholds"].get(name), finding["severity"]
            )
            charts_html.append(png_img(png, f"{name} around step {finding['step']}"))
    return "".join(charts_html)


def health_section(runs: Sequence[Run], timeline_png: bytes | None) -> str:
    parts = ['<section id="health"><h2>Health findings</h2>']
    if all(r.findings is None for r in runs):
        parts.append(
            '<p class="sub">The health checks did not run (no health.jsonl, or <code>health: off</code>).</p>'
        )
        return "".join(parts) + "</section>"
    rows = [(f["step"], run.name, f) for run in runs for f in (run.findings or [])]
    if not rows:
        parts.append('<p class="sub">The health checks ran and found nothing.</p>')
        return "".join(parts) + "</section>"
    parts.append('<p class="sub">Dashed vertical lines on the metric charts mark the findings about that metric.</p>')
    if timeline_png is not None:
        parts.append(f'<figure class="timeline">{png_img(timeline_png, "health timeline")}</figure>')
    show_run = len(runs) > 1
    head = "<tr><th>step</th>" + ("<th>run</th>" if show_run else "")
    head += "<th>severity</th><th>rule</th><th>metrics</th><th>message</th><th>evidence</th><th>advice</th></tr>"
    body = []
    metrics_of = {run.name: run.metrics for run in runs}
    for i, (step, run_name, f) in enumerate(sorted(rows, key=lambda r: (r[0], r[1]))):
        metrics = ", ".join(f"{escape(str(k))} = {escape(fmt(v))}" for k, v in f["metrics"].items())
        shown = evidence_charts(metrics_of[run_name], f) if i < MAX_EVIDENCE_FINDINGS else ""
        body.append(
            f'<tr><td class="num">{step}</td>'
            + (f"<td>{escape(run_name)}</td>" if show_run else "")
            + f"<td>{severity_badge(f['severity'])}</td><td><code>{escape(f['rule'])}</code></td>"
            f'<td class="mono">{metrics}</td><td>{escape(f["message"])}</td><td class="evidence">{shown}</td>'
            f"<td>{escape(f['advice'])}</td></tr>"
        )
    parts.append(f'<table class="findings">{head}{"".join(body)}</table></section>')
    return "".join(parts)


# ----------------------------------------------------------------------------------------------
# Samples

MAX_SAMPLE_ROWS = 32


def sample_steps(steps: Sequence[int]) -> list[int]:
    """The first, middle and last of the logged sample steps (fewer when fewer were logged)."""
    steps = sorted(set(steps))
    if not steps:
        return []
    return sorted({steps[0], steps[len(steps) // 2], steps[-1]})


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(k for k in row if k not in ("step", "key")))
    return list(columns)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return f'<td class="{"yes" if value else "no"}">{"✓" if value else "✗"}</td>'
    if isinstance(value, (int, float)):
        return f'<td class="num">{escape(fmt(value))}</td>'
    if value is None:
        return "<td></td>"
    text = value if isinstance(value, str) else json.dumps(value)
    return f'<td class="text"><div class="scroll">{escape(text)}</div></td>'


def _step_stats(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """One line under a step's heading: share of True per bool column, mean of each numeric column."""
    parts = []
    for c in columns:
        values = [r.get(c) for r in rows if c in r]
        if values and all(isinstance(v, bool) for v in values):
            parts.append(f"{escape(c)} {sum(values)}/{len(values)}")
        elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            parts.append(f"mean {escape(c)} {fmt(sum(values) / len(values))}")
    return " · ".join(parts)


def samples_table(rows: Sequence[dict[str, Any]]) -> str:
    columns = _columns(rows)
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>" for r in rows[:MAX_SAMPLE_ROWS])
    more = f'<p class="sub">showing {MAX_SAMPLE_ROWS} of {len(rows)} rows</p>' if len(rows) > MAX_SAMPLE_ROWS else ""
    return f'<table class="samples"><tr>{head}</tr>{body}</table>{more}'


def before_after_section(runs: Sequence[Run]) -> str:
    """What training changed, for runs with a before_after.json (rlhfkit quickstart): each judge's win rate of the
    trained policy against the model it started from, and a few held-out prompts with both completions."""
    parts = []
    for run in runs:
        data = run.before_after
        if not data:
            continue
        title = "Before and after" + (f": {escape(run.name)}" if len(runs) > 1 else "")
        parts.append(f'<section id="before-after"><h2>{title}</h2>')
        parts.append(
            f'<p class="sub">The trained policy against {escape(str(data.get("baseline", "the starting model")))} '
            f"on {escape(str(data.get('prompts', '?')))} held-out prompts, greedy; a tie counts half.</p><ul>"
        )
        for w in data.get("win_rates", []):
            rate, low, high = (fmt_percent(w.get(k)) for k in ("win_rate", "ci_low", "ci_high"))
            counts = f"{w.get('wins', '?')} wins, {w.get('ties', '?')} ties, {w.get('losses', '?')} losses"
            parts.append(
                f"<li><b>{rate}</b> win rate by {escape(str(w.get('judge', '?')))} ({counts}; "
                f"95% interval {low} to {high})</li>"
            )
        parts.append("</ul>")
        examples = data.get("examples", [])
        if examples:
            head = "<tr><th>prompt</th><th>before</th><th>after</th><th>task judge</th></tr>"
            rows = "".join(
                f"<tr><td><code>{escape(str(e.get('prompt', '')))}</code></td>"
                f"<td><code>{escape(str(e.get('before', '')))}</code></td>"
                f"<td><code>{escape(str(e.get('after', '')))}</code></td>"
                f"<td>{escape(str(e.get('verdict', '')))}</td></tr>"
                for e in examples
            )
            parts.append(f'<table class="samples">{head}{rows}</table>')
        parts.append("</section>")
    return "".join(parts)


def fmt_percent(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and math.isfinite(value) else "?"


def samples_section(runs: Sequence[Run]) -> str:
    parts = ['<section id="samples"><h2>Completion samples</h2>']
    parts.append('<p class="sub">The first, middle and last logged sample steps of each run.</p>')
    any_samples = False
    for run in runs:
        keys = list(dict.fromkeys(r.get("key", "samples") for r in run.samples))
        if len(runs) > 1:
            parts.append(f"<h3>{escape(run.name)}</h3>")
        if not keys:
            parts.append('<p class="sub">No samples.jsonl rows in this run.</p>')
        for key in keys:
            rows = [r for r in run.samples if r.get("key", "samples") == key]
            if len(keys) > 1:
                parts.append(f"<h4>{escape(str(key))}</h4>")
            parts.append('<div class="steps">')
            for step in sample_steps([r["step"] for r in rows]):
                at_step = [r for r in rows if r["step"] == step]
                any_samples = True
                stats = _step_stats(at_step, _columns(at_step))
                parts.append(
                    f'<div class="step" data-step="{step}"><h4>step {step}'
                    f'<span class="sub"> · {len(at_step)} rows{" · " + stats if stats else ""}</span></h4>'
                    f"{samples_table(at_step)}</div>"
                )
            parts.append("</div>")
    if not any_samples and len(runs) == 1:
        parts = parts[:2] + ['<p class="sub">No samples.jsonl rows in this run.</p>']
    return "".join(parts) + "</section>"


# ----------------------------------------------------------------------------------------------
# Config

# The settings a reader looks for first, TRL's names; shown for a single run above the full config.
MAIN_KEYS = [
    "model_name_or_path", "sft_model_path", "reward_model_path", "dataset_name", "task", "seed",
    "learning_rate", "total_episodes", "num_train_epochs", "per_device_train_batch_size",
    "gradient_accumulation_steps", "num_mini_batches", "num_ppo_epochs", "response_length", "temperature",
    "kl_coef", "kl_estimator", "kl_target", "cliprange", "cliprange_value", "vf_coef", "gamma", "lam",
    "missing_eos_penalty", "num_generations", "max_completion_length", "beta", "epsilon", "epsilon_high",
    "loss_type", "scale_rewards", "num_iterations", "reward_weights", "mask_truncated_completions",
]  # fmt: skip
ABSENT = object()


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become "outer/inner" keys, so two configs compare key by key."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def config_value(value: Any) -> str:
    if value is ABSENT:
        return "–"
    return value if isinstance(value, str) else json.dumps(value)


def differing_keys(configs: Sequence[dict[str, Any]]) -> list[str]:
    """Keys whose value is not the same in every config (absent counts as a value), in first-seen order."""
    keys = list(dict.fromkeys(k for c in configs for k in c))
    return [k for k in keys if len({json.dumps(c.get(k, "<absent>"), sort_keys=True) for c in configs}) > 1]


def _config_table(keys: Sequence[str], names: Sequence[str], configs: Sequence[dict[str, Any]]) -> str:
    head = "<tr><th>setting</th>" + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"
    body = "".join(
        f"<tr><td>{escape(k)}</td>" + "".join(f"<td>{escape(config_value(c.get(k, ABSENT)))}</td>" for c in configs)
        + "</tr>"
        for k in keys
    )  # fmt: skip
    return f'<table class="config">{head}{body}</table>'


def config_section(runs: Sequence[Run]) -> str:
    configs = [flatten(r.config) for r in runs]
    names = [r.name for r in runs]
    parts = ['<section id="config"><h2>Config</h2>']
    if len(runs) == 1:
        main = [k for k in MAIN_KEYS if k in configs[0]]
        if main:
            parts.append('<p class="sub">Main settings (run_config.json).</p>' + _config_table(main, names, configs))
        parts.append(f"<details><summary>full config ({len(configs[0])} settings)</summary>")
        parts.append(_config_table(list(configs[0]), names, configs) + "</details>")
        return "".join(parts) + "</section>"
    differ = differing_keys(configs)
    shared = [k for k in dict.fromkeys(k for c in configs for k in c) if k not in differ]
    if differ:
        parts.append(f'<p class="sub">{len(differ)} settings differ between the runs.</p>')
        parts.append(_config_table(differ, names, configs))
    else:
        parts.append('<p class="sub">All runs have the same config.</p>')
    parts.append(f"<details><summary>{len(shared)} settings shared by all runs</summary>")
    parts.append(_config_table(shared, names[:1], configs[:1]) + "</details>")
    return "".join(parts) + "</section>"


# ----------------------------------------------------------------------------------------------


def origin_block(runs: Sequence[Run]) -> str:
    """Where the numbers of runs that are not rlhfkit run directories came from (a trainer_state.json, TensorBoard
    logs, ...), and that their findings are the doctor's replay; nothing when every run is a run directory."""
    lines = [(r.name, line) for r in runs for line in r.origin]
    if not lines:
        return ""
    items = "".join(f"<li><b>{escape(name)}</b>: {escape(line)}</li>" for name, line in lines)
    return (
        f'<div class="sub">Where the numbers come from (no run directory: no config or samples):<ul>{items}</ul></div>'
    )


def notes_block(runs: Sequence[Run]) -> str:
    notes = [(r.name, n) for r in runs for n in r.notes]
    if not notes:
        return ""
    items = "".join(f"<li><b>{escape(name)}</b>: {escape(note)}</li>" for name, note in notes)
    what = "runs" if any(r.origin for r in runs) else "run directories"
    return f'<div class="note">Problems reading the {what}:<ul>{items}</ul></div>'


def page(title: str, subtitle: str, body: Sequence[str]) -> str:
    nav = "".join(
        f'<a href="#{i}">{t}</a>'
        for i, t in [("summary", "Summary"), ("charts", "Metrics"), ("health", "Health"), ("samples", "Samples"),
                     ("config", "Config")]
    )  # fmt: skip
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f'<body><main><h1>{escape(title)}</h1><p class="sub">{escape(subtitle)}</p><nav>{nav}</nav>'
        f"{''.join(body)}</main></body></html>\n"
    )
