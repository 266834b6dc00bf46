"""The ``rlhfkit`` command line: one subcommand per entry of COMMANDS (``rlhfkit --help`` lists them), bad input
reported as one message with exit status 2."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Sequence

from rlhfkit.errors import InputError, TrainingStopped

USAGE = """usage: rlhfkit COMMAND [FLAGS]

commands:
  quickstart   build the built-in task, train PPO (--algorithm grpo: GRPO), judge the policy against the SFT model,
               write the report (--task reverse|addition|reverse-chat|agent|code: another built-in task; reverse-chat
               asks in a conversation, agent multiplies with a calculator tool, code writes programs that GRPO
               rewards by the unit tests they pass in the sandbox)
  ppo          train a policy with PPO (flags as TRL's PPOConfig; without model flags: the built-in task)
  grpo         train a policy with GRPO (flags as TRL's GRPOConfig; without model flags: the built-in task)
  build-tiny   build the built-in task's tokenizer, SFT model, reward model and prompts into a directory
  eval         compare a model with a baseline by a judge's win rate (task checker, reward model, OpenAI-compatible)
  report       render runs into a self-contained report.html (+ PNG charts): run directories, TRL trainer_state.json,
               Hub repo ids, TensorBoard/W&B logs, verl logs
  doctor       re-run the health checks over a run's logged metrics and print the findings: an rlhfkit run
               directory, a TRL trainer_state.json or checkpoint, a Hub repo id, TensorBoard/W&B/Trackio, a verl log
  checkpoints  list a run directory's checkpoints with their step and whether they verify against their manifest

Run 'rlhfkit COMMAND --help' for a command's flags. Add --debug to see tracebacks.
"""


LAUNCHED = "RLHFKIT_LAUNCHED"  # set in the processes rlhfkit started under accelerate launch: they must not relaunch


def cmd_train(algorithm: str, argv: Sequence[str]) -> int:
    """``rlhfkit ppo|grpo FLAGS``: parse the algorithm's config, build its trainer, train; with --num_processes or
    --accelerate_config, run that under ``accelerate launch`` instead, as the ``trl`` command does."""
    from rlhfkit.config import GRPOArguments, PPOArguments
    from rlhfkit.config.parse import launch_arguments, parse_config

    # The launched processes parse the command line (GRPO's batch shape is checked for their number of processes).
    launch = launch_arguments(algorithm, argv)
    if launch is not None and not os.environ.get(LAUNCHED):
        if "LOCAL_RANK" not in os.environ:
            return relaunch(launch)
        from rlhfkit.logs import note

        note(
            "--num_processes and --accelerate_config have no effect here: this process was already started by a "
            "launcher (accelerate launch or torchrun), whose settings apply."
        )
    config_cls = {"ppo": PPOArguments, "grpo": GRPOArguments}[algorithm]
    args, explicit = parse_config(config_cls, argv, f"rlhfkit {algorithm}")
    from rlhfkit.trainers.build import build_trainer  # after parsing: --help and a refused flag need no trainer

    trainer = build_trainer(args, explicit)
    trainer.train()
    if args.push_to_hub:
        trainer.push_to_hub()
    if trainer.accelerator.is_main_process:
        print(f"Run directory: {args.output_dir}")
    return 0


def relaunch(launch_args: Sequence[str]) -> int:
    """Run ``accelerate launch LAUNCH_ARGS`` (config.parse.launch_arguments) as TRL's command does: accelerate's own
    launch parser and launch_command; the processes it starts know from $RLHFKIT_LAUNCHED not to relaunch."""
    import subprocess

    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(list(launch_args))
    os.environ[LAUNCHED] = "1"
    try:
        launch_command(args)
    except subprocess.CalledProcessError as e:  # a process failed; it has printed why
        return e.returncode or 1
    except ChildFailedError as e:  # torchrun's launcher: the first process to fail has printed why; its status
        _, failure = e.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 1
    return 0


def cmd_build_tiny(argv: Sequence[str]) -> int:
    from rlhfkit.tasks import build_tiny

    parser = argparse.ArgumentParser(
        prog="rlhfkit build-tiny", description="Build the built-in task's assets offline."
    )
    parser.add_argument("out_dir", help="Directory to write tokenizer/, sft/, reward/, prompts/ and task.json into.")
    parser.add_argument("--seed", type=int, default=0, help="Seed; the same seed gives the same files.")
    parser.add_argument(
        "--preset", default="default", choices=["default", "test"], help="'test' builds in seconds (lower quality)."
    )
    ns = parser.parse_args(argv)
    summary = build_tiny(ns.out_dir, seed=ns.seed, preset=ns.preset)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def cmd_doctor(argv: Sequence[str]) -> int:
    from rlhfkit.health import cmd_doctor as doctor

    return doctor(list(argv))


def cmd_checkpoints(argv: Sequence[str]) -> int:
    """``rlhfkit checkpoints RUN_DIR``: each checkpoint-N with its step and state (ok, failed: FILE: REASON, no
    manifest, incomplete), and the one --resume_from_checkpoint latest takes. Exit status 1 when one failed."""
    from rlhfkit.checkpoint import checkpoint_table
    from rlhfkit.errors import CheckpointError

    parser = argparse.ArgumentParser(
        prog="rlhfkit checkpoints",
        description="List a run directory's checkpoints, each verified against its manifest.json (sizes, sha256).",
    )
    parser.add_argument("run_dir", help="The run directory (--output_dir of the run).")
    ns = parser.parse_args(argv)
    if not os.path.isdir(ns.run_dir):
        raise CheckpointError(f"{ns.run_dir} is not a directory.")
    rows = checkpoint_table(ns.run_dir)
    if not rows:
        print(f"{ns.run_dir} holds no checkpoint-N directory.")
        return 1
    latest = next(
        (name for name, step, state in reversed(rows) if state == "ok" or state.startswith("no manifest")), None
    )
    width = max(len(name) for name, _, _ in rows)
    for name, step, state in rows:
        mark = "   <- --resume_from_checkpoint latest" if name == latest else ""
        print(f"{name:<{width}}  step {'?' if step is None else step:>6}  {state}{mark}")
    return 1 if any(state.startswith("failed") for _, _, state in rows) else 0


def cmd_eval(argv: Sequence[str]) -> int:
    from rlhfkit.evaluation import cmd_eval as evaluate

    return evaluate(list(argv))


def cmd_report(argv: Sequence[str]) -> int:
    from rlhfkit.report import cmd_report as report

    return report(list(argv))


def cmd_quickstart(argv: Sequence[str]) -> int:
    from rlhfkit.quickstart import cmd_quickstart as quickstart

    return quickstart(argv)


COMMANDS = {
    "quickstart": cmd_quickstart,
    "ppo": functools.partial(cmd_train, "ppo"),
    "grpo": functools.partial(cmd_train, "grpo"),
    "build-tiny": cmd_build_tiny,
    "eval": cmd_eval,
    "report": cmd_report,
    "doctor": cmd_doctor,
    "checkpoints": cmd_checkpoints,
}


TRAINING_COMMANDS = ("ppo", "grpo", "quickstart")
MODEL_COMMANDS = (*TRAINING_COMMANDS, "build-tiny", "eval")  # the commands that load models


PIPE_CLOSED = 141  # the exit status of a command whose output pipe closed: 128 + SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"rlhfkit: unknown command {command!r}.\n\n{USAGE}", file=sys.stderr)
        return 2
    if command in MODEL_COMMANDS and not {"-h", "--help"} & set(rest):  # help loads no model: no torch to import
        from rlhfkit.engines import name_deepspeed_accelerator

        name_deepspeed_accelerator()
    try:
        status = COMMANDS[command](rest)
    except TrainingStopped as e:  # a clean, explained stop: checkpoint saved, trackers closed
        print(f"rlhfkit {command}: {e}", file=sys.stderr)
        return e.exit_status
    except InputError as e:  # bad input: the message names it and the fix
        if debug:
            raise
        print(f"rlhfkit {command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of the output went away (`rlhfkit doctor RUN --json | head -1`)
        # Point stdout at /dev/null so the interpreter's last flush does not fail again, and end as a shell's
        # commands do when their pipe closes (128 + SIGPIPE), without a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED
    if command in TRAINING_COMMANDS and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _leave_launched_process(status)
    return status


def _leave_launched_process(status: int) -> None:
    """End a process that `accelerate launch` started, once its run is over (run directory written, trackers closed,
    process group destroyed by every process together): exit without the interpreter's teardown. There, on CPUs
    (gloo), a native thread occasionally aborted the process (std::terminate, about 1 launch in 50 under load),
    which the launcher then reports as a crash of a run that had finished."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
