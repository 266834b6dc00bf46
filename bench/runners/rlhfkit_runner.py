"""Run ``rlhfkit ppo`` or ``rlhfkit grpo`` from a benchmark spec, timed (runs in rlhfkit's environment).

The trainer is built exactly as the CLI builds it: the spec's settings become the command line's flags, parsed by
rlhfkit.config.parse.parse_config and turned into a trainer by rlhfkit.trainers.build. Only ``trainer.train()`` is timed.
"""

from __future__ import annotations

import json
import os
import sys

from common import PROCESS_START, finish, install_probe, load_spec, run_timed


def flags(settings: dict) -> list[str]:
    argv = []
    for name, value in settings.items():
        if value is None:
            continue
        argv += [f"--{name}", *(str(v) for v in value)] if isinstance(value, list) else [f"--{name}", str(value)]
    return argv


def cli_argv(spec: dict) -> list[str]:
    paths, trainer = spec["paths"], spec["trainer"]
    settings = dict(spec["settings"], **spec["rlhfkit_settings"])
    if trainer == "ppo":
        models = {
            "model_name_or_path": paths["tokenizer"],
            "sft_model_path": paths["sft"],
            "reward_model_path": paths["reward"],
        }
    else:
        models = {"model_name_or_path": paths["sft"], "reward_funcs": [spec["reward_func"]]}
    return flags({**models, "dataset_name": paths["prompts"], "output_dir": spec["output_dir"], **settings})


def main() -> None:
    import time

    spec = load_spec()
    probe = install_probe()
    import rlhfkit
    from rlhfkit import __version__ as version
    from rlhfkit.config import GRPOConfig, PPOConfig
    from rlhfkit.config.parse import parse_config
    from rlhfkit.trainers.build import build_trainer

    trainer_name = spec["trainer"]
    argv = cli_argv(spec)
    print("rlhfkit", trainer_name, " ".join(argv), flush=True)
    config_cls = PPOConfig if trainer_name == "ppo" else GRPOConfig
    args, explicit = parse_config(config_cls, argv, f"rlhfkit {trainer_name}")
    trainer = build_trainer(args, explicit)
    wrap_generation(probe)
    setup = time.time() - PROCESS_START
    seconds = run_timed(probe, trainer.train)
    assert "trl" not in sys.modules, "rlhfkit imported TRL"
    finish(
        spec,
        probe,
        "rlhfkit",
        version,
        seconds,
        spec["output_dir"],
        setup,
        {
            "library_timings": own_timings(spec["output_dir"]),
            "argv": argv,
            "rlhfkit_source": os.path.dirname(rlhfkit.__file__),  # bench/run.py checks which tree ran
        },
    )


def wrap_generation(probe) -> None:
    """Time ``rlhfkit.sampling.generate`` (every trainer's sampling entry point) as the generation phase, wherever it
    was imported by name. It returns a Generated whose .tokens are the (B, T') new tokens; when it uses transformers' ``generate`` inside, the
    probe's own ``generate`` hook sees a busy probe and does not count twice."""
    from rlhfkit.sampling import completions

    original = completions.generate
    wrapped = probe.wrap_generation(original, lambda out: (out.tokens.shape[0], out.tokens.shape[1]))
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("rlhfkit") and getattr(module, "generate", None) is original:
            module.generate = wrapped


def own_timings(output_dir: str) -> dict:
    """Sum of every ``time/*`` metric rlhfkit logged in metrics.jsonl (its own phase clock, for comparison), and with
    --async_generation the seconds the trainer waited for its worker and the worker for its trainer."""
    totals: dict[str, float] = {}
    path = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return totals
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            for key, value in row.items():
                timed = key.startswith("time/") or key in ("perf/rollout_wait_s", "rollout/backpressure_s")
                if timed and isinstance(value, (int, float)):
                    totals[key] = round(totals.get(key, 0.0) + value, 4)
    return totals


if __name__ == "__main__":
    main()
