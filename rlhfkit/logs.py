"""rlhfkit's messages about a run's settings and inputs, through Python's ``logging`` as transformers' and TRL's are:
the ``rlhfkit`` logger (``logging.getLogger("rlhfkit")``), so a caller's log capture (``unittest``'s assertLogs, a
logging config) sees them and ``setLevel`` silences them.

By default it writes each message to standard error as ``rlhfkit: <message>``, to whatever ``sys.stderr`` is at the
time, and does not pass them on to the root logger, so that a program that configures logging does not print them
twice (transformers' default, as for its own ``transformers`` logger). Progress lines and tables are printed, not
logged (tracking/console.py).
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER = logging.getLogger("rlhfkit")


class _CurrentStderr(logging.StreamHandler):
    """A StreamHandler on the sys.stderr of each message's moment (a redirected or captured stream included)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it; the property always reads sys.stderr
        pass


if not LOGGER.handlers:
    _handler = _CurrentStderr()
    _handler.setFormatter(logging.Formatter("rlhfkit: %(message)s"))
    LOGGER.addHandler(_handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False


def note(text: str) -> None:
    """A setting that has no effect or was renamed, said once by the main process (a warning of the rlhfkit logger:
    ``rlhfkit: note: ...`` on standard error by default)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        LOGGER.warning("note: %s", text)
