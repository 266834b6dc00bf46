"""Showing findings (rich) and keeping them in the run directory (health.jsonl).

health.jsonl holds one finding per line, {"step", "rule", "severity", "metrics", "message", "advice"},
appended and closed at each write so that a crash loses nothing already reported. Non-finite metric
values are written as NaN / Infinity, as in metrics.jsonl (Python's json reads them back).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from rlhfkit.health.monitor import Finding

HEALTH_FILE = "health.jsonl"
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
    lines = [json.dumps(f.to_dict()) + "\n" for f in findings]
    if lines:
        with open(Path(run_dir) / HEALTH_FILE, "a", encoding="utf-8") as f:
            f.writelines(lines)


def read_findings(run_dir: str | os.PathLike) -> list[Finding]:
    """Findings recorded in run_dir/health.jsonl; [] when the file is missing. A torn line is skipped."""
    path = Path(run_dir) / HEALTH_FILE
    if not path.is_file():
        return []
    findings = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            findings.append(Finding.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # the line a crash cut short
    return findings
