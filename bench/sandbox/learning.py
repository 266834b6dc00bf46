"""Does GRPO through code_reward raise the code task's test pass rate? One SFT model (the code task's default build,
seed 0), GRPO runs with several seeds, each measured before and after on the 256 held-out test prompts.

    python bench/sandbox/learning.py                       # seeds 0 1 2, the settings below; a markdown table
    python bench/sandbox/learning.py --seeds 0 --max_steps 10

Pass rate: the mean of code_reward over the test prompts (the fraction of each prompt's 4 asserts the completion's
program passes in the sandbox), greedy and sampled at the training temperature (one sample per prompt); exact: the
share of completions equal to the reference program (the task's checker). Each GRPO run is a separate
``python -m rlhfkit grpo`` process, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: rlhfkit from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
# 8 prompts x 8 completions per optimizer step (64 programs in the sandbox), the built-in GRPO settings otherwise
# (learning rate 1e-4 with warm-up, temperature 0.7).
GRPO_FLAGS = [
    "--per_device_train_batch_size", "64", "--num_generations", "8", "--gradient_accumulation_steps", "1",
    "--learning_rate", "1e-4", "--warmup_ratio", "0.1", "--temperature", "0.7", "--logging_steps", "1",
    "--num_sample_generations", "0", "--save_steps", "0", "--report_to", "none",
]  # fmt: skip
TEMPERATURE = 0.7


def measure(model_path: str, assets, seed: int) -> dict[str, float]:
    """Pass rate and exact-match rate of a model on the test prompts, greedy and sampled."""
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM

    from rlhfkit.models import load_tokenizer
    from rlhfkit.sandbox import code_reward
    from rlhfkit.tasks import generate_completions, load_task

    task = load_task(assets.root)
    test = load_from_disk(assets.prompts)["test"]
    prompts, tests = list(test["prompt"]), list(test["tests"])
    tokenizer = load_tokenizer(assets.tokenizer, flag="task")
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    out = {}
    for name, temperature in (("greedy", None), ("sampled", TEMPERATURE)):
        texts = generate_completions(model, tokenizer, prompts, task.max_new_tokens, temperature, 1, 256, seed).texts
        out[f"{name}_pass"] = sum(code_reward(texts, tests=tests)) / len(prompts)
        out[f"{name}_exact"] = sum(task.check(p, t) for p, t in zip(prompts, texts)) / len(prompts)
    return out


def train(assets, seed: int, max_steps: int, output_dir: str) -> float:
    """One GRPO run through code_reward in its own process; its wall-clock seconds."""
    command = [
        sys.executable, "-m", "rlhfkit", "grpo",
        "--model_name_or_path", assets.sft, "--dataset_name", assets.prompts, "--task", str(assets.root),
        "--reward_funcs", "code_reward", "--max_completion_length", "21", "--max_steps", str(max_steps),
        "--seed", str(seed), "--output_dir", output_dir, *GRPO_FLAGS,
    ]  # fmt: skip
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from rlhfkit.tasks import Assets, builtin_assets

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--out", default=None, help="write the measurements as JSON here")
    parser.add_argument("--assets", default=None, help="a code task build (default: the cached default build, seed 0)")
    args = parser.parse_args(argv)
    assets = Assets(args.assets or builtin_assets("default", seed=0, task="code"))
    before = measure(assets.sft, assets, seed=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlhfkit-code-grpo-") as tmp:
        for seed in args.seeds:
            run_dir = os.path.join(tmp, f"seed{seed}")
            seconds = train(assets, seed, args.max_steps, run_dir)
            after = measure(run_dir, assets, seed=0)
            rows.append({"seed": seed, "seconds": seconds, "before": before, "after": after})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nGRPO through code_reward, {args.max_steps} steps of 64 completions, from the seed-0 SFT model:\n")
    print("| GRPO seed | pass rate greedy: before -> after | sampled (0.7) | exact match greedy | minutes |")
    print("|---|---|---|---|---|")
    for row in rows:
        b, a = row["before"], row["after"]
        print(
            f"| {row['seed']} | {b['greedy_pass']:.1%} -> {a['greedy_pass']:.1%} | {b['sampled_pass']:.1%} -> "
            f"{a['sampled_pass']:.1%} | {b['greedy_exact']:.1%} -> {a['greedy_exact']:.1%} | {row['seconds'] / 60:.1f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
