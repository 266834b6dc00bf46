"""`rlhfkit eval`: the model's win rate against a baseline on held-out prompts, by a judge.

    rlhfkit eval --model runs/ppo/policy --baseline ASSETS/sft --judge task --num_examples 256
    rlhfkit eval --model M --baseline B --judge reward-model:ASSETS/reward --judge task
    rlhfkit eval --model M --baseline B --dataset data/tldr --judge openai:gpt-4o-mini --num_examples 1000

Prints TRL's "Model win rate: X%" line per judge, then ties, the baseline's rate, a confidence interval, the
decisive-only rate and any malformed verdicts. On the agent task (--task: its assets, which `rlhfkit quickstart --task
agent` builds into ~/.cache/rlhfkit), each model's greedy episodes run the task's tools, as training samples them; the task judge reads each
episode's final answer, and each side's accuracy and tool use are printed too.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rlhfkit.errors import EvalError

DEFAULT_MAX_NEW_TOKENS = 128  # for datasets other than the built-in task's


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting, so cmd_eval reports usage errors like every other error (exit status 2)."""

    def error(self, message: str):
        raise EvalError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rlhfkit eval",
        description="Generate completions from a model and a baseline on held-out prompts and report the model's "
        "win rate by a pairwise judge. Win rate = (wins + ties/2) / judged: 50% means no better than the baseline.",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="NAME",
        help="Model to evaluate: a hub id or a save_pretrained dir with its tokenizer.",
    )
    p.add_argument(
        "--baseline", required=True, metavar="NAME", help="Model to compare against (e.g. the SFT model), same forms."
    )
    p.add_argument(
        "--judge",
        action="append",
        metavar="JUDGE",
        help="'task' (the built-in task's checker; the default), 'reward-model:NAME' (a 1-label sequence-"
        "classification model, hub id or directory) or 'openai:MODEL' (an OpenAI-compatible chat model). Repeat to use several judges "
        "on the same completions.",
    )
    p.add_argument(
        "--num_examples", type=int, metavar="N", help="Evaluate on the first N prompts of the split (default: all)."
    )
    p.add_argument(
        "--dataset",
        "--dataset_name",
        metavar="NAME",
        help="Prompts: a hub id, a save_to_disk dir, a dir of data files or a .json/.jsonl/.csv/.parquet file "
        "(default: the built-in task's prompts, from --task).",
    )
    p.add_argument("--dataset_test_split", default="test", metavar="SPLIT", help="Split of --dataset to evaluate on.")
    p.add_argument(
        "--dataset_text_field", default="prompt", metavar="COLUMN", help="Column of --dataset holding the prompt text."
    )
    p.add_argument(
        "--task",
        metavar="DIR",
        help="Built-in task assets dir (task.json, prompts/) from 'rlhfkit build-tiny' (default: the cached "
        "built-in assets, built on first use).",
    )
    p.add_argument(
        "--max_new_tokens",
        type=int,
        metavar="N",
        help=f"Response length limit (default: the task's own on its prompts, else {DEFAULT_MAX_NEW_TOKENS}).",
    )
    p.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0: greedy (the default); > 0: seeded sampling."
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="S", help="Seed of sampling and of the LLM judge's order shuffle."
    )
    p.add_argument(
        "--batch_size", type=int, default=64, metavar="B", help="Prompts per generation / reward-model batch."
    )
    p.add_argument(
        "--judge_base_url", metavar="URL", help="Base URL of an OpenAI-compatible server (e.g. http://host:8000/v1)."
    )
    p.add_argument(
        "--judge_api_key_env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="Environment variable holding the judge's API key (default: OPENAI_API_KEY).",
    )
    return p


def _validate(args: argparse.Namespace) -> None:
    """Cheap checks first, so a typo fails in a second rather than after minutes of generation."""
    from rlhfkit.models import is_hub_id
    from rlhfkit.tasks.layout import Assets

    for flag in ("model", "baseline"):
        name = getattr(args, flag)
        if not os.path.isdir(name) and not is_hub_id(name):
            raise EvalError(
                f"--{flag} {name!r} is neither a local directory nor a hub model id (ORG/NAME). Pass a causal language "
                "model saved with save_pretrained (its tokenizer in the same directory), or a hub id."
            )
    if args.task is not None and not Assets(args.task).is_built():
        raise EvalError(f"--task {args.task!r} has no task.json: pass a directory built by 'rlhfkit build-tiny'.")
    for flag in ("num_examples", "max_new_tokens", "batch_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise EvalError(f"--{flag} must be at least 1, got {value}.")
    if args.temperature < 0:
        raise EvalError(f"--temperature must be 0 (greedy) or positive, got {args.temperature}.")
    uses_openai = any(spec.startswith("openai:") for spec in args.judge or [])
    if args.judge_base_url is not None and not uses_openai:
        raise EvalError("--judge_base_url is only used by openai:MODEL judges; add --judge openai:MODEL or drop it.")


def _run(argv: Sequence[str]) -> int:
    from rlhfkit.tasks import builtin_assets, load_task
    from rlhfkit.tasks.agent import AgentTask
    from rlhfkit.tasks.layout import Assets

    from .compare import compare_judges, load_eval_prompts
    from .judges import make_judge
    from .winrate import format_report

    args = build_parser().parse_args(list(argv))
    _validate(args)
    task_dir = functools.cache(lambda: Path(args.task) if args.task else builtin_assets())
    judge_specs = args.judge or ["task"]
    if args.dataset is None and isinstance(load_task(task_dir()), AgentTask):  # before any judge is made
        return _run_agent(args, judge_specs, task_dir())
    judges = [
        make_judge(
            spec,
            task_dir,
            seed=args.seed,
            batch_size=args.batch_size,
            base_url=args.judge_base_url,
            api_key_env=args.judge_api_key_env,
        )
        for spec in judge_specs
    ]
    if args.dataset is None:
        source = Path(Assets(task_dir()).prompts)
        prompts = load_eval_prompts(source, "test", "prompt", args.num_examples)
    else:
        source = Path(args.dataset)
        prompts = load_eval_prompts(source, args.dataset_test_split, args.dataset_text_field, args.num_examples)
    max_new_tokens = args.max_new_tokens or (
        load_task(task_dir()).max_new_tokens if args.dataset is None else DEFAULT_MAX_NEW_TOKENS
    )
    temperature = args.temperature or None
    decoding = f"sampling at temperature {temperature}" if temperature else "greedy"
    shortfall = f" (only {len(prompts)} available)" if args.num_examples and args.num_examples > len(prompts) else ""
    print(
        f"rlhfkit eval: {len(prompts)} prompts{shortfall} from {source}; {decoding}, up to {max_new_tokens} new tokens"
    )

    comparison = compare_judges(
        args.model,
        args.baseline,
        judges,
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    for label, path, gen in (
        ("model", args.model, comparison.model),
        ("baseline", args.baseline, comparison.baseline),
    ):
        print(f"  {label + ':':9} {path} ({sum(gen.truncated)} of {len(prompts)} completions cut off at the limit)")
    for win_rate in comparison.win_rates:
        print()
        print(format_report(win_rate))
    return 0 if all(w.judged for w in comparison.win_rates) else 1


def _run_agent(args: argparse.Namespace, judge_specs: list[str], task_dir: Path) -> int:
    """The agent task: greedy episodes with the task's tools, judged by the task's checker (evaluation/episodes.py)."""
    from datasets import load_from_disk

    from rlhfkit.tasks import load_task
    from rlhfkit.tasks.layout import Assets

    from .episodes import judge_episodes
    from .winrate import format_report

    if judge_specs != ["task"]:
        raise EvalError(
            f"--judge {' '.join(s for s in judge_specs if s != 'task')}: the agent task is judged on its episodes' final "
            "answers by its own checker only (--judge task, the default). Drop the other judges."
        )
    for flag, value in (("temperature", args.temperature or None), ("max_new_tokens", args.max_new_tokens)):
        if value is not None:
            raise EvalError(
                f"--{flag}: the agent task's episodes are greedy, with the task's own length budget and tool rounds "
                "(as its training samples them). Drop the flag."
            )
    task = load_task(task_dir)
    conversations = list(load_from_disk(str(Assets(task_dir).prompts))["test"]["prompt"])[: args.num_examples]
    print(
        f"rlhfkit eval: {len(conversations)} prompts of the agent task {task_dir}; greedy episodes with its tools "
        f"({', '.join(t.__name__ for t in task.tools)}), up to {task.max_tool_calling_iterations} rounds of results"
    )
    comparison, sides = judge_episodes(args.model, args.baseline, task, conversations, batch_size=args.batch_size)
    for label, path, side in (("model", args.model, sides["policy"]), ("baseline", args.baseline, sides["sft"])):
        print(
            f"  {label + ':':9} {path}: accuracy {side['accuracy']:.1%}, tool calls per episode "
            f"{side['tool_calls_per_episode']:.2f} ({side['episodes_calling_a_tool']:.1%} of the episodes call a tool)"
        )
    for win_rate in comparison.win_rates:
        print()
        print(format_report(win_rate))
    return 0 if all(w.judged for w in comparison.win_rates) else 1


def cmd_eval(argv: Sequence[str]) -> int:
    """Entry point of `rlhfkit eval`; errors print one line naming the flag and return 2 (no traceback)."""
    from rlhfkit.errors import DataError, ModelLoadError

    try:
        return _run(argv)
    except (EvalError, DataError, ModelLoadError) as e:
        print(f"rlhfkit eval: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
