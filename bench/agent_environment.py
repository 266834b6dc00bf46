"""The built-in agent task with its calculator as an environment (TRL 1.16's environment_factory) instead of a tool,
trained by GRPO under --async_generation and judged as `rlhfkit quickstart --task agent` judges (the task's checker
on one greedy episode per model for each of the 256 held-out prompts, the calculator run): the environment row of
docs/agents.md's asynchronous table.

    .venv/bin/python bench/agent_environment.py --seeds 1 2 3     # ~2 minutes a seed on 2 cores, from the cached build

Each episode gets its own pooled CalculatorEnv, reset before it; its `calculator` method is the episode's one tool, with
the function's name and signature, so the prompts render exactly as the tool run's. The instance counts the calls it
served (its state, saved in checkpoints): the worker's count comes back to the trainer with every generation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlhfkit.tasks.agent import calculator as calculate  # noqa: E402


class CalculatorEnv:
    """The agent task's calculator as an environment: one tool, and a count of the calls this instance served."""

    def __init__(self):
        self.calls = 0

    def reset(self, **kwargs) -> None:
        return None  # the prompt is the row's

    def calculator(self, expression: str) -> str:
        """
        Computes a sum, difference or product of two whole numbers.

        Args:
            expression: Two non-negative integers of at most 12 digits joined by one of +, - or *, such as "1234*567".

        Returns:
            The exact result as decimal digits (with a leading minus sign when negative).
        """
        self.calls += 1
        return calculate(expression)

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


def run(seed: int, out: str) -> dict:
    from rlhfkit import GRPOTrainer
    from rlhfkit.config import GRPOArguments
    from rlhfkit.config.parse import parse_config
    from rlhfkit.evaluation.episodes import judge_episodes
    from rlhfkit.quickstart import load_dataset_column
    from rlhfkit.tasks import Assets, builtin_assets, load_task
    from rlhfkit.trainers.build import _load_data_and_task, apply_builtin_task, grpo_reward_sources

    start = time.time()
    argv = ["--seed", str(seed), "--async_generation", "true", "--output_dir", out, "--report_to", "none"]
    args, explicit = parse_config(GRPOArguments, argv, "bench/agent_environment.py")
    apply_builtin_task(args, explicit, "default", "agent")  # the quickstart's agent settings (trainers/build.py)
    args.reward_funcs = list(load_task(args.task).reward_funcs)
    train, test, task = _load_data_and_task(args, explicit)
    trainer = GRPOTrainer(
        model=args.model_name_or_path, reward_funcs=grpo_reward_sources(args, task), args=args,
        train_dataset=train, eval_dataset=test, task=task, environment_factory=CalculatorEnv,
    )  # fmt: skip
    trainer.train()
    served = sum(e.calls for e in trainer.environments.pool[None])
    assets = Assets(builtin_assets("default", task="agent"))
    conversations = load_dataset_column(assets.prompts, "test")
    comparison, episodes = judge_episodes(out, assets.sft, task, conversations)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    calls = [r["tools/call_frequency"] for r in rows if "tools/call_frequency" in r]
    staleness = [r for r in rows if "sample/staleness_mean" in r]
    return {
        "seed": seed,
        "win_rate": comparison.win_rates[0].to_dict(),
        **episodes,
        "calls_served_by_the_pool": served,
        "call_frequency_first_last": [calls[0], calls[-1]],
        "staleness_mean": sum(r["sample/staleness_mean"] for r in staleness) / len(staleness),
        "staleness_max": max(r["sample/staleness_max"] for r in staleness),
        "minutes": (time.time() - start) / 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--output_dir", default="runs/agent-environment")
    options = parser.parse_args()
    for seed in options.seeds:
        result = run(seed, os.path.join(options.output_dir, f"s{seed}"))
        w = result["win_rate"]
        print(json.dumps(result))
        print(
            f"| GRPO, environment | {seed} | {w['win_rate']:.1%} ({w['ci_low']:.1%}-{w['ci_high']:.1%}) | "
            f"{w['wins']}/{w['ties']}/{w['losses']} | {result['sft']['accuracy']:.1%} | "
            f"{result['policy']['accuracy']:.1%} | {result['sft']['tool_calls_per_episode']:.2f} | "
            f"{result['policy']['tool_calls_per_episode']:.2f} | {result['call_frequency_first_last'][0]:.2f} -> "
            f"{result['call_frequency_first_last'][1]:.2f} | {result['staleness_mean']:.2f} / "
            f"{result['staleness_max']:.0f} | {result['minutes']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":  # the generation worker (spawned) imports this file again: run nothing then
    main()
