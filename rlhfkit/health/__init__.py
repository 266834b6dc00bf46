"""Health checks: rules over the logged metric stream, during training and after it.

The rules and every threshold they use are data (rules.py, listed in docs/health.md). HealthMonitor
(monitor.py) runs them on each logged row and reports each episode of trouble once. During training,
HealthWatch (watch.py, the ``--health`` flag) prints the findings, appends them to health.jsonl,
raises tracker alerts and logs how many rules fire; after a run, ``rlhfkit doctor RUN`` (doctor.py)
replays its logged rows through the same monitor. sources.py picks the reader for a path: an rlhfkit run directory,
a TRL run's TensorBoard, W&B or Trackio logs, a ``trainer_state.json`` (trainer_state.py; from a Hub repo: hub.py), a
W&B history exported as CSV (wandb_csv.py) or verl's logs (verl.py); rows.py is what they hand over, and
frameworks.py maps other frameworks' metric names onto the rules'. Inside TRL's own trainers, HealthCallback
(callback.py) runs the rules live; findings are printed and written by output.py.

What the rules catch on a labelled run set, and docs/health.md's text, are measured and rendered outside the package,
by the health set's harness (bench/health/detection.py, docs.py, wild.py).
"""

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
