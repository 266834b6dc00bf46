"""The sandbox tests need bubblewrap (Debian/Ubuntu package `bubblewrap`). Without it they skip and say what to install;
with RLHFKIT_REQUIRE_SANDBOX=1 (CI, .ci/run) they fail instead, so a CI image that lost bwrap cannot pass by skipping."""

import os

import pytest

from rlhfkit.sandbox.bwrap import INSTALL_LINE, find_bwrap

REQUIRE_ENV = "RLHFKIT_REQUIRE_SANDBOX"


def require_sandbox() -> None:
    """Skip (or fail under RLHFKIT_REQUIRE_SANDBOX=1) where bwrap is missing."""
    if find_bwrap() is not None:
        return
    reason = f"the sandbox tests need bubblewrap: {INSTALL_LINE}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}; {REQUIRE_ENV}=1 requires it", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def sandbox():
    """run_code, after require_sandbox()."""
    require_sandbox()
    from rlhfkit.sandbox import run_code

    return run_code
