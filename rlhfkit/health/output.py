"""Showing findings (rich) and keeping them in the run directory (health.jsonl, one Finding.to_dict() per line)."""

from __future__ import annotations

import os
from collections.abc import Iterable

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
