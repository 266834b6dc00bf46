"""How long ``rlhfkit doctor`` takes on a long run: a 10,000-step GRPO trainer_state.json.

Writes a trainer_state.json (TRL GRPO's keys, logged every step: reward, reward_std, kl, entropy,
completions/mean_length, completions/clipped_ratio, frac_reward_zero_std, loss, grad_norm, learning_rate, with
plausible noisy values: a reward that climbs, a KL that grows slowly, entropy that falls a little, an eval row every
500 steps and the final summary row) in a temporary directory, then times

- in-process: reading it (sources.read_source) and the replay through the rules (doctor.doctor with the rows read),
  each the median of --repeats runs;
- the CLI: ``rlhfkit doctor FILE --json`` in a subprocess (interpreter start and imports included), median of
  --repeats runs;

and prints a markdown table. The target is under 2 s in-process.

    .venv/bin/python bench/doctor_speed.py [--steps 10000] [--repeats 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def grpo_log_history(steps: int, seed: int) -> list[dict]:
    """`steps` training rows of a GRPO run that learns, an eval row every 500 steps, and the summary row."""
    rng = random.Random(seed)
    history = []
    for step in range(1, steps + 1):
        progress = step / steps
        reward = 0.3 + 1.2 * progress + rng.gauss(0, 0.15)
        length = 300 - 80 * progress + rng.gauss(0, 20)
        history.append(
            {
                "loss": rng.gauss(0.0, 0.01),
                "grad_norm": abs(rng.gauss(0.3, 0.1)),
                "learning_rate": 1e-6 * (1 - progress),
                "reward": reward,
                "reward_std": abs(rng.gauss(0.6, 0.08)),
                "kl": 0.002 + 0.03 * progress + abs(rng.gauss(0, 0.003)),
                "entropy": 0.9 - 0.3 * progress + rng.gauss(0, 0.03),
                "completions/mean_length": length,
                "completions/clipped_ratio": min(1.0, max(0.0, 0.05 + rng.gauss(0, 0.02))),
                "frac_reward_zero_std": min(1.0, max(0.0, 0.15 + rng.gauss(0, 0.05))),
                "epoch": progress,
                "step": step,
            }
        )
        if step % 500 == 0:
            history.append(
                {"eval_reward": reward + rng.gauss(0, 0.05), "eval_runtime": 12.5, "epoch": progress, "step": step}
            )
    history.append({"train_runtime": 36000.0, "train_loss": 0.001, "train_samples_per_second": 2.2, "step": steps})
    return history


def write_state(directory: Path, steps: int, seed: int) -> Path:
    path = directory / f"checkpoint-{steps}" / "trainer_state.json"
    path.parent.mkdir(parents=True)
    state = {
        "global_step": steps,
        "max_steps": steps,
        "logging_steps": 1,
        "log_history": grpo_log_history(steps, seed),
    }
    path.write_text(json.dumps(state, indent=2))  # transformers writes it indented
    return path


def timed(function, repeats: int) -> tuple[float, object]:
    """The median wall time of `repeats` calls, and the last call's result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from rlhfkit.health.doctor import doctor
    from rlhfkit.health.sources import read_source

    with tempfile.TemporaryDirectory() as tmp:
        path = write_state(Path(tmp), args.steps, args.seed)
        size_mb = path.stat().st_size / 2**20
        read_s, source = timed(lambda: read_source(path), args.repeats)
        replay_s, diagnosis = timed(lambda: doctor(None, source=source), args.repeats)
        total_s, _ = timed(lambda: doctor(path), args.repeats)
        command = [sys.executable, "-m", "rlhfkit", "doctor", str(path), "--json"]
        cli_s, result = timed(lambda: subprocess.run(command, capture_output=True, text=True, cwd=ROOT), args.repeats)
        if result.returncode not in (0, 1):
            sys.exit(f"rlhfkit doctor failed ({result.returncode}): {result.stderr.strip()}")

    findings = len(diagnosis.findings)
    print(
        f"rlhfkit doctor on a {args.steps}-step trainer_state.json ({size_mb:.1f} MB, {len(source.rows)} rows, "
        f"{findings} finding(s)); median of {args.repeats} runs, Python {sys.version.split()[0]}\n"
    )
    print("| what | seconds |")
    print("|---|---|")
    for what, seconds in (
        ("read (read_source)", read_s),
        ("replay through the rules (doctor on the rows read)", replay_s),
        ("in-process total (doctor on the file)", total_s),
        ("CLI subprocess (`rlhfkit doctor FILE --json`)", cli_s),
    ):
        print(f"| {what} | {seconds:.2f} |")
    verdict = "under" if total_s < 2 else "OVER"
    print(f"\nIn-process {total_s:.2f} s: {verdict} the 2 s target.")


if __name__ == "__main__":
    main()
