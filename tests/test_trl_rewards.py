"""TRL 1.16's --reward_funcs conventions: its built-in reward names (rlhfkit.trl_rewards, checked against hand-computed
values), its dotted module.function references beside rlhfkit's, the resolution order, and the error messages."""

import pickle
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlhfkit import trl_rewards
from rlhfkit.errors import ConfigError
from rlhfkit.rewards import resolve_reward_funcs, reward_name, score_completions
from rlhfkit.trl_rewards import (
    accuracy_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)
from tests.trainers import grpo_rewards


def as_messages(texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


# ------------------------------------------------------------------------------------------------
# think_format_reward
# ------------------------------------------------------------------------------------------------

THINK_CASES = [
    ("<think>\nThis is my reasoning.\n</think>\nThis is my answer.", 1.0),
    ("<think>\nThis is my reasoning.\nThis is my answer.", 0.0),  # never closed
    ("<think></think>", 1.0),  # an empty block, nothing after it
    ("<think>a</think>b</think>c", 1.0),  # extra closing tags are fine
    ("<think>a</think><think>b</think>", 0.0),  # a second block
    ("<think>a<think>b</think>", 0.0),  # nested opening
    (" <think>a</think>", 0.0),  # must start the completion
    ("\n<think>a</think>", 0.0),  # ...even after a newline
    ("</think><think>a", 0.0),
    ("<think>a\n\n</think>\n\nline\nline", 1.0),  # newlines anywhere
    ("<THINK>a</THINK>", 0.0),  # case matters
    ("", 0.0),
]


@pytest.mark.parametrize("text, expected", THINK_CASES)
def test_think_format_reward_on_text_and_on_messages(text, expected):
    assert think_format_reward(as_messages([text])) == [expected]
    assert think_format_reward([text]) == [expected]  # TRL's version fails on text completions


def test_think_format_reward_refuses_what_is_not_a_completion():
    with pytest.raises(TypeError, match="a completion must be text or"):
        think_format_reward([{"content": "<think>a</think>"}])


# ------------------------------------------------------------------------------------------------
# get_soft_overlong_punishment
# ------------------------------------------------------------------------------------------------


def lengths(*ns):
    return [[7] * n for n in ns]


def test_soft_overlong_punishment_by_hand():
    punish = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    # free up to 80 tokens, then (80 - L) / 20 down to -1 at 100, -1 beyond
    assert punish(completion_ids=lengths(0, 80, 81, 90, 99, 100, 101, 500)) == [
        0.0, 0.0, -0.05, -0.5, -0.95, -1.0, -1.0, -1.0,
    ]  # fmt: skip
    assert punish(lengths(90)) == [-0.5]  # TRL's calling form: completion_ids positional
    no_cache = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=0)
    assert no_cache(completion_ids=lengths(0, 10, 11)) == [0.0, 0.0, -1.0]
    assert all(type(v) is float for v in punish(completion_ids=lengths(0, 90, 101)))


def test_soft_overlong_punishment_refuses_negative_lengths():
    with pytest.raises(ValueError, match="soft_punish_cache >= 0"):
        get_soft_overlong_punishment(100, -1)


def test_bare_name_uses_trl_scripts_lengths_and_trl_metric_name():
    (punish,) = resolve_reward_funcs(["get_soft_overlong_punishment"], None)
    assert (punish.max_completion_len, punish.soft_punish_cache) == (1280, 256)
    assert punish(completion_ids=lengths(1024, 1025, 1152, 1280, 1281)) == [0.0, -1 / 256, -0.5, -1.0, -1.0]
    assert reward_name(punish) == "soft_overlong_punishment_reward"  # rewards/<name>/mean as in TRL
    assert pickle.loads(pickle.dumps(punish))(completion_ids=lengths(1152)) == [-0.5]


# ------------------------------------------------------------------------------------------------
# accuracy_reward and reasoning_accuracy_reward (math_verify)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_math_verify(monkeypatch):
    """A stand-in math_verify: an answer is the text inside the first \\boxed{...}; the gold parses unless empty;
    verify compares strings. Records the calls, to check what rlhfkit hands math_verify."""
    calls = []

    def parse(text, extraction_config=None, extraction_mode=None, parsing_timeout=None):
        calls.append(("parse", text, extraction_mode, parsing_timeout))
        if extraction_config is None:  # the gold solution
            return [text.strip()] if text.strip() else []
        start = text.find("\\boxed{")
        return [text[start + 7 : text.index("}", start)]] if start >= 0 else []

    def verify(gold, answer, timeout_seconds=None):
        calls.append(("verify", gold, answer, timeout_seconds))
        return bool(answer) and gold[0] == answer[0]

    class LatexExtractionConfig:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class NormalizationConfig:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    mv = types.ModuleType("math_verify")
    mv.parse, mv.verify, mv.LatexExtractionConfig = parse, verify, LatexExtractionConfig
    l2s = types.ModuleType("latex2sympy2_extended")
    l2s.NormalizationConfig = NormalizationConfig
    monkeypatch.setitem(sys.modules, "math_verify", mv)
    monkeypatch.setitem(sys.modules, "latex2sympy2_extended", l2s)
    return calls


def test_accuracy_reward_plumbing(fake_math_verify):
    completions = [r"the answer is \boxed{7}", r"\boxed{8}", "no box", r"\boxed{1}"]
    solutions = ["7", "7", "7", "  "]  # the last gold does not parse: not applicable
    assert accuracy_reward(as_messages(completions), solutions) == [1.0, 0.0, 0.0, None]
    assert accuracy_reward(completions, solution=solutions) == [1.0, 0.0, 0.0, None]
    parse_answer = next(c for c in fake_math_verify if c[0] == "parse" and c[1] == completions[0])
    assert parse_answer[2] == "first_match" and parse_answer[3] == 10  # main thread: math_verify's timeouts on


def test_reasoning_accuracy_reward_plumbing(fake_math_verify):
    completions = [
        r"<think>maybe \boxed{8}</think> so \boxed{7}",  # only the text after </think> counts
        r"<think>a</think>b</think> \boxed{7}",  # after the last </think>
        r"<think>still thinking \boxed{7}",  # unfinished reasoning: 0, even though the gold does not parse
        r"\boxed{7}",
    ]
    solutions = ["7", "7", "", "7"]
    assert reasoning_accuracy_reward(as_messages(completions), solutions) == [1.0, 1.0, 0.0, 0.0]
    delimiters = ["ANSWER:", "</think>"]  # the first delimiter present wins
    assert reasoning_accuracy_reward(
        [r"<think>\boxed{8}</think> ANSWER: \boxed{7}", r"x </think>\boxed{7}"], ["7", "7"], delimiters
    ) == [1.0, 1.0]


def test_accuracy_reward_needs_a_solution_column(fake_math_verify):
    with pytest.raises(ValueError, match="'solution' column"):
        accuracy_reward(["x"])


def test_accuracy_rewards_with_math_verify():
    pytest.importorskip("math_verify")
    completions = as_messages([r"My answer is \boxed{\frac{1}{3}}", r"My answer is \boxed{\frac{1}{2}}"])
    assert accuracy_reward(completions, [r"\frac{1}{3}"] * 2) == [1.0, 0.0]
    reasoned = [r"<think> Reasoning </think> The final answer is \boxed{\frac{1}{3}}", r"<think> \boxed{\frac{1}{3}}"]
    assert reasoning_accuracy_reward(reasoned, solution=[r"\frac{1}{3}"] * 2) == [1.0, 0.0]


@pytest.mark.parametrize("name", ["accuracy_reward", "reasoning_accuracy_reward"])
def test_math_verify_rewards_resolve_when_it_is_importable(fake_math_verify, name):
    assert resolve_reward_funcs([name], None) == [getattr(trl_rewards, name)]


@pytest.mark.parametrize("name", ["accuracy_reward", "reasoning_accuracy_reward"])
def test_math_verify_missing_is_a_config_error_saying_how_to_install_it(monkeypatch, name):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` raises ImportError
    with pytest.raises(ConfigError) as info:
        resolve_reward_funcs([name], None)
    message = str(info.value)
    assert f"--reward_funcs {name!r}" in message
    assert "math_verify package" in message and "pip install math-verify" in message
    with pytest.raises(ConfigError, match="pip install math-verify"):  # called directly, too
        getattr(trl_rewards, name)(["x"], ["1"])


# ------------------------------------------------------------------------------------------------
# Through score_completions: conversational and text prompts
# ------------------------------------------------------------------------------------------------


def score(funcs, prompts, completions, token_lengths):
    n = len(completions)
    mask = torch.tensor([[j < length for j in range(4)] for length in token_lengths])
    ids = torch.arange(4 * n).view(n, 4)
    rows = [{"prompt": p} for p in prompts]
    names = [reward_name(f) for f in funcs]
    return score_completions(names, funcs, rows, prompts, completions, (ids, mask), (ids, mask), "prompt")


@pytest.mark.parametrize(
    "prompts",
    [["q0", "q1"], [[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}]]],
    ids=["text", "conversational"],
)
def test_trl_builtins_score_text_and_conversational_completions(prompts):
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    funcs = [*resolve_reward_funcs(["think_format_reward"], None), get_soft_overlong_punishment(4, 2), spy]
    think, overlong, _ = score(funcs, prompts, ["<think>a</think>b", "b"], token_lengths=[4, 3])
    assert think.values.tolist() == [1.0, 0.0]
    assert overlong.values.tolist() == [-1.0, -0.5]  # lengths 4 and 3 with 2 free tokens, 2 of cache
    conversational = isinstance(prompts[0], list)
    assert seen[1] == ([{"role": "assistant", "content": "b"}] if conversational else "b")


# ------------------------------------------------------------------------------------------------
# Resolution: the task's names, TRL's names, then references
# ------------------------------------------------------------------------------------------------


def own_think_format(prompts, completions, **kwargs):
    return [0.5] * len(completions)


def test_task_names_come_before_trl_names():
    task = SimpleNamespace(reward_funcs={"think_format_reward": own_think_format})
    assert resolve_reward_funcs(["think_format_reward"], task) == [own_think_format]
    assert resolve_reward_funcs(["think_format_reward"], None) == [think_format_reward]


def test_trl_dotted_references_beside_rlhfkits_forms():
    refs = ["tests.trainers.grpo_rewards.half_none", "tests.trainers.grpo_rewards:always_none"]
    assert resolve_reward_funcs(refs, None) == [grpo_rewards.half_none, grpo_rewards.always_none]
    # TRL's own module path names rlhfkit's version too
    assert resolve_reward_funcs(["rlhfkit.trl_rewards.think_format_reward"], None) == [think_format_reward]


def test_references_are_imported_from_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "my_trl_rewards.py").write_text(
        "def brevity(prompts, completions, **kwargs):\n    return [-len(c) for c in completions]\n"
        "async def judge(prompts, completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the import adds the current directory
    monkeypatch.delitem(sys.modules, "my_trl_rewards", raising=False)
    dotted, colon, judge = resolve_reward_funcs(
        ["my_trl_rewards.brevity", "my_trl_rewards:brevity", "my_trl_rewards.judge"], None
    )
    assert dotted is colon and dotted(prompts=["p"], completions=["abc"]) == [-3]
    (file_brevity,) = resolve_reward_funcs(["my_trl_rewards.py:brevity"], None)
    assert file_brevity(prompts=["p"], completions=["ab"]) == [-2]
    assert score([judge], ["q"], ["c"], token_lengths=[1])[0].values.tolist() == [1.0]  # async: awaited
    monkeypatch.delitem(sys.modules, "my_trl_rewards", raising=False)


ACCEPTED = ["'module:function'", "'path/to/file.py:function'", "'module.function'"]


@pytest.mark.parametrize(
    "value, needles",
    [
        # not a name, and not a reference
        ("think_format", ["is not a built-in reward of the task (built-in: none without --task)",
                          "nor one of TRL's built-in rewards (think_format_reward, get_soft_overlong_punishment",
                          *ACCEPTED]),
        # dotted: no such module
        ("no_such_module.f", ["cannot import 'no_such_module'", "TRL's dotted 'module.function' reference",
                              "module 'no_such_module', function 'f'", *ACCEPTED]),
        # dotted: no such function
        ("tests.trainers.grpo_rewards.missing", ["'tests.trainers.grpo_rewards' has no function 'missing'",
                                                 "TRL's dotted 'module.function' reference", *ACCEPTED]),
        # rlhfkit's form: no such module, no such function, no such file
        ("no_such_module:f", ["cannot import 'no_such_module'", "'module:function' or", *ACCEPTED]),
        ("tests.trainers.grpo_rewards:missing", ["has no function 'missing'", *ACCEPTED]),
        ("nope/rewards.py:f", ["the file 'nope/rewards.py' does not exist"]),
        # a file without its function
        ("my_rewards.py", ["name the function in the file too, as 'my_rewards.py:function'"]),
    ],
)  # fmt: skip
def test_wrong_references_name_the_flag_the_value_what_was_tried_and_the_forms(value, needles):
    with pytest.raises(ConfigError) as info:
        resolve_reward_funcs([value], None)
    message = str(info.value)
    assert message.startswith(f"--reward_funcs {value!r}"), message
    for needle in needles:
        assert needle in message, (needle, message)


def test_unknown_name_lists_the_tasks_names():
    task = SimpleNamespace(reward_funcs={"correctness": own_think_format, "partial_credit": own_think_format})
    with pytest.raises(ConfigError, match=r"built-in: correctness, partial_credit\)"):
        resolve_reward_funcs(["correct"], task)


def test_bad_dotted_reference_exits_2_from_the_cli(tiny_assets, tmp_path, capsys):
    from rlhfkit.cli import main

    out = tmp_path / "out"
    argv = [
        "grpo", "--model_name_or_path", str(tiny_assets / "sft"), "--dataset_name", str(tiny_assets / "prompts"),
        "--output_dir", str(out), "--report_to", "none", "--num_generations", "4", "--per_device_train_batch_size",
        "8", "--max_steps", "1", "--max_completion_length", "8", "--num_sample_generations", "0",
        "--reward_funcs", "think_format_reward", "tests.trainers.grpo_rewards.missing",
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "has no function 'missing'" in err and "Traceback" not in err
