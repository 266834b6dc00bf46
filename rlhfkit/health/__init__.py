"""Health checks: rules over the logged metric stream, live (HealthMonitor) and after a run (doctor).

During training, once per logged row::

    monitor = HealthMonitor(parse_thresholds(cfg.health_thresholds))
    findings = monitor.observe(step, scalars)           # only new findings
    scalars.update(monitor.summary_metrics())           # {"health/warnings": n, "health/critical": n}
    for finding in findings:
        print_finding(finding, console)
    append_findings(output_dir, findings)               # run_dir/health.jsonl

On --resume_from_checkpoint: ``monitor = resume_monitor(output_dir, thresholds, until_step=step)``
rebuilds the windows from metrics.jsonl without reporting again. After a run: ``doctor(run_dir)`` or ``rlhfkit doctor RUN_DIR`` (:func:`cmd_doctor`). The rules and
their thresholds are listed in docs/health.md.
"""

from rlhfkit.health.docs import render_markdown
from rlhfkit.health.doctor import Diagnosis, cmd_doctor, doctor, read_metrics, replay, resume_monitor
from rlhfkit.health.monitor import Finding, HealthMonitor
from rlhfkit.health.output import HEALTH_FILE, append_findings, finding_panel, print_finding, read_findings
from rlhfkit.health.rules import CRITICAL, INFO, RULES, SEVERITIES, WARNING, Hit, Rule, Thresholds, parse_thresholds

__all__ = [
    "CRITICAL",
    "HEALTH_FILE",
    "INFO",
    "RULES",
    "SEVERITIES",
    "WARNING",
    "Diagnosis",
    "Finding",
    "HealthMonitor",
    "Hit",
    "Rule",
    "Thresholds",
    "append_findings",
    "cmd_doctor",
    "doctor",
    "finding_panel",
    "parse_thresholds",
    "print_finding",
    "read_findings",
    "read_metrics",
    "render_markdown",
    "replay",
    "resume_monitor",
]
