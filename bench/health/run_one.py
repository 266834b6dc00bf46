"""Train one run of the labelled set: ``python bench/health/run_one.py NAME OUTPUT_DIR``, from the repository root
(under ``accelerate launch`` for a spec with 2 processes). Writes the run directory and OUTPUT_DIR/outcome.json: how
the run ended (finished, stopped by the trainer, or refused with an input error, and at which step). A TRL run
(algorithm "trl-grpo") is run_trl.py's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def command_line(spec, output_dir: str) -> list[str]:
    """The spec's flags as ``rlhfkit ppo|grpo`` takes them."""
    argv = ["--output_dir", output_dir, "--seed", str(spec.seed), "--report_to", "none", "--health", "warn"]
    for name, value in spec.flags.items():
        values = value if isinstance(value, list) else [value]
        argv += [f"--{name}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    return argv


def use_builtin_task(task: str) -> None:
    """Make the trainer builder's built-in task `task` (its assets, settings and rewards) instead of the default one:
    what ``rlhfkit quickstart --task`` chooses, for a spec's run without model flags."""
    import rlhfkit.trainers.build as build

    assets = build.builtin_assets
    build.builtin_assets = lambda preset="default", **kwargs: assets(preset, **{**kwargs, "task": task})


def main(name: str, output_dir: str) -> int:
    import torch

    from bench.health.inject import INJECTIONS
    from bench.health.specs import SPECS
    from rlhfkit.config import GRPOConfig, PPOConfig
    from rlhfkit.config.parse import parse_config
    from rlhfkit.errors import InputError, TrainingStopped
    from rlhfkit.trainers.build import build_trainer

    torch.set_num_threads(1)  # two runs side by side on two cores
    spec = SPECS[name]
    if spec.algorithm == "trl-grpo":
        from bench.health.run_trl import run

        return run(spec, output_dir)
    use_builtin_task(spec.task)
    config_cls = PPOConfig if spec.algorithm == "ppo" else GRPOConfig
    args, explicit = parse_config(config_cls, command_line(spec, output_dir), f"rlhfkit {spec.algorithm}")
    trainer = build_trainer(args, explicit)
    if spec.injection:
        injection, settings = spec.injection
        INJECTIONS[injection](trainer, **settings)
    outcome = {"ended": "finished"}
    try:
        trainer.train()
    except TrainingStopped as e:
        outcome = {"ended": type(e).__name__, "step": trainer.run.progress.step, "message": str(e)}
    except InputError as e:  # a reward the trainer refuses (inf) stops the run at the step it came
        outcome = {"ended": type(e).__name__, "step": trainer.run.progress.step + 1, "message": str(e)}
    if trainer.accelerator.is_main_process:
        Path(output_dir, "outcome.json").write_text(json.dumps(outcome, indent=1) + "\n")
    # The trainer may have closed its process group when training ended: then there is nothing to wait for.
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and torch.distributed.is_initialized():
        trainer.accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
