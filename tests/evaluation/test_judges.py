"""The task judge and the reward-model judge on hand-made cases."""

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhfkit.errors import JudgeError, ModelLoadError
from rlhfkit.evaluation import Outcome, PairwiseJudge, RewardModelJudge, TaskJudge, make_judge
from rlhfkit.tasks import load_task


def test_task_judge_prefers_correct_and_ties_equal_correctness(tiny_assets):
    judge = make_judge("task", task_dir=lambda: tiny_assets)
    assert isinstance(judge, PairwiseJudge) and judge.name == "task:sort"
    prompts = ["sort 3142=", "sort 3142=", "sort 9071=", "sort 9071=", "sort 5555="]
    a = ["1234", "1243", "0179", "0197", " 5555 "]  # right, wrong, right, wrong, right (surrounding spaces ignored)
    b = ["1243", "1234", "0179", "0719", "555"]  # wrong, right, right, wrong, wrong
    outcomes = [v.outcome for v in judge.judge(prompts, a, b)]
    assert outcomes == [Outcome.A, Outcome.B, Outcome.TIE, Outcome.TIE, Outcome.A]


def test_task_judge_rejects_prompts_of_another_task(tiny_assets):
    judge = TaskJudge.from_dir(tiny_assets)
    with pytest.raises(JudgeError, match="cannot check prompt 'Summarize this post'.*reward-model:PATH"):
        judge.judge(["Summarize this post"], ["x"], ["y"])


def test_task_judge_needs_task_json(tmp_path):
    with pytest.raises(JudgeError, match="--task .* has no task.json"):
        make_judge("task", task_dir=lambda: tmp_path)


def reference_score(model, tokenizer, prompt: str, completion: str) -> float:
    """The reward model's own forward on one unpadded sequence: prompt + completion + EOS, score at the last token."""
    ids = tokenizer(prompt + completion)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def test_reward_model_judge_follows_the_models_scores(tiny_assets):
    path = tiny_assets / "reward"
    judge = make_judge(f"reward-model:{path}", task_dir=lambda: tiny_assets, batch_size=3)
    assert judge.name == f"reward-model:{path}"
    task = load_task(tiny_assets)
    prompts = ["sort 3142=", "sort 90710=", "sort 555123=", "sort 8080=", "sort 1111="]
    a = [task.answer(p) for p in prompts]  # gold answers, lengths 4 to 6
    b = ["1243", "0", "5512339", "8800", "1111"]  # near misses of other lengths, and one identical answer
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    ref_a = [reference_score(model, tokenizer, p, c) for p, c in zip(prompts, a)]
    ref_b = [reference_score(model, tokenizer, p, c) for p, c in zip(prompts, b)]

    # Batched, left-padded scores (batch_size=3 splits the pairs unevenly) equal one-at-a-time scores.
    torch.testing.assert_close(torch.tensor(judge.scores(prompts + prompts, a + b)), torch.tensor(ref_a + ref_b))
    verdicts = judge.judge(prompts, a, b)
    expected = [Outcome.A if sa > sb else Outcome.B if sb > sa else Outcome.TIE for sa, sb in zip(ref_a, ref_b)]
    assert [abs(sa - sb) > 1e-3 for sa, sb in zip(ref_a[:4], ref_b[:4])] == [True] * 4  # well separated: no flakes
    assert [v.outcome for v in verdicts] == expected
    assert {Outcome.A, Outcome.B} <= set(expected)  # the hand-made pairs go both ways
    assert verdicts[4].outcome is Outcome.TIE  # identical completions tie exactly
    assert verdicts[0].raw == f"a {ref_a[0]:.4g}, b {ref_b[0]:.4g}"


def test_reward_model_judge_ties_equal_scores_of_different_completions(tiny_assets):
    """A zeroed score head scores every sequence exactly 0: distinct completions then tie (equal scores), and the
    same pairs are decisive with the trained head."""
    judge = RewardModelJudge.from_path(tiny_assets / "reward")
    args = ["sort 3142=", "sort 3142="], ["1234", "9"], ["1243", "99"]
    assert Outcome.TIE not in [v.outcome for v in judge.judge(*args)]
    with torch.no_grad():
        judge.model.score.weight.zero_()
    assert [v.outcome for v in judge.judge(*args)] == [Outcome.TIE, Outcome.TIE]


def test_unknown_judge_and_missing_reward_model(tmp_path):
    with pytest.raises(JudgeError, match="--judge 'gpt-4' is not a judge: use 'task', 'reward-model:PATH' or"):
        make_judge("gpt-4", task_dir=lambda: tmp_path)
    with pytest.raises(ModelLoadError, match="--judge reward-model: '/nonexistent' is neither a local directory nor"):
        make_judge("reward-model:/nonexistent", task_dir=lambda: tmp_path)
