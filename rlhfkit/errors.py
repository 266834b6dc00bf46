"""Every exception rlhfkit raises on purpose, in one place (standard library only, so any module may import it).

Two families the user sees, told apart by what the command line does with them:

* :class:`InputError` and its subclasses: the input is wrong (a flag, a file, a model, a reward function). The
  message names what is wrong, the valid values and the fix; ``rlhfkit COMMAND`` prints it and exits with status 2.
* :class:`TrainingStopped` and its subclasses: training ended early but cleanly, with a checkpoint of the state.
  The message says why and how to go on; the command exits with the subclass's ``exit_status``.

And two internal signals, caught inside rlhfkit and never shown as they are: :class:`LoopArgumentsRejected` and
:class:`GenerationWorkerDied`.
"""

from __future__ import annotations

import signal


class InputError(ValueError):
    """Something the user gave cannot be used; the message names it and the fix (exit status 2)."""


class UsageError(InputError):
    """The command line itself is wrong (unknown flag, missing value, unreadable --config file)."""


class ConfigError(InputError):
    """A configuration value is wrong; the message names the field(s) and the fix."""


class FieldNotTakenError(ConfigError, TypeError):
    """A keyword a config does not take: a TRL/transformers field rlhfkit does not support (the message says why, as
    the command line does), or a misspelt name. A TypeError too, as Python's own unexpected-keyword error."""


class DataError(InputError):
    """The dataset cannot be used; the message names the flag and the fix."""


class ModelLoadError(InputError):
    """A model or tokenizer cannot be loaded; the message names the flag, the name and what to do."""


class RewardFunctionError(InputError):
    """A reward function raised or returned something unusable; the message names the function and the problem."""


class CheckpointError(InputError):
    """A checkpoint cannot be resumed from; the message names the path and what to do."""


class StorageError(InputError):
    """A file of the run could not be written or read back intact (no space left, no permission, an I/O error, a
    corrupt checkpoint); the message names the path, the cause and how to go on (resume from the last good
    checkpoint)."""


class RunLockedError(InputError):
    """Another live process is writing the same run directory; the message names it."""


class ReportError(InputError):
    """Run directories cannot be reported on (missing directory or metrics.jsonl, bad smoothing, no match)."""


class SandboxUnavailableError(InputError):
    """Model-written code cannot run in the sandbox here (no bubblewrap, or the sandbox cannot start); the message
    names the install line or the cause, and the explicit opt-in to the weaker limits-only mode (rlhfkit/sandbox)."""


class EvalError(InputError):
    """The evaluation cannot run as asked (a path, a flag value, the prompts)."""


class JudgeError(EvalError):
    """The judge cannot be built or cannot answer (unknown judge, missing API key, unreachable server)."""


# ---------------------------------------------------------------------------------------------------------------------
# Training control: a run that stops early, cleanly, with a checkpoint
# ---------------------------------------------------------------------------------------------------------------------


class TrainingStopped(RuntimeError):
    """Training ended early but cleanly: a checkpoint holds the state; str() says why and how to go on.

    The CLI prints the message and exits with `exit_status` (distinct per cause, never 0).
    """

    exit_status = 1

    def __init__(self, message: str, checkpoint: str | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint


class Interrupted(TrainingStopped):
    """SIGINT / SIGTERM: the current step finished, a checkpoint was saved, trackers closed."""

    def __init__(self, signum: int, step: int, checkpoint: str, output_dir: str):
        self.exit_status = 128 + signum  # the shell convention: 130 for SIGINT, 143 for SIGTERM
        super().__init__(
            f"Interrupted by {signal.Signals(signum).name} after step {step}; the state is saved in {checkpoint}. "
            f"Continue with the same command plus --output_dir {output_dir} --resume_from_checkpoint latest.",
            checkpoint,
        )


class NonFiniteStop(TrainingStopped):
    """Too many optimizer steps in a row had a NaN/inf loss or gradient."""

    exit_status = 4

    def __init__(self, streak: int, step: int, checkpoint: str):
        super().__init__(
            f"Training stopped at step {step}: the last {streak} optimizer steps had a NaN or inf loss or gradient "
            f"and were skipped (--max_nonfinite_steps {streak}). The last good state is saved in {checkpoint}. "
            "Usual causes: a learning rate too high, a reward that returns NaN/inf, fp16 overflow. Look at the "
            "metrics just before (rlhfkit doctor), fix the cause, then resume from the checkpoint.",
            checkpoint,
        )


class HealthStop(TrainingStopped):
    """Training stopped on a critical health finding (``--health stop``); str() is the explanation.

    finding: the rlhfkit.health Finding (step, rule, message, advice) that stopped it."""

    exit_status = 3

    def __init__(self, finding, checkpoint: str, output_dir: str):
        self.finding = finding
        super().__init__(
            f"Training stopped at step {finding.step} by --health stop: {finding.rule} is critical. "
            f"{finding.message} The state at that step is saved in {checkpoint}. {finding.advice} "
            f"See every finding with `rlhfkit doctor {output_dir}`; to train through such findings, run with "
            "--health warn.",
            checkpoint,
        )


class GenerationWorkerStopped(TrainingStopped):
    """The asynchronous generation worker exited while the trainer waited for completions (--async_generation)."""

    exit_status = 5

    def __init__(self, cause: str, step: int, checkpoint: str, output_dir: str):
        super().__init__(
            f"Training stopped after step {step}: {cause}. The state after step {step} is saved in {checkpoint}; the "
            "rounds the worker had not delivered are generated again on resume. Look for the worker's own error "
            "above (or the system's: out of memory kills a process without one), then continue with the same command "
            f"plus --output_dir {output_dir} --resume_from_checkpoint latest.",
            checkpoint,
        )


# ---------------------------------------------------------------------------------------------------------------------
# Internal signals: raised and caught inside rlhfkit
# ---------------------------------------------------------------------------------------------------------------------


class LoopArgumentsRejected(Exception):
    """The model's forward raised a TypeError naming one of the lean decoding loop's arguments
    (sampling/decoders.py): generation falls back to ``model.generate``."""


class GenerationWorkerDied(RuntimeError):
    """The generation worker exited (killed, out of memory, an error) while the trainer waited for a round
    (trainers/generation_worker.py); the run turns it into GenerationWorkerStopped, with a checkpoint."""


# ---------------------------------------------------------------------------------------------------------------------
# Warnings: training goes on
# ---------------------------------------------------------------------------------------------------------------------


class UnsandboxedCodeWarning(UserWarning):
    """Model-written code runs with resource limits only, outside any sandbox, because the caller asked for it
    (``allow_unsandboxed=True`` where bubblewrap is missing): warned once per process."""
