"""`python -m rlhfkit.report RUN [RUN ...] --out DIR`: the same as `rlhfkit report`."""

import sys

from rlhfkit.report import cmd_report

sys.exit(cmd_report(sys.argv[1:]))
