"""`rlhfkit quickstart`: the whole small pipeline on a built-in task, offline, in a few minutes on a laptop CPU.

1. build (first use) or reuse the built-in task (``--task``, sort by default; ``--preset test`` builds in seconds):
   tokenizer, SFT model, reward model, prompts;
2. train PPO from the SFT model against the reward model (the built-in task's PPO settings), or with
   ``--algorithm grpo`` GRPO against the task's rule-based rewards (its GRPO settings);
3. judge the trained policy against the SFT model on held-out prompts, with the task's own checker and with the
   reward model (the reference PPO page validates training the same way, by a judge's win rate);
4. write the HTML report of the run, opening with the before/after comparison (before_after.json).

``--task agent`` is the agent task (tasks/agent.py): multiplication with a calculator tool. Both algorithms train
multi-turn episodes with the tool and score them with the task's correctness rule (it has no reward model); the judge
is the task's checker on greedy episodes of both models, their tools run, and agent_eval.json adds each model's
accuracy and tool calls per episode (docs/agent-task.md). ``--task reverse-chat`` is the reverse task asked in a
conversation: its prompts are messages that the trainers and the judge render with the chat template.

It ends with the win rates, the report's path and the command that opens the Trackio dashboard. The algorithm's flags
given on the command line (``rlhfkit quickstart --total_episodes 2048``, ``rlhfkit quickstart --algorithm grpo
--max_steps 50``) override the built-in settings.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

from rlhfkit.errors import UsageError

ALGORITHMS = ("ppo", "grpo")
AGENT_EVAL_FILE = "agent_eval.json"  # the agent task's judging: win rate, accuracy and tool calls of both models
PRESETS = ("default", "test")


def split_choice(argv: Sequence[str], flag: str, choices: Sequence[str], default: str) -> tuple[str, list[str]]:
    """`--flag NAME` (or `--flag=NAME`) out of the command line, NAME one of `choices`: (name, the other
    arguments)."""
    rest, value, args, option = [], default, list(argv), f"--{flag}"
    while args:
        arg = args.pop(0)
        if arg == option:
            if not args:
                raise UsageError(f"{option} needs a value: one of {', '.join(choices)}.")
            value = args.pop(0)
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if value not in choices:
        raise UsageError(f"{option} {value!r}: must be one of {', '.join(choices)}.")
    return value, rest


def split_algorithm(argv: Sequence[str]) -> tuple[str, list[str]]:
    """`--algorithm NAME` (or `--algorithm=NAME`) out of the command line: (name, the other arguments)."""
    return split_choice(argv, "algorithm", ALGORITHMS, "ppo")


def before_after(comparison, baseline: str, examples: int = 6) -> dict:
    """What the report opens with: every judge's win rate of the trained policy (A) against `baseline`, and a few
    prompts with both completions, chosen by the first judge's verdicts: wins first, then losses, then ties."""
    from rlhfkit.evaluation.judges import Outcome

    verdicts = comparison.verdicts[0]
    order = [
        i for outcome in (Outcome.A, Outcome.B, Outcome.TIE) for i, v in enumerate(verdicts) if v.outcome is outcome
    ]
    label = {Outcome.A: "after wins", Outcome.B: "before wins", Outcome.TIE: "tie", Outcome.MALFORMED: "unreadable"}
    chosen = order[:examples]
    return {
        "baseline": baseline,
        "prompts": len(comparison.prompts),
        "win_rates": [w.to_dict() for w in comparison.win_rates],
        "examples": [
            {
                "prompt": comparison.prompts[i],
                "before": comparison.baseline.texts[i],
                "after": comparison.model.texts[i],
                "verdict": label[verdicts[i].outcome],
            }
            for i in chosen
        ],
    }


def cmd_quickstart(argv: Sequence[str]) -> int:
    from rlhfkit.config import GRPOArguments, PPOArguments
    from rlhfkit.config.parse import parse_config
    from rlhfkit.evaluation import RewardModelJudge, TaskJudge, compare_judges, format_report, load_eval_prompts
    from rlhfkit.evaluation.episodes import judge_episodes
    from rlhfkit.report import build_report
    from rlhfkit.tasks import DEFAULT_TASK, TASKS, Assets, builtin_assets, load_task
    from rlhfkit.tasks.agent import AgentTask
    from rlhfkit.tracking.rundir import BEFORE_AFTER_FILE
    from rlhfkit.trainers.build import MODEL_FLAGS, build_trainer

    start = time.time()
    algorithm, argv = split_algorithm(argv)
    task_name, argv = split_choice(argv, "task", tuple(TASKS), DEFAULT_TASK)
    preset, argv = split_choice(argv, "preset", PRESETS, "default")
    config_cls = PPOArguments if algorithm == "ppo" else GRPOArguments
    args, explicit = parse_config(config_cls, argv, "rlhfkit quickstart")
    given = [flag for flag in MODEL_FLAGS if getattr(args, flag, None)]
    if given:
        raise UsageError(
            f"quickstart runs on the built-in task; --{given[0]} is for 'rlhfkit ppo'. Drop it, or use rlhfkit ppo."
        )
    if "exp_name" not in explicit:
        args.exp_name = "quickstart"

    # 1-2. Built-in task (built on first use) and the algorithm with its settings.
    trainer = build_trainer(args, explicit, task_name, preset)
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return 0
    assets = Assets(builtin_assets(preset, task=task_name))
    run_dir = args.output_dir
    task = load_task(assets.root)
    agent = isinstance(task, AgentTask)

    # 3. The trained policy against the SFT model, judged by the task's checker (and, where the task has one, by the
    # reward model); the agent task's on greedy episodes whose tools run.
    episodes = None
    if agent:
        conversations = load_dataset_column(assets.prompts, "test")
        comparison, episodes = judge_episodes(run_dir, assets.sft, task, conversations)  # evaluation/episodes.py
    else:
        prompts = (
            rendered_prompts(assets.prompts, assets.tokenizer)
            if task.chat  # conversations, judged as the models read them
            else load_eval_prompts(assets.prompts, split="test")
        )
        judges = [TaskJudge.from_dir(assets.root), RewardModelJudge.from_path(assets.reward)]
        comparison = compare_judges(run_dir, assets.sft, judges, prompts, max_new_tokens=task.max_new_tokens)

    # 4. The report, opening with the before/after comparison.
    with open(os.path.join(run_dir, BEFORE_AFTER_FILE), "w", encoding="utf-8") as f:
        json.dump(before_after(comparison, "the SFT model"), f, indent=1)
    report = build_report([run_dir], os.path.join(run_dir, "report"))

    print()
    how = "greedy episodes, the calculator run" if agent else "greedy"
    print(f"{algorithm.upper()} policy vs the SFT model on {len(comparison.prompts)} held-out prompts ({how}):")
    for win_rate in comparison.win_rates:
        print(format_report(win_rate))
        print()
    minutes = (time.time() - start) / 60
    if episodes is not None:
        for side, name in (("sft", "SFT model"), ("policy", f"{algorithm.upper()} policy")):
            e = episodes[side]
            print(
                f"{name}: accuracy {e['accuracy']:.1%}, tool calls per episode {e['tool_calls_per_episode']:.2f} "
                f"({e['episodes_calling_a_tool']:.1%} of the episodes call a tool)"
            )
        summary = {
            "task": task.name,
            "algorithm": algorithm,
            "seed": args.seed,
            "preset": preset,
            "prompts": len(comparison.prompts),
            "win_rate": comparison.win_rates[0].to_dict(),
            **episodes,
            "minutes": minutes,
        }
        with open(os.path.join(run_dir, AGENT_EVAL_FILE), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
        print()
    whole_minutes, seconds = divmod(round(minutes * 60), 60)
    print(f"Done in {whole_minutes}m{seconds:02d}s. Run directory: {run_dir}")
    print(f"Report: {report}")
    if "trackio" in trainer.run.report_to:
        print(f"Dashboard: trackio show --project {args.project}")
    return 0


def rendered_prompts(path: str, tokenizer_path: str, split: str = "test") -> list[str]:
    """A chat task's conversational prompts (a dataset saved with save_to_disk) as the trainers render them for the
    policy: the chat template with the generation prompt (data.prompt_text). The task's checker reads the user's
    message back out of them, and the reward model scores them plus a completion, as in PPO."""
    from rlhfkit.data import prompt_text
    from rlhfkit.models import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path, flag="task")
    return [prompt_text(p, tokenizer) for p in load_dataset_column(path, split)]


def load_dataset_column(path: str, split: str, column: str = "prompt") -> list:
    """One column of a split of a dataset saved with save_to_disk (the built-in prompts), as a list."""
    from datasets import load_from_disk

    return list(load_from_disk(path)[split][column])
