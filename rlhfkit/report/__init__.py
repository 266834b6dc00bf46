"""Reports of training runs: `rlhfkit report RUN [RUN ...] --out DIR`.

Reads only the run directories (format: rlhfkit/tracking/rundir.py) and writes a self-contained
report.html plus one PNG per chart:

    from rlhfkit.report import build_report
    build_report(["runs/a", "runs/b"], "report/", smooth=0.6)
"""

from rlhfkit.errors import ReportError
from rlhfkit.report.build import build_report, cmd_report
from rlhfkit.report.rundata import Run, load_run

__all__ = ["ReportError", "Run", "build_report", "cmd_report", "load_run"]
