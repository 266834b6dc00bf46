import random

import pytest

from rlhfkit.tasks import sort


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("12359", True),
        ("  12359\n", True),  # surrounding whitespace is ignored
        ("12359 x", False),  # trailing junk is wrong
        ("1235", False),  # truncated
        ("123599", False),  # extra digit
        ("52913", False),  # the input copied
        ("12349", False),  # sorted, but not the input's digits
        ("", False),
    ],
)
def test_check_hand_written(completion, expected):
    assert sort.check("sort 52913=", completion) is expected


def test_answer_keeps_duplicates():
    assert sort.answer("sort 3131=") == "1133"


def test_answer_rejects_foreign_prompt():
    with pytest.raises(ValueError, match="not a sort prompt"):
        sort.answer("37+45=")


def test_reward_funcs_follow_trl_convention():
    prompts = ["sort 52913=", "sort 52913=", "sort 4410="]
    completions = ["12359", "12395", "0144"]
    assert sort.correctness(prompts, completions, answer=["ignored"] * 3) == [1.0, 0.0, 1.0]
    # "12395" vs "12359": positions 0-2 match, 3-4 do not -> 3/5
    assert sort.partial_credit(prompts, completions) == [1.0, 3 / 5, 1.0]


def test_make_example_is_consistent_and_seeded():
    a = [sort.make_example(random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = sort.make_example(rng)
        digits = prompt[len("sort ") : -1]
        assert sort.MIN_LEN <= len(digits) <= sort.MAX_LEN
        assert sort.check(prompt, answer)
        assert len(answer) + 1 <= sort.TASK.max_new_tokens  # answer + EOS fits


def test_corruptions_are_always_wrong():
    rng = random.Random(1)
    for _ in range(500):
        prompt, answer = sort.make_example(rng)
        assert not sort.check(prompt, sort.corrupt(prompt, answer, rng))
