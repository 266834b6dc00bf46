"""transformers' callbacks in an rlhfkit run: a ``TrainerState`` and ``TrainerControl`` kept as transformers'
``Trainer`` keeps them, and its events sent at the same points of the loop (run.py), through transformers' own
``CallbackHandler``.

Where each event fires:

==================  ===============================================================================================
on_init_end         the trainer is built
on_train_begin      ``train()`` starts, before the step-0 evaluation
on_step_begin       before each step (a PPO update, a GRPO optimizer step); resets should_log/evaluate/save
on_step_end         after the step's optimisation, before its row, evaluation and checkpoint
on_log              each row written to metrics.jsonl (training window, evaluation, ``trainer.log``, the summary row
                    that ends ``train()``), as ``logs``
on_evaluate         after each evaluation, with ``metrics`` under transformers' names (``eval_task_success``)
on_save             after each checkpoint
on_train_end        after the final checkpoint, the models saved in output_dir and the summary row
==================  ===============================================================================================

What a callback's ``control`` does, set at on_step_end (or earlier in the step): ``should_log``,
``should_evaluate`` and ``should_save`` add a row, an evaluation or a checkpoint at that step to the run's own
schedule (--logging_steps, --eval_strategy, --save_strategy: the schedule transformers' DefaultFlowCallback would
set, which is therefore not installed); ``should_training_stop`` makes the step the run's last: its window is
logged, the final checkpoint written and the models saved, as at the end of a full run.

``state.log_history`` holds every row of metrics.jsonl, in order, each with its ``step`` (a resumed run reads the rows
up to its checkpoint back from metrics.jsonl); the last after ``train()`` is transformers' summary row
(``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``, ``total_flos``, ``train_loss``,
``epoch``; run.py). ``state.global_step`` and ``state.epoch`` follow the run's progress; ``max_steps`` and
``num_train_epochs`` are the whole run's.

Evaluation metrics: the registry names them ``eval/...`` (metrics.jsonl, the trackers); transformers' ``evaluate``
returns and sends to on_evaluate ``eval_...``. ``trainer.evaluate(metric_key_prefix=P)`` swaps the ``eval`` part for
P in both (``test/reward`` logged, ``test_reward`` returned), as transformers' keys and its trackers' ``test/`` do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler, ExportableState

from rlhfkit.errors import ConfigError
from rlhfkit.tracking.rundir import METRICS_FILE, read_jsonl
from rlhfkit.trainers.schedule import interval


class _Handler(CallbackHandler):
    """transformers' CallbackHandler without its warning that DefaultFlowCallback is missing: the run's Schedule
    plays that part (module docstring)."""

    def __init__(self, callbacks: Sequence, model, processing_class, optimizer):
        self.callbacks = []
        for callback in callbacks:
            self.add_callback(callback)
        self.model, self.processing_class, self.optimizer = model, processing_class, optimizer
        self.lr_scheduler = None  # rlhfkit sets each step's learning rate itself (optim.lr_schedule)
        self.train_dataloader = self.eval_dataloader = None


EVAL_PREFIX = "eval"  # transformers' metric_key_prefix default; the registry's evaluation metrics are eval/...


def prefixed(scalars: Mapping[str, float], prefix: str) -> dict[str, float]:
    """An evaluation's metrics (registry names, ``eval/reward``) as logged under metric_key_prefix `prefix`:
    ``test/reward`` for "test"; unchanged for "eval"."""
    return {f"{prefix}/{name.removeprefix(EVAL_PREFIX + '/')}": value for name, value in scalars.items()}


def eval_metric_names(scalars: Mapping[str, float], prefix: str = EVAL_PREFIX) -> dict[str, float]:
    """An evaluation's metrics as logged (``eval/task_success``, or ``test/...`` under `prefix` "test") under
    transformers' names: ``eval_task_success``, the form ``Trainer.evaluate`` returns and ``--metric_for_best_model``
    reads (``task_success`` or ``eval_task_success``)."""
    return {f"{prefix}_{name.removeprefix(prefix + '/')}": value for name, value in scalars.items()}


class Callbacks:
    """The run's TrainerState, TrainerControl and callbacks (module docstring)."""

    def __init__(
        self,
        args,
        callbacks: Sequence[TrainerCallback | type] | None,
        *,
        model,
        processing_class,
        optimizer,
        max_steps: int,
        num_train_epochs: int,
        is_local_process_zero: bool,
        is_world_process_zero: bool,
    ):
        self.args = args
        self.handler = _Handler(callbacks or [], model, processing_class, optimizer)
        self.state = TrainerState(
            max_steps=max_steps,
            num_train_epochs=num_train_epochs,
            train_batch_size=args.per_device_train_batch_size,
            is_local_process_zero=is_local_process_zero,
            is_world_process_zero=is_world_process_zero,
            stateful_callbacks=[cb for cb in self.handler.callbacks if isinstance(cb, ExportableState)],
            logging_steps=interval(args.logging_steps, max_steps),
            eval_steps=interval(args.eval_steps or args.logging_steps, max_steps),  # transformers' fallback
            save_steps=interval(args.save_steps, max_steps),
        )
        self.control = TrainerControl()

    def event(self, name: str, **kwargs: Any) -> TrainerControl:
        """Send event `name` (``on_step_end``, ...) to every callback; returns the control they leave."""
        self.control = getattr(self.handler, name)(self.args, self.state, self.control, **kwargs)
        return self.control

    def at_step(self, step: int, epoch: float | None) -> None:
        self.state.global_step = step
        if epoch is not None and math.isfinite(epoch):
            self.state.epoch = epoch

    def logged(self, step: int, row: Mapping[str, float]) -> None:
        """A row was written to metrics.jsonl at `step`: into log_history, then on_log."""
        self.state.log_history.append({"step": step, **row})
        self.event("on_log", logs=dict(row))

    def evaluated(self, scalars: Mapping[str, float], prefix: str = EVAL_PREFIX) -> dict[str, float]:
        """An evaluation ended with `scalars` (as logged, `prefix`/...): on_evaluate with transformers' names,
        returned."""
        metrics = eval_metric_names(scalars, prefix)
        self.event("on_evaluate", metrics=metrics)
        return metrics

    def track_best(self, metrics: Mapping[str, float]) -> None:
        """state.best_metric and best_global_step after an evaluation of the eval set (`metrics`: transformers'
        names, every named set's), as transformers' Trainer keeps them with --metric_for_best_model (after
        on_evaluate, so a callback compares the new value with the best before it)."""
        if not self.args.metric_for_best_model:
            return
        name = self.args.metric_for_best_model.removeprefix("eval/").removeprefix("eval_")
        key, state = f"eval_{name}", self.state
        if key not in metrics:
            raise ConfigError(
                f"metric_for_best_model={self.args.metric_for_best_model!r}: the evaluation has no {key} (it has "
                f"{', '.join(sorted(metrics))}). Pass one of those."
            )
        value, best = metrics[key], state.best_metric
        if best is None or (value > best if self.args.greater_is_better else value < best):
            state.best_metric, state.best_global_step = value, state.global_step

    def read_history(self, output_dir: str, up_to_step: int) -> None:
        """A resumed run's log_history: the rows of metrics.jsonl up to the checkpoint's step."""
        path = Path(output_dir) / METRICS_FILE
        if path.is_file():
            rows, _ = read_jsonl(path)
            self.state.log_history = [row for row in rows if row.get("step", 0) <= up_to_step]

    # What a checkpoint keeps of the callbacks: the best metric and the state of callbacks that export one.
    def state_dict(self) -> dict[str, Any]:
        state = self.state
        exported = [
            {"name": type(cb).__name__, **cb.state()}
            for cb in self.handler.callbacks
            if isinstance(cb, ExportableState)
        ]
        return {
            "best_metric": state.best_metric,
            "best_global_step": state.best_global_step,
            "best_model_checkpoint": state.best_model_checkpoint,
            "callbacks": exported,
        }

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        state = self.state
        state.best_metric = saved.get("best_metric")
        state.best_global_step = saved.get("best_global_step")
        state.best_model_checkpoint = saved.get("best_model_checkpoint")
        exporting = [cb for cb in self.handler.callbacks if isinstance(cb, ExportableState)]
        for callback, exported in zip(exporting, saved.get("callbacks", [])):
            if type(callback).__name__ != exported["name"]:
                continue  # a different callback list than the checkpointed run's: start that one fresh
            for key, value in exported.get("attributes", {}).items():
                setattr(callback, key, value)
