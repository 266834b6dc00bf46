"""Reports of training runs: `rlhfkit report RUN [RUN ...] --out DIR`.

Reads rlhfkit run directories (format: rlhfkit/tracking/rundir.py) and every run `rlhfkit doctor` reads (a TRL
trainer_state.json, a Hub repo id, TensorBoard, W&B, a verl log; rlhfkit/health/sources.py), and writes a
self-contained report.html plus one PNG per chart:

    from rlhfkit.report import build_report
    build_report(["runs/a", "runs/b"], "report/", smooth=0.6)
"""

from rlhfkit.errors import ReportError
from rlhfkit.report.build import build_report, cmd_report
from rlhfkit.report.rundata import Run, load_run

__all__ = ["ReportError", "Run", "build_report", "cmd_report", "load_run"]
