"""Evaluation by pairwise judges: a model's win rate against a baseline (`rlhfkit eval`).

from rlhfkit.evaluation import TaskJudge, compare_judges
comparison = compare_judges("runs/ppo", "assets/sft", [TaskJudge.from_dir("assets")], prompts, max_new_tokens=8)
win = comparison.win_rates[0]
print(f"{win.rate:.1%} (95% CI {win.ci[0]:.1%}-{win.ci[1]:.1%})")
"""

from rlhfkit.errors import EvalError, JudgeError

from .cli import cmd_eval
from .compare import Comparison, compare_judges, judge_completions, load_eval_prompts
from .completions import Generations, generate_texts
from .judges import (
    OpenAIJudge,
    Outcome,
    PairwiseJudge,
    RewardModelJudge,
    TaskJudge,
    Verdict,
    make_judge,
    parse_index,
)
from .winrate import WinRate, format_report, tally, win_rate_interval

__all__ = [
    "Comparison",
    "EvalError",
    "Generations",
    "JudgeError",
    "OpenAIJudge",
    "Outcome",
    "PairwiseJudge",
    "RewardModelJudge",
    "TaskJudge",
    "Verdict",
    "WinRate",
    "cmd_eval",
    "compare_judges",
    "format_report",
    "generate_texts",
    "judge_completions",
    "load_eval_prompts",
    "make_judge",
    "parse_index",
    "tally",
    "win_rate_interval",
]
