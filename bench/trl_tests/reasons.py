"""Why rlhfkit fails a test of TRL's file that TRL passes: test id (or the id before its parameters) -> reason.

Kept by hand after each run of bench/trl_tests/run.py; a failing test without an entry shows its error message.
"""

REASONS: dict[str, str] = {}
