"""The sandbox tests need bubblewrap (Debian/Ubuntu package `bubblewrap`). Without it they skip and say what to install;
with RLHFKIT_REQUIRE_SANDBOX=1 (CI, .ci/run) they fail instead, so a CI image that lost bwrap cannot pass by skipping."""

import pytest

from rlhfkit.sandbox.bwrap import INSTALL_LINE, find_bwrap
from tests.helpers import skip_or_fail

REQUIRE_ENV = "RLHFKIT_REQUIRE_SANDBOX"


def require_sandbox() -> None:
    """Skip (or fail under RLHFKIT_REQUIRE_SANDBOX=1) where bwrap is missing."""
    if find_bwrap() is not None:
        return
    skip_or_fail(f"the sandbox tests need bubblewrap: {INSTALL_LINE}", REQUIRE_ENV)


@pytest.fixture
def sandbox():
    """run_code, after require_sandbox()."""
    require_sandbox()
    from rlhfkit.sandbox import run_code

    return run_code
