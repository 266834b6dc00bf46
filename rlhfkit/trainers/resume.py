"""Where a run writes and what a resume continues: the output directory, the checkpoint to resume from, and which
settings a resumed run may change.

A run directory is only continued with --resume_from_checkpoint and only replaced with --overwrite_output_dir
(:func:`resolve_output_dir`). A resume continues the run the checkpoint saved: settings that differ from the
checkpoint's (which its trainer_state.json holds) are refused unless they are in :data:`SAFE_TO_CHANGE` or
--allow_config_change is given (:func:`check_changes`); the run records every part, with its changes, in
run_config_history.jsonl.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.checkpoint import read_state, resolve_checkpoint
from rlhfkit.config import TrainConfig
from rlhfkit.errors import ConfigError, RunLockedError
from rlhfkit.logs import note
from rlhfkit.tracking.rundir import (
    CONFIG_FILE,
    HISTORY_FILE,
    METRICS_FILE,
    holds_run,
    locked_by,
    locked_message,
    read_config,
    to_jsonable,
)


def resolve_output_dir(args: TrainConfig) -> str:
    """Fill in run_name and output_dir, and refuse an output_dir another live run holds (nothing is written yet);
    refuse_other_run refuses one that holds a finished or stopped run.

    A run is only continued with --resume_from_checkpoint and only replaced with --overwrite_output_dir: losing a
    finished run's logs to a repeated command is the kind of mistake that costs a day of compute.
    """
    if args.resume_from_checkpoint and args.output_dir is None:
        raise ConfigError("--resume_from_checkpoint needs --output_dir: the run directory to continue.")
    if args.run_name is None:
        previous = read_config(args.output_dir) if args.resume_from_checkpoint else {}
        args.run_name = previous.get("run_name") or f"{args.exp_name}-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.output_dir is None:
        args.output_dir = os.path.join("runs", args.run_name)
    # A live run in the directory is the reason to refuse, whatever else it holds. (Only the launch's main process
    # looks: the others would see their own main process's lock, taken at the end of TrainingRun().)
    if int(os.environ.get("RANK", "0")) == 0 and (holder := locked_by(args.output_dir)) is not None:
        raise RunLockedError(locked_message(args.output_dir, holder))
    return args.output_dir


def refuse_other_run(args: TrainConfig) -> None:
    """Refuse an output_dir that holds another run, unless the run resumes it or replaces it. Checked when the run
    begins (train(), whose resume_from_checkpoint may name a checkpoint the trainer was not built with), and by the
    command line before any model loads."""
    if holds_run(args.output_dir) and not (args.resume_from_checkpoint or args.overwrite_output_dir):
        held = [name for name in (CONFIG_FILE, METRICS_FILE) if os.path.isfile(os.path.join(args.output_dir, name))]
        raise ConfigError(
            f"--output_dir {args.output_dir} already holds a run ({', '.join(held)}). Continue it with "
            "--resume_from_checkpoint latest, replace it with --overwrite_output_dir, or choose another --output_dir."
        )


# Settings a resumed run may change without --allow_config_change: where things are written and named, what is
# logged, saved, watched and evaluated, and how (not what) is computed. Every other field, a new one included, shapes
# the saved state or the run it continues (batch shape, models, data, seed, precision, algorithm settings, the run's
# length), so a change needs the flag. learning_rate is not here: the saved optimizer state is valid for any rate,
# but the resumed run would no longer be the run the checkpoint belongs to (its schedule changes from the resumed
# step on, its curves mix two settings) and a flag forgotten or mistyped in a repeated command must not do that
# silently; lowering the rate of a run that diverges is a deliberate choice, which --allow_config_change states.
SAFE_TO_CHANGE = frozenset(
    {
        # where things go, what they are called
        "output_dir", "exp_name", "run_name", "project", "logging_dir",
        "resume_from_checkpoint", "overwrite_output_dir", "allow_config_change",
        # logging and trackers
        "report_to", "log_legacy_names", "logging_steps", "logging_strategy", "logging_first_step", "log_with",
        "project_kwargs", "log_completions", "num_completions_to_print",
        # checkpoints, the saved model, the upload
        "save_strategy", "save_steps", "save_total_limit", "merge_adapter",
        "push_to_hub", "hub_model_id", "hub_token", "hub_private_repo",
        # watching the run
        "health", "health_thresholds", "max_nonfinite_steps",
        # evaluation
        "eval_strategy", "eval_steps", "eval_on_start", "per_device_eval_batch_size", "num_sample_generations",
        "num_generations_eval", "metric_for_best_model", "greater_is_better",
        # how, not what, is computed: memory and speed
        "dataset_num_proc", "local_rollout_forward_batch_size", "gradient_checkpointing",
        "gradient_checkpointing_kwargs", "ds3_gather_for_generation",
    }
)  # fmt: skip
SECRET_FIELDS = ("hub_token",)  # not written into checkpoints or the history

# How a part of the run started, not a setting of the run: never reported as a change (each part records where it
# resumed from).
NOT_COMPARED = frozenset({"resume_from_checkpoint", "overwrite_output_dir", "allow_config_change", *SECRET_FIELDS})


@dataclass
class Resume:
    """A checkpoint to resume from: its path and trainer_state.json (read before anything is written)."""

    path: Path
    state: dict

    @property
    def step(self) -> int:
        return int(self.state["progress"]["step"])


def resume_from(args: TrainConfig) -> Resume | None:
    """The checkpoint --resume_from_checkpoint names (verified against its manifest) with its trainer_state.json;
    None when the run starts afresh."""
    if not args.resume_from_checkpoint:
        return None
    path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
    return Resume(path, read_state(path))


def check_changes(resume: Resume, config: Mapping[str, Any], args: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The settings that differ from the checkpoint's: refused (ConfigError listing each) where one is not in
    SAFE_TO_CHANGE, unless --allow_config_change. The checkpoint's config is in its trainer_state.json; one
    written before it was (or by another tool) is compared with run_config.json of its run directory."""
    saved = resume.state.get("config")
    if not isinstance(saved, dict):
        saved = read_config(resume.path.parent)
    changes = config_changes(saved, config)
    unsafe = unsafe_changes(changes)
    if unsafe and not args.allow_config_change:
        raise ConfigError(
            f"--resume_from_checkpoint {resume.path}: these settings differ from the checkpoint's (checkpoint "
            f"value -> new value):\n{_changes_text(unsafe)}\nThey shape the saved state or the run it continues, "
            "so the resumed run would not be the run the checkpoint belongs to. Resume with the checkpoint's "
            "values, or pass --allow_config_change to continue with the new ones (the change is recorded in "
            f"{os.path.join(args.output_dir, HISTORY_FILE)})."
        )
    if changes:
        flagged = " (allowed by --allow_config_change)" if unsafe else ""
        note(
            f"resuming {resume.path} with changed settings{flagged}, recorded in "
            f"{os.path.join(args.output_dir, HISTORY_FILE)}:\n{_changes_text(changes)}"
        )
    return changes


def recorded_config(args: TrainConfig) -> dict[str, Any]:
    """The config as a checkpoint and the run's history record it: plain JSON values, secrets hidden."""
    config = json.loads(json.dumps(to_jsonable(args.to_dict())))
    for name in SECRET_FIELDS:
        if config.get(name) is not None:
            config[name] = "<hidden>"
    return config


def config_changes(saved: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fields whose value in `new` differs from `saved` (both as recorded_config writes them): name ->
    (saved value, new value). A field either lacks (a config of another rlhfkit version) and those of NOT_COMPARED
    are not compared."""
    changes = {}
    for name, value in new.items():
        if name in saved and name not in NOT_COMPARED and not _same_value(saved[name], value):
            changes[name] = (saved[name], value)
    return changes


def unsafe_changes(changes: Mapping[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The changes a resume refuses without --allow_config_change: those of fields not in SAFE_TO_CHANGE."""
    return {name: change for name, change in changes.items() if name not in SAFE_TO_CHANGE}


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _changes_text(changes: Mapping[str, tuple[Any, Any]]) -> str:
    return "\n".join(f"  {name}: {json.dumps(old)} -> {json.dumps(new)}" for name, (old, new) in changes.items())
