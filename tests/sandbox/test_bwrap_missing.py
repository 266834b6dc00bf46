"""Without bubblewrap: a clear refusal with the install line, unless the caller opts into the weaker mode, which warns
once and still applies the limits."""

from __future__ import annotations

import warnings

import pytest

from rlhfkit.errors import SandboxUnavailableError, UnsandboxedCodeWarning
from rlhfkit.sandbox import bwrap, run, run_code


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: None)
    monkeypatch.setattr(run, "_warned_unsandboxed", type(run._warned_unsandboxed)())  # a fresh "warned once"


def test_refuses_with_the_install_line(no_bwrap):
    with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap.*allow_unsandboxed=True"):
        run_code("print(1)")


def test_weaker_mode_warns_once_and_keeps_the_limits(no_bwrap):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = run_code("print('hi')", allow_unsandboxed=True)
        looped = run_code("while True:\n    pass", allow_unsandboxed=True, timeout_s=0.5)
        memory = run_code("x = bytearray(1 << 31)", allow_unsandboxed=True, memory_mb=128)
        flood = run_code("while True:\n    print('x' * 999)", allow_unsandboxed=True, max_output_bytes=5000)
    assert [w.category for w in caught] == [UnsandboxedCodeWarning]
    assert "apt-get install -y bubblewrap" in str(caught[0].message)
    assert (first.status, first.stdout, first.sandboxed) == ("ok", "hi\n", False)
    assert (looped.status, memory.status, flood.status) == ("timeout", "memory", "output_limit")


def test_the_sandbox_tests_fail_rather_than_skip_when_ci_requires_them(monkeypatch):
    from tests.sandbox import conftest

    monkeypatch.setattr(conftest, "find_bwrap", lambda: None)
    monkeypatch.delenv(conftest.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y bubblewrap"):
        conftest.require_sandbox()
    monkeypatch.setenv(conftest.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="RLHFKIT_REQUIRE_SANDBOX=1 requires it"):
        conftest.require_sandbox()
