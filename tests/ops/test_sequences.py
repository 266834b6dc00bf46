import pytest
import torch

from rlhfkit import ops


def reference_first_true(row):
    return next((t for t, v in enumerate(row) if v), len(row))


def reference_last_true(row):
    return max((t for t, v in enumerate(row) if v), default=-1)


def test_first_and_last_true_index_hand_computed():
    bools = torch.tensor(
        [
            [False, True, False, True],  # first 1, last 3
            [False, False, False, False],  # none: first T = 4, last -1
            [True, False, False, False],  # first 0, last 0
            [True, True, True, True],  # first 0, last 3
        ]
    )
    assert ops.first_true_index(bools).tolist() == [1, 4, 0, 0]
    assert ops.last_true_index(bools).tolist() == [3, -1, 0, 3]
    assert ops.first_true_index(bools).dtype == torch.long


def test_first_and_last_true_index_match_reference_loop():
    bools = torch.rand(50, 9, generator=torch.Generator().manual_seed(0)) < 0.15
    rows = bools.tolist()
    assert ops.first_true_index(bools).tolist() == [reference_first_true(r) for r in rows]
    assert ops.last_true_index(bools).tolist() == [reference_last_true(r) for r in rows]


def test_index_helpers_on_zero_width():
    empty = torch.zeros(3, 0, dtype=torch.bool)
    assert ops.first_true_index(empty).tolist() == [0, 0, 0]  # T = 0
    assert ops.last_true_index(empty).tolist() == [-1, -1, -1]


def test_truncate_after_stop_token_hand_computed():
    responses = torch.tensor(
        [
            [5, 2, 7, 2, 8],  # stop 2 at t=1: keep [5, 2], pad the rest (including the second 2)
            [5, 6, 7, 8, 9],  # no stop token: unchanged
            [2, 6, 7, 8, 9],  # stop first: only the stop token stays
            [5, 6, 7, 8, 2],  # stop last: unchanged
        ]
    )
    expected = torch.tensor([[5, 2, 0, 0, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0], [5, 6, 7, 8, 2]])
    assert torch.equal(ops.truncate_after_stop_token(responses, 2, pad_token_id=0), expected)


def test_truncate_with_several_stop_tokens_and_pad_equal_to_eos():
    responses = torch.tensor([[5, 3, 2, 7], [5, 6, 2, 3], [9, 9, 9, 9]])
    # stops {2, 3}: the first of either ends the response; pad id 2 (= EOS) fills the rest
    expected = torch.tensor([[5, 3, 2, 2], [5, 6, 2, 2], [9, 9, 9, 9]])
    assert torch.equal(ops.truncate_after_stop_token(responses, [2, 3], pad_token_id=2), expected)
    assert torch.equal(ops.truncate_after_stop_token(responses, (3, 2), pad_token_id=2), expected)


def test_truncate_matches_reference_loop():
    g = torch.Generator().manual_seed(1)
    responses = torch.randint(0, 6, (40, 8), generator=g)
    out = ops.truncate_after_stop_token(responses, [1, 4], pad_token_id=-1)
    for row, got in zip(responses.tolist(), out.tolist()):
        end = reference_first_true([tok in (1, 4) for tok in row])
        assert got == row[: end + 1] + [-1] * (len(row) - end - 1)


@pytest.mark.parametrize("T", [0, 1, 5])
def test_mask_from_lengths(T):
    lengths = torch.tensor([0, 1, T, max(T - 2, 0)])
    mask = ops.mask_from_lengths(lengths, T)
    assert mask.dtype == torch.bool and mask.shape == (4, T)
    for b, n in enumerate(lengths.tolist()):
        assert mask[b].tolist() == [t < n for t in range(T)]
    # round trip: counting the mask gives the lengths back, the last real token is at length - 1
    assert mask.sum(-1).tolist() == lengths.clamp(max=T).tolist()
    assert ops.last_true_index(mask).tolist() == (lengths.clamp(max=T) - 1).tolist()


def test_mask_from_lengths_hand_computed():
    assert ops.mask_from_lengths(torch.tensor([2, 0, 3]), 3).tolist() == [
        [True, True, False],
        [False, False, False],
        [True, True, True],
    ]


def test_last_true_value_reads_each_row_at_its_last_real_token():
    # A left-padded prompt and a right-padded completion: the score is the last real token's (a reward model's).
    values = torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]])
    mask = torch.tensor([[False, True, True, False], [True, True, True, True], [False, False, False, False]])
    torch.testing.assert_close(ops.last_true_value(values, mask), torch.tensor([2.0, 7.0, 8.0]))  # none: the first


def test_eos_trick_replaces_then_subtracts_on_unterminated_completions_only():
    scores = torch.tensor([1.0, 2.0, 3.0])
    terminated = torch.tensor([True, False, False])
    same = ops.apply_eos_trick(scores, terminated, None, False, -1.0)
    assert torch.equal(same, scores) and same is not scores  # a copy: the caller's scores stay
    torch.testing.assert_close(
        ops.apply_eos_trick(scores, terminated, 0.5, False, -1.0), torch.tensor([1.0, 1.5, 2.5])
    )
    torch.testing.assert_close(
        ops.apply_eos_trick(scores, terminated, None, True, -1.0), torch.tensor([1.0, -1.0, -1.0])
    )
    torch.testing.assert_close(
        ops.apply_eos_trick(scores, terminated, 0.5, True, -1.0), torch.tensor([1.0, -1.5, -1.5])
    )
    assert torch.equal(scores, torch.tensor([1.0, 2.0, 3.0]))
