"""code_reward: the fraction of a dataset row's unit tests that a completion's code passes, each completion run in its
own sandbox, a batch at once on the pool (a reward function with TRL's signature).

The code. A completion's code is the last fenced block tagged python (```python, ```py, ```python3) or untagged;
without a closed block, what follows an opening fence (a completion cut at the length limit); without any fence, the
whole text. A conversational completion (a list of messages) gives its last assistant message's content.

The tests. The ``tests`` column holds, per row, either a list of test snippets (each one test, e.g. an assert), or one
text: a test program whose top-level ``assert`` statements and expression statements (``check(candidate)``) are the
tests, and whose other statements (imports, definitions, assignments) set them up, run in order. The text is parsed
here with ``ast`` (never executed here); the completion's code is not parsed here at all.

How it is counted: one sandbox per completion. A harness runs the code, then each setup step and test in order, each
test in its own try, and reports each test that passed on stdout, tagged with a random nonce that it reads from stdin
(so the code cannot print a passing report without first finding the nonce in the harness's memory). The reward is
(tests reported passed) / (tests). A test that raises, fails, or never runs (the code timed out, exhausted memory,
exited early) counts as failed; code that does not compile fails every test. The ``exit()`` trick fails too: the
harness catches SystemExit. What it cannot stop: code that rebinds what the tests compare (an object equal to
everything) or reads the nonce out of the harness's frames. Tests that must resist those need their own process.

Logged per call with ``log_metric`` (TRL 1.16; rlhfkit's registry documents them): the share of programs by ending
(sandbox/timeout_ratio, memory_ratio, error_ratio, output_limit_ratio, disk_ratio) and sandbox/mean_seconds.
"""

from __future__ import annotations

import ast
import re
import secrets
import threading
from collections.abc import Callable, Sequence

from rlhfkit.metrics import registry as M

from .limits import SandboxLimits, limits_from
from .pool import SandboxPool
from .result import SandboxResult

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*)\Z", re.DOTALL)
PYTHON_TAGS = frozenset({"", "python", "py", "python3"})

# The ending of a program -> the metric of its share of the call's programs.
STATUS_METRICS: dict[str, M.Metric] = {
    "timeout": M.SANDBOX_TIMEOUT_RATIO,
    "memory": M.SANDBOX_MEMORY_RATIO,
    "error": M.SANDBOX_ERROR_RATIO,
    "output_limit": M.SANDBOX_OUTPUT_LIMIT_RATIO,
    "disk": M.SANDBOX_DISK_RATIO,
}

# Everything the harness calls is bound as a default argument when _main is defined, before the code runs: code that
# rebinds builtins.exec or sys.stdout cannot turn the harness's own calls into no-ops or fake reports.
HARNESS = """\
import sys
def _main(solution, steps, write=sys.stdout.write, flush=sys.stdout.flush, readline=sys.stdin.readline, exec=exec,
          compile=compile, enumerate=enumerate, str=str, type=type, BaseException=BaseException):
    nonce = readline().strip()
    sys.stdin.close()
    def report(text):
        write("\\n" + nonce + " " + text + "\\n")
        flush()
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(solution, "<solution>", "exec"), namespace)
    except BaseException as error:
        report("solution " + type(error).__name__)
    for index, (is_test, source) in enumerate(steps):
        try:
            exec(compile(source, "<test>", "exec"), namespace)
        except BaseException:
            continue
        if is_test:
            report("pass " + str(index))
    report("done")
_main(SOLUTION, STEPS)
"""


def completion_text(completion) -> str:
    """A completion's text: itself when a string; a conversation's last assistant message's content (TRL's
    conversational completions); "" when there is none."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    for message in reversed(list(completion or [])):
        if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # multimodal parts: their text
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content if isinstance(content, str) else ""
    return ""


def extract_code(completion) -> str:
    """The code of a completion (module docstring): the last python or untagged fenced block, else what follows an
    unclosed fence, else the whole text."""
    text = completion_text(completion)
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in PYTHON_TAGS]
    if blocks:
        return blocks[-1]
    last_fence = text.rfind("```")
    if last_fence >= 0:
        tail = _OPEN_FENCE.match(text, last_fence)
        if tail and tail.group(1).lower() in PYTHON_TAGS:
            return tail.group(2)
        if _FENCE.search(text):  # closed blocks in other languages only: no python here
            return ""
    return text


def split_tests(tests) -> list[tuple[bool, str]]:
    """(is_test, source) of each step of one row's tests (module docstring). Raises ValueError for a test program that
    does not parse or tests of another type."""
    if isinstance(tests, str):
        try:
            tree = ast.parse(tests)
        except SyntaxError as e:
            raise ValueError(f"the tests do not parse as Python (line {e.lineno}: {e.msg}): {tests[:200]!r}") from None
        return [(isinstance(node, (ast.Assert, ast.Expr)), ast.unparse(node)) for node in tree.body]
    if isinstance(tests, Sequence) and all(isinstance(t, str) for t in tests):
        return [(True, t) for t in tests]
    raise ValueError(
        f"tests must be a test program (str) or a list of test snippets (list of str), got {type(tests).__name__}"
    )


def harness_program(code: str, steps: list[tuple[bool, str]]) -> str:
    """The program one sandbox runs for one completion: the code and the steps as literals, then HARNESS."""
    return f"SOLUTION = {code!r}\nSTEPS = {steps!r}\n{HARNESS}"


def passed_tests(result: SandboxResult, nonce: str, steps: list[tuple[bool, str]]) -> int:
    """How many of `steps`' tests the harness reported passed (lines "<nonce> pass <index>" of a test step)."""
    tests = {i for i, (is_test, _) in enumerate(steps) if is_test}
    passed = set()
    prefix = nonce + " pass "
    for line in result.stdout.splitlines():
        if line.startswith(prefix):
            index = line[len(prefix) :].strip()
            if index.isdigit() and int(index) in tests:
                passed.add(int(index))
    return len(passed)


def sandbox_metrics(results: Sequence[SandboxResult]) -> dict[str, float]:
    """The sandbox/* values of one call: each ending's share of the programs, and their mean wall-clock seconds."""
    n = len(results)
    values = {metric.name: sum(r.status == status for r in results) / n for status, metric in STATUS_METRICS.items()}
    values[M.SANDBOX_MEAN_SECONDS.name] = sum(r.seconds for r in results) / n
    return values


def make_code_reward(
    *,
    workers: int | None = None,
    python: str | None = None,
    allow_unsandboxed: bool = False,
    limits: SandboxLimits | None = None,
    name: str = "code_reward",
    **limit_overrides,
) -> Callable[..., list[float | None]]:
    """A code_reward with its own limits, interpreter and pool size (run_code's and SandboxPool's keywords); `name` is
    its __name__, which names its metrics (rewards/<name>/mean). The pool starts on the first call."""
    limits = limits_from(limits, **limit_overrides)
    lock, pools = threading.Lock(), []

    def pool() -> SandboxPool:
        with lock:
            if not pools:
                pools.append(SandboxPool(workers, python=python, allow_unsandboxed=allow_unsandboxed, limits=limits))
            return pools[0]

    def code_reward(completions, tests=None, log_metric=None, **kwargs) -> list[float | None]:
        if tests is None:
            raise ValueError(
                "code_reward needs the dataset column 'tests' (a test program or a list of tests per row)"
            )
        if len(tests) != len(completions):
            raise ValueError(f"code_reward got {len(tests)} rows of tests for {len(completions)} completions")
        steps = [split_tests(t) for t in tests]
        nonces = [secrets.token_hex(16) for _ in completions]
        runs = [i for i, s in enumerate(steps) if any(is_test for is_test, _ in s)]
        programs = [harness_program(extract_code(completions[i]), steps[i]) for i in runs]
        results = pool().run_many(programs, [nonces[i] + "\n" for i in runs])
        scores: list[float | None] = [None] * len(completions)  # a row without tests: the reward does not apply
        for i, result in zip(runs, results):
            total = sum(is_test for is_test, _ in steps[i])
            scores[i] = passed_tests(result, nonces[i], steps[i]) / total
        if log_metric is not None and results:
            for metric, value in sandbox_metrics(results).items():
                log_metric(metric, value)
        return scores

    code_reward.__name__ = code_reward.__qualname__ = name
    code_reward.__doc__ = (
        "Fraction of each row's tests (dataset column 'tests') that the completion's code passes, run in the sandbox "
        "(rlhfkit/sandbox/reward.py)."
    )
    return code_reward


code_reward = make_code_reward()
