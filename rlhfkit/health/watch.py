"""Health checks wired into a training run: the `--health` flag.

Each logged row goes through :meth:`HealthWatch.observe`, which adds the ``health/*`` scalars to the row and, for
each new finding, prints it, appends it to health.jsonl and raises a tracker alert (Trackio / W&B). With
``--health stop`` a critical finding ends training: the run saves a checkpoint and raises
:class:`rlhfkit.errors.HealthStop`, whose message explains what happened and what to do; the CLI exits with status 3.
"""

from __future__ import annotations

import torch

from rlhfkit.errors import ConfigError
from rlhfkit.health.monitor import Finding, HealthMonitor, resume_monitor
from rlhfkit.health.output import append_findings, print_finding
from rlhfkit.health.rules import CRITICAL, HEALTH_MODES, parse_thresholds


class HealthWatch:
    """The health monitor of one run. Every process calls observe() (decisions stay in step); only the main
    process prints, writes and alerts."""

    def __init__(self, mode: str, thresholds, logger, accelerator, resume_step: int | None = None):
        """resume_step: a resumed run rebuilds the rules' windows from metrics.jsonl up to that step."""
        if mode not in HEALTH_MODES:
            raise ValueError(f"health={mode!r}: use one of {', '.join(HEALTH_MODES)}")
        self.mode = mode
        self.logger = logger
        self.accelerator = accelerator
        try:
            parsed = parse_thresholds(thresholds)
        except ValueError as e:
            raise ConfigError(f"health_thresholds={thresholds!r}: {e}") from None
        if mode == "off":
            self.monitor = None
        elif resume_step:
            self.monitor = resume_monitor(logger.output_dir, parsed, until_step=resume_step)
        else:
            self.monitor = HealthMonitor(parsed)

    def observe(self, step: int, scalars: dict) -> Finding | None:
        """Check one logged row; adds health/* to `scalars` in place. Returns the critical finding that should stop
        training (only with --health stop, agreed by every process), else None."""
        if self.monitor is None:
            return None
        findings = self.monitor.observe(step, scalars)
        scalars.update(self.monitor.summary_metrics())
        if self.accelerator.is_main_process and findings:
            for finding in findings:
                print_finding(finding, self.logger.console)
                self.logger.alert(
                    f"{finding.rule} ({finding.severity})", f"{finding.message} {finding.advice}", finding.severity
                )
            with self.logger.recording():
                append_findings(self.logger.output_dir, findings)
        critical = next((f for f in findings if f.severity == CRITICAL), None)
        if self.mode != "stop":
            return None
        flag = torch.tensor([1.0 if critical else 0.0], device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            flag = self.accelerator.reduce(flag, "max")
        if flag.item() == 0:
            return None
        return critical or Finding(step, "critical finding on another process", CRITICAL, {}, "", "")
