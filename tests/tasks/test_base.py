import random

import pytest

from rlhfkit.tasks import TASKS, addition, reverse
from rlhfkit.tasks.base import generic_corruption, import_ref, positional_credit


def test_positional_credit_hand_computed():
    assert positional_credit("abc", "abc") == 1.0
    assert positional_credit(" abc ", "abc") == 1.0
    assert positional_credit("abd", "abc") == 2 / 3
    assert positional_credit("abcde", "abc") == 3 / 5  # extra characters cost
    assert positional_credit("", "abc") == 0.0
    assert positional_credit("", "") == 1.0


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_corruption_is_wrong_and_answer_checks(name):
    task = TASKS[name]
    rng = random.Random(0)
    for _ in range(300):
        prompt, answer = task.make_example(rng)
        assert task.check(prompt, answer)
        assert not task.check(prompt, task.corrupt(prompt, answer, rng))
        # the code task's reward runs its tests in the sandbox: tests/sandbox/test_training.py
        if "correctness" in task.reward_funcs:
            assert task.reward_funcs["correctness"]([prompt], [answer]) == [1.0]


def test_other_tasks_hand_written():
    assert addition.check("37+45=", "82") and not addition.check("37+45=", "83")
    assert reverse.check("rev kqzt=", "tzqk") and not reverse.check("rev kqzt=", "kqzt")


def test_generic_corruption_never_returns_answer():
    rng = random.Random(3)
    for answer in ["", "1", "11", "123", "99999"]:
        for _ in range(100):
            assert generic_corruption(answer, "0123456789", rng) != answer


def test_import_ref():
    from rlhfkit.tasks.sort import check

    assert import_ref("rlhfkit.tasks.sort:check") is check
    with pytest.raises(ValueError, match="module:function"):
        import_ref("rlhfkit.tasks.sort.check")
