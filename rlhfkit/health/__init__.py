"""Health checks: rules over the logged metric stream, during training and after it.

The rules and every threshold they use are data (rules.py, listed in docs/health.md). HealthMonitor
(monitor.py) runs them on each logged row and reports each episode of trouble once. During training,
HealthWatch (watch.py, the ``--health`` flag) prints the findings, appends them to health.jsonl,
raises tracker alerts and logs how many rules fire; after a run, ``rlhfkit doctor RUN`` (doctor.py)
replays its logged rows through the same monitor: an rlhfkit run directory, or a TRL run's TensorBoard, W&B or
Trackio logs (sources.py). Inside TRL's own trainers, HealthCallback (callback.py) runs them live. detection.py
measures what the rules catch on a labelled run set.
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
    "HealthCallback",
]


def __getattr__(name: str):
    # The callback imports transformers (slow): only when asked for, so `rlhfkit doctor` starts at once.
    if name == "HealthCallback":
        from rlhfkit.health.callback import HealthCallback

        return HealthCallback
    raise AttributeError(f"module 'rlhfkit.health' has no attribute {name!r}")
