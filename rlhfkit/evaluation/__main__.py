"""`python -m rlhfkit.evaluation ...` runs `rlhfkit eval ...`."""

import sys

from .cli import cmd_eval

sys.exit(cmd_eval(sys.argv[1:]))
