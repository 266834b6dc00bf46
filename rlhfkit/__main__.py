"""``python -m rlhfkit ...`` is ``rlhfkit ...`` (handy under ``accelerate launch -m rlhfkit``)."""

import sys

from rlhfkit.cli import main

sys.exit(main())
