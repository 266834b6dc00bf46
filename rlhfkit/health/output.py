"""Showing findings (rich), with their evidence (the metric's values around each finding and the threshold it
crossed), and keeping them in the run directory (health.jsonl, one Finding.to_dict() per line)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from rlhfkit.health.monitor import Finding
from rlhfkit.tracking.rundir import RunDirectory

SEVERITY_STYLES = {"info": "cyan", "warning": "yellow", "critical": "bold red"}


def finding_panel(finding: Finding):
    """A compact rich Panel: severity, rule and step in the title; what happened; what to try."""
    from rich.panel import Panel
    from rich.text import Text

    style = SEVERITY_STYLES.get(finding.severity, "")
    # Text, not markup: messages contain brackets such as "[0.5, 2]" that rich would parse as tags.
    body = Text(finding.message)
    body.append("\nTry: ", style="bold")
    body.append(finding.advice, style="dim")
    title = Text.assemble(
        ("health ", ""), (finding.severity.upper(), style), (f" {finding.rule} at step {finding.step}", "bold")
    )
    return Panel(body, title=title, title_align="left", border_style=style, expand=False)


def print_finding(finding: Finding, console=None) -> None:
    """Print one finding; pass the trainer's console so it appears above a live progress bar."""
    if console is None:
        from rich.console import Console

        console = Console()
    console.print(finding_panel(finding))


def append_findings(run_dir: str | os.PathLike, findings: Iterable[Finding]) -> None:
    """Append findings to run_dir/health.jsonl (nothing is written, nor the file created, for none)."""
    records = [f.to_dict() for f in findings]
    if records:
        RunDirectory(run_dir).append_findings(records)


def evidence(
    rows: Sequence[dict[str, Any]], step: int, names: Iterable[str], before: int = 4, after: int = 2
) -> dict[str, list[tuple[int, float]]]:
    """Per metric of `names`, its (step, value) observations around `step` (a finding's): `before` observations
    before it, the step itself, and `after` after it (as far as the rows go)."""
    out = {}
    for name in names:
        series = [
            (row.get("step", index), row[name])  # a row without a step is at its position, as replay() takes it
            for index, row in enumerate(rows)
            if isinstance(row.get(name), (int, float))
        ]
        at = next((i for i, (s, _) in enumerate(series) if s >= step), len(series) - 1)
        out[name] = series[max(0, at - before) : at + after + 1]
    return out


def evidence_text(rows: Sequence[dict[str, Any]], finding: Finding) -> str:
    """evidence() in a line per metric: "val/ratio: 3: 0.99, 4: 0.98, [5: 0.52], 6: 0.5 (threshold 0.5)", the finding's
    step in brackets."""
    lines = []
    for name, points in evidence(rows, finding.step, finding.metrics).items():
        shown = ", ".join(
            f"[{step}: {value:.3g}]" if step == finding.step else f"{step}: {value:.3g}" for step, value in points
        )
        threshold = finding.thresholds.get(name)
        lines.append(f"{name}: {shown}" + (f" (threshold {threshold:.3g})" if threshold is not None else ""))
    return "\n".join(lines)
