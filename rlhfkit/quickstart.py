"""`rlhfkit quickstart`: the whole small pipeline on the built-in task, offline, in a few minutes on a laptop CPU.

1. build (first use) or reuse the built-in task: tokenizer, SFT model, reward model, prompts;
2. train PPO from the SFT model against the reward model (the built-in task's PPO settings), or with
   ``--algorithm grpo`` GRPO against the task's rule-based rewards (its GRPO settings);
3. judge the trained policy against the SFT model on held-out prompts, with the task's own checker and with the
   reward model (the reference PPO page validates training the same way, by a judge's win rate);
4. write the HTML report of the run, opening with the before/after comparison (before_after.json).

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


def split_algorithm(argv: Sequence[str]) -> tuple[str, list[str]]:
    """`--algorithm NAME` (or `--algorithm=NAME`) out of the command line: (name, the other arguments)."""
    rest, algorithm, args = [], "ppo", list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--algorithm":
            if not args:
                raise UsageError(f"--algorithm needs a value: one of {', '.join(ALGORITHMS)}.")
            algorithm = args.pop(0)
        elif arg.startswith("--algorithm="):
            algorithm = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if algorithm not in ALGORITHMS:
        raise UsageError(f"--algorithm {algorithm!r}: must be one of {', '.join(ALGORITHMS)}.")
    return algorithm, rest


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
    from rlhfkit.report import build_report
    from rlhfkit.tasks import Assets, builtin_assets, load_task
    from rlhfkit.tracking.rundir import BEFORE_AFTER_FILE
    from rlhfkit.trainers.build import MODEL_FLAGS, build_trainer

    start = time.time()
    algorithm, argv = split_algorithm(argv)
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
    trainer = build_trainer(args, explicit)
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return 0
    assets = Assets(builtin_assets())
    run_dir = args.output_dir

    # 3. The trained policy against the SFT model, judged by the task's checker and by the reward model.
    task = load_task(assets.root)
    prompts = load_eval_prompts(assets.prompts, split="test")
    judges = [TaskJudge.from_dir(assets.root), RewardModelJudge.from_path(assets.reward)]
    comparison = compare_judges(run_dir, assets.sft, judges, prompts, max_new_tokens=task.max_new_tokens)

    # 4. The report, opening with the before/after comparison.
    with open(os.path.join(run_dir, BEFORE_AFTER_FILE), "w", encoding="utf-8") as f:
        json.dump(before_after(comparison, "the SFT model"), f, indent=1)
    report = build_report([run_dir], os.path.join(run_dir, "report"))

    print()
    print(f"{algorithm.upper()} policy vs the SFT model on {len(prompts)} held-out prompts (greedy):")
    for win_rate in comparison.win_rates:
        print(format_report(win_rate))
        print()
    minutes, seconds = divmod(round(time.time() - start), 60)
    print(f"Done in {minutes}m{seconds:02d}s. Run directory: {run_dir}")
    print(f"Report: {report}")
    if "trackio" in trainer.run.report_to:
        print(f"Dashboard: trackio show --project {args.project}")
    return 0
