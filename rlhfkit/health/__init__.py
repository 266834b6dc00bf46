"""Health checks: rules over the logged metric stream, during training and after it.

The rules and every threshold they use are data (rules.py, listed in docs/health.md). HealthMonitor
(monitor.py) runs them on each logged row and reports each episode of trouble once. During training,
HealthWatch (watch.py, the ``--health`` flag) prints the findings, appends them to health.jsonl,
raises tracker alerts and logs how many rules fire; after a run, ``rlhfkit doctor RUN_DIR`` (doctor.py)
replays metrics.jsonl through the same monitor.
"""

from rlhfkit.health.docs import render_markdown
from rlhfkit.health.doctor import Diagnosis, cmd_doctor, doctor
from rlhfkit.health.monitor import Finding, HealthMonitor, replay, resume_monitor
from rlhfkit.health.output import append_findings, finding_panel, print_finding
from rlhfkit.health.rules import CRITICAL, INFO, RULES, SEVERITIES, WARNING, Hit, Rule, Thresholds, parse_thresholds

__all__ = [
    "CRITICAL",
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
    "render_markdown",
    "replay",
    "resume_monitor",
]
