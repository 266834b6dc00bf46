"""rlhfkit's health checks inside TRL's trainers (any transformers Trainer): a TrainerCallback that runs the rules on
every row the trainer logs.

    from rlhfkit.health import HealthCallback
    trainer = GRPOTrainer(..., callbacks=[HealthCallback()])      # or trainer.add_callback(HealthCallback())

Each new finding is printed with its advice and appended to <output_dir>/health.jsonl, as rlhfkit's own trainers do,
so ``rlhfkit doctor`` and ``rlhfkit report`` read it. With ``mode="stop"`` a critical finding ends training after a
checkpoint (the trainer's should_save, then should_training_stop). transformers logs training metrics under their bare
names (``reward``, ``kl``, ``entropy``: TRL's, which the rules read) and evaluation metrics as ``eval_<name>``, read
here as ``eval/<name>``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from rlhfkit.health.monitor import Finding, HealthMonitor
from rlhfkit.health.output import append_findings, print_finding
from rlhfkit.health.rules import CRITICAL, parse_thresholds
from rlhfkit.health.sources import rule_name

EVAL_PREFIX = "eval_"


def logged_row(logs: dict[str, Any]) -> dict[str, float]:
    """A transformers Trainer's logs as the rules read them: numbers only, ``eval_x`` as ``eval/x``."""
    row = {}
    for key, value in logs.items():
        name = rule_name("eval/" + key[len(EVAL_PREFIX) :] if key.startswith(EVAL_PREFIX) else key)
        if name is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            row[name] = float(value)
    return row


class HealthCallback(TrainerCallback):
    """The health rules over a transformers Trainer's logged rows. mode: "warn" (report findings) or "stop" (also end
    training on a critical one). thresholds: overrides, as --health_thresholds takes them. `findings`: every finding
    so far, in order."""

    def __init__(self, mode: str = "warn", thresholds: Any = None):
        if mode not in ("warn", "stop"):
            raise ValueError(f"HealthCallback mode={mode!r}: use 'warn' or 'stop'.")
        self.mode = mode
        self.monitor = HealthMonitor(parse_thresholds(thresholds))
        self.findings: list[Finding] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        row = logged_row(logs or {})
        if not row:
            return control
        new = self.monitor.observe(state.global_step, row)  # every process, so all decide alike
        self.findings += new
        if new and state.is_world_process_zero:
            for finding in new:
                print_finding(finding)
            if args.output_dir:
                append_findings(args.output_dir, new)
        if self.mode == "stop" and any(f.severity == CRITICAL for f in new):
            control.should_save = True
            control.should_training_stop = True
        return control
