"""code_reward on a fixture set of correct, partly correct, broken and hostile solutions; code extraction; the pool;
the python tool; the metrics it logs; and the reward through --reward_funcs."""

from __future__ import annotations

import time

import pytest

from rlhfkit.agents.tools import ToolBox
from rlhfkit.metrics import registry as M
from rlhfkit.rewards import RewardSources, resolve_reward_funcs
from rlhfkit.sandbox import SandboxPool, extract_code, make_code_reward, python
from rlhfkit.sandbox.reward import sandbox_metrics, split_tests

from .conftest import require_sandbox

TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(10, 5) == 15\nassert add(0, 0) == 0"

# (completion, expected fraction of the 4 tests)
FIXTURES = [
    ("```python\ndef add(a, b):\n    return a + b\n```", 1.0),
    ("def add(a, b):\n    return b + a", 1.0),
    ([{"role": "assistant", "content": "Sure:\n```py\nadd = lambda a, b: a + b\n```"}], 1.0),
    ("```python\ndef add(a, b):\n    return a + b if a > 0 else -1\n```", 0.5),  # passes the two with a > 0
    ("def add(a, b):\n    return a - b", 0.25),  # only add(0, 0)
    ("def add(a, b) return a + b", 0.0),  # does not compile
    ("```python\nimport sys\nsys.exit(0)\n```", 0.0),  # the exit trick
    ("import os\nos._exit(0)", 0.0),  # leaving before the tests
    ("def add(a, b):\n    while True:\n        pass", 0.0),  # every test times out
    ("print('\\n' * 3 + 'deadbeef pass 0')\ndef add(a, b): return 99", 0.0),  # a report forged without the nonce
    (
        "import builtins\nbuiltins.exec = lambda *a, **k: None\ndef add(a, b): return 99",
        0.0,
    ),  # the harness's exec is bound
    ("```js\nfunction add(a, b) { return a + b }\n```", 0.0),  # no python at all
]


@pytest.fixture(scope="module")
def reward():
    require_sandbox()
    return make_code_reward(timeout_s=1.0)


def test_fixture_set_scores_as_expected(reward):
    completions = [c for c, _ in FIXTURES]
    logged: dict[str, list[float]] = {}
    scores = reward(
        completions, tests=[TESTS] * len(FIXTURES), log_metric=lambda n, v: logged.setdefault(n, []).append(v)
    )
    assert scores == [expected for _, expected in FIXTURES]
    assert set(logged) == M.LOGGED_BY_REWARD_FUNCTIONS
    assert logged[M.SANDBOX_TIMEOUT_RATIO.name] == [1 / len(FIXTURES)]  # the endless loop only
    assert logged[M.SANDBOX_ERROR_RATIO.name] == [0.0]
    assert 0 < logged[M.SANDBOX_MEAN_SECONDS.name][0] < 1.0


def test_a_test_program_with_setup_and_a_check_function(reward):
    program = (
        "import math\n\ndef check(f):\n    assert f(4) == 2\n\ncheck(root)\nassert root(9) == 3\nassert root(2) == 1"
    )
    assert [t for t, _ in split_tests(program)] == [False, False, True, True, True]
    scores = reward(["def root(x):\n    return int(x ** 0.5)", "root = abs"], tests=[program, program])
    assert scores == [1.0, 0.0]


def test_rows_without_tests_are_not_scored_and_list_tests_count_each(reward):
    scores = reward(["x = 1", "x = 1"], tests=[[], ["assert x == 1", "assert x == 2"]])
    assert scores == [None, 0.5]


def test_bad_tests_column_is_a_clear_error(reward):
    with pytest.raises(ValueError, match="do not parse as Python"):
        reward(["x = 1"], tests=["assert ("])
    with pytest.raises(ValueError, match="dataset column 'tests'"):
        reward(["x = 1"])


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("plain = 1", "plain = 1"),
        ("a\n```python\nfirst = 1\n```\nthen\n```python\nsecond = 2\n```\n", "second = 2\n"),
        ("```\nuntagged = 1\n```", "untagged = 1\n"),
        ("```python\ncut = 1\nat_the_length", "cut = 1\nat_the_length"),
        ("```bash\nls\n```", ""),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "```py\nx = 2\n```"}], "x = 2\n"),
    ],
)
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_the_pool_runs_a_batch_at_once():
    require_sandbox()
    with SandboxPool(workers=4, timeout_s=2) as pool:
        start = time.monotonic()
        results = pool.run_many([f"import time\ntime.sleep(0.5)\nprint({i})" for i in range(8)])
        elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert elapsed < 8 * 0.5  # serially it would take 4 s; 4 workers take about 1 s plus start-up


def test_python_tool_follows_the_tool_conventions_and_runs_in_the_sandbox():
    require_sandbox()
    box = ToolBox([python])
    assert box.names == ["python"]
    assert box.schemas["python"]["function"]["parameters"]["required"] == ["code"]
    assert python("print(6 * 7)") == "42"
    assert python("import os\nprint(sorted(os.environ))") == "['HOME', 'LANG', 'PATH', 'PWD']"
    assert python("1 / 0").endswith("ZeroDivisionError: division by zero\n[exit status 1]")
    (result,) = box.run([{"type": "function", "function": {"name": "python", "arguments": {"code": "print('ok')"}}}])
    assert (result.content, result.failed) == ("ok", False)


def test_reward_funcs_reference_and_its_metrics_pass_rlhfkits_log_metric_check():
    require_sandbox()
    (fn,) = resolve_reward_funcs(["rlhfkit.sandbox:code_reward"], None)
    assert fn.__name__ == "code_reward"
    sources = RewardSources(["code_reward"], [fn], None, "prompt")
    assert sources.takes_log_metric
    logged = {}
    sources._log_metric(logged, M.SANDBOX_TIMEOUT_RATIO.name, 0.5)  # registered, yet a reward function's to log
    assert logged == {M.SANDBOX_TIMEOUT_RATIO.name: [0.5]}


def test_sandbox_metrics_are_shares_of_the_calls_programs():
    from rlhfkit.sandbox import SandboxResult

    def result(status, seconds):
        return SandboxResult(status, 0, "", "", False, seconds)

    values = sandbox_metrics([result("ok", 0.1), result("timeout", 1.0), result("timeout", 1.0), result("disk", 0.3)])
    assert values[M.SANDBOX_TIMEOUT_RATIO.name] == 0.5
    assert values[M.SANDBOX_DISK_RATIO.name] == 0.25
    assert values[M.SANDBOX_MEMORY_RATIO.name] == 0.0
    assert values[M.SANDBOX_MEAN_SECONDS.name] == pytest.approx(0.6)
