"""RunLogger: one object per training run that sends metrics, histograms and completion tables to the
trackers (through accelerate) and keeps the run directory's own record, written first so that it never
depends on a tracker.

    accelerator = Accelerator(log_with=make_trackers(report_to, project=..., run_name=..., output_dir=...))
    logger = RunLogger(accelerator, output_dir, config, project, run_name, report_to)
    logger.log(scalars, step)
    logger.log_table("completions", columns, rows, step)
    logger.finish()

Every method may be called on every process; only the main process writes files, prints or talks
to a tracker.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlhfkit.errors import StorageError
from rlhfkit.metrics import registry as M
from rlhfkit.tracking.rundir import METRICS_FILE, RunDirectory, to_jsonable
from rlhfkit.tracking.tables import format_cell, markdown_table, rich_table
from rlhfkit.tracking.trackers import (
    flatten_config,
    resolve_report_to,
    trackio_init_kwargs,
    wandb_init_kwargs,
)


def _number(value: Any) -> int | float:
    """A plain int/float: accelerate's TensorBoard tracker silently skips NumPy floats and tensors."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    item = getattr(value, "item", None)
    return item() if callable(item) else float(value)


def _finite_values(values: Any) -> np.ndarray:
    """1-D float64 array without NaN/inf: histogram binning needs a finite range."""
    if hasattr(values, "detach"):  # torch.Tensor, possibly on an accelerator device
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    return array[np.isfinite(array)]


def _tracker_name(tracker: Any) -> str:
    """Name of an entry of Accelerator.log_with: a GeneralTracker object or a LoggerType (a str enum)."""
    from accelerate.tracking import GeneralTracker

    return tracker.name if isinstance(tracker, GeneralTracker) else str(tracker)


def _wandb_table_key(key: str, step: int) -> str:
    # W&B's table panel shows the latest table logged under a key; a key per step keeps every step's samples in view.
    return f"{key}/step_{step:06d}"


GLOBAL_STEP = "train/global_step"


def quiet_tensorboard_writer_threads() -> None:
    """Keep the traceback of TensorBoard's writer thread off the console (once per process).

    When its event file cannot be written (a full disk, a removed directory), TensorBoard's writer thread keeps the
    error, raises it again in the thread that writes next, and also lets Python print it as "Exception in thread";
    that next write is RunLogger's, which reports the failure once and drops the tracker (_guarded). Other threads'
    errors are printed as before."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = type(args.thread)
        if not (thread.__name__ == "_AsyncWriterThread" and thread.__module__.startswith("tensorboard.")):
            previous(args)

    hook.quiets_tensorboard = True
    threading.excepthook = hook


def with_columns(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    extra: Mapping[str, Sequence[Any]],
    before: str | None = None,
) -> tuple[list[str], list[list[Any]]]:
    """`columns` and `rows` with the `extra` columns (name -> one value per row) inserted before column `before`
    (after the last when None or not a column). A name already among the columns, or a column whose number of values
    is not the number of rows, is a ValueError naming it: a table must not silently drop or misalign a column."""
    columns = [str(c) for c in columns]
    names = [str(name) for name in extra]
    for name, values in zip(names, extra.values()):
        if name in columns:
            raise ValueError(
                f"extra column {name!r} is already a column of the table ({', '.join(columns)}): give it another name"
            )
        if len(values) != len(rows):
            raise ValueError(f"extra column {name!r} has {len(values)} values for {len(rows)} rows: give one per row")
    at = columns.index(before) if before in columns else len(columns)
    cells = [to_jsonable(list(values)) for values in extra.values()]
    out = [[*row[:at], *(column[i] for column in cells), *row[at:]] for i, row in enumerate(rows)]
    return [*columns[:at], *names, *columns[at:]], out


def tracker_key(name: str) -> str:
    """The key a metric has in the trackers: TRL's, as transformers' callbacks rewrite its logs (eval/* and, from
    evaluate(metric_key_prefix="test"), test/* as named; everything else under train/), so TRL and rlhfkit runs share
    charts. The run directory keeps the bare name."""
    return name if name.startswith(("eval/", "test/")) else f"train/{name}"


class RunLogger:
    """Trackers plus run directory for one training run.

    accelerator: an ``accelerate.Accelerator`` whose ``log_with`` holds the run's trackers, ideally
        built by :func:`rlhfkit.tracking.make_trackers` (per-run TensorBoard directory). Tracker names
        (``log_with=["wandb"]``) also work; TensorBoard then writes to <accelerator logging_dir>/<project>.
    output_dir: run directory (run_config.json, metrics.jsonl, samples.jsonl; W&B files under output_dir/wandb).
    config: the resolved config, JSON-able after conversion of tensors/paths; flattened for the trackers.
    project, run_name: tracker project and run name (Trackio project, W&B project; both show run_name).
    report_to: the run's report_to setting; must name the same trackers the accelerator holds.
    logging_dir: TensorBoard root; kept for reference (make_trackers is where it takes effect).
    resume: append to metrics.jsonl/samples.jsonl instead of starting them afresh, and continue the
        Trackio run of the same name (W&B continues a run only when $WANDB_RUN_ID names it).
    resume_step: with resume, drop the run directory's lines logged after this step (see RunDirectory.prepare).
    legacy_names: also send each metric to the trackers under the older trainer's names (--log_legacy_names).
    """

    def __init__(
        self,
        accelerator: Any,
        output_dir: str | os.PathLike,
        config: Mapping[str, Any],
        project: str,
        run_name: str,
        report_to: str | Sequence[str] | None,
        logging_dir: str | os.PathLike | None = None,
        *,
        resume: bool = False,
        resume_step: int | None = None,
        legacy_names: bool = False,
    ):
        self.accelerator = accelerator
        self.legacy_names = legacy_names
        self.output_dir = Path(output_dir)
        self.project = project
        self.run_name = run_name
        self.logging_dir = logging_dir
        self.is_main = accelerator.is_main_process
        self.run_dir = RunDirectory(self.output_dir)
        self._console = None
        self._progress = None

        wanted = resolve_report_to(report_to)
        held = sorted(_tracker_name(t) for t in accelerator.log_with)
        if sorted(wanted) != held:
            raise ValueError(
                f"report_to resolves to {wanted} but the Accelerator was created with trackers {held}; "
                "create it with Accelerator(log_with=rlhfkit.tracking.trackers.make_trackers(report_to, ...))"
            )
        self.tracker_names = wanted
        if "tensorboard" in wanted:
            quiet_tensorboard_writer_threads()

        if self.is_main:
            # Also creates output_dir, which W&B writes into.
            # train()'s summary row comes after its final checkpoint: a run resumed from that checkpoint logs its own
            self.run_dir.prepare(
                config, resume=resume, resume_step=resume_step, after_checkpoint=[M.TRAIN_RUNTIME.name]
            )
        # Used only for trackers given by name; tracker objects from make_trackers carry their settings.
        init_kwargs = {
            "wandb": wandb_init_kwargs(run_name, self.output_dir, resume),
            "trackio": trackio_init_kwargs(run_name, resume),
        }
        accelerator.init_trackers(project, config=None, init_kwargs=init_kwargs)  # main process only
        if self.is_main:
            self._store_config(flatten_config(to_jsonable(config)))
            if (run := self._tracker("wandb")) is not None:
                # As transformers' WandbCallback: every chart's x-axis is the trainer step, train/global_step.
                run.define_metric(GLOBAL_STEP)
                run.define_metric("*", step_metric=GLOBAL_STEP, step_sync=True)
            self._announce()

    # ------------------------------------------------------------------------------------------

    def _tracker(self, name: str):
        """The tracker library's own run object (wandb Run, trackio Run, SummaryWriter) or None."""
        if not self.is_main or name not in self.tracker_names:
            return None
        return self.accelerator.get_tracker(name, unwrap=True)

    def _guarded(self, name: str, call) -> None:
        """Run `call()` for tracker `name`; if it fails, report it once and drop the tracker.

        A tracker is an observer: its failure (network down, disk full, a bug in its library) must not end a
        run whose own record (metrics.jsonl) and other trackers are fine.
        """
        if name not in self.tracker_names:
            return
        try:
            call()
        except Exception as e:
            self.tracker_names = [n for n in self.tracker_names if n != name]
            self.accelerator.trackers = [t for t in self.accelerator.trackers if t.name != name]
            self.console.print(
                f"[rlhfkit] the {name} tracker failed ({type(e).__name__}: {e}); it is dropped for the rest of the "
                f"run. Training goes on; every metric is still in {self.output_dir / METRICS_FILE}"
                + (f" and in {', '.join(self.tracker_names)}." if self.tracker_names else "."),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _store_config(self, flat: dict[str, Any]) -> None:
        for tracker in self.accelerator.trackers:
            if tracker.name == "trackio":
                # accelerate's TrackioTracker.store_init_configuration calls dict.update(values,
                # allow_val_change=True), which stores a stray "allow_val_change" key in the run config.
                # The run's config dict is sent with its first log, so updating it here is enough.
                tracker.tracker.config.update(flat)
            else:
                tracker.store_init_configuration(flat)

    def _announce(self) -> None:
        run = self._tracker("wandb")
        if run is not None and getattr(run, "offline", False):
            self.console.print(
                f"W&B run is offline; upload it later with: wandb sync {Path(run.dir).parent}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console

            self._console = Console()
        return self._console

    # ------------------------------------------------------------------------------------------

    def _tracker_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` under their tracker keys (tracker_key), plus the older trainer's names with legacy_names."""
        keyed = {tracker_key(name): value for name, value in values.items()}
        return {**keyed, **M.older_names(dict(values))} if self.legacy_names else keyed

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Around a write of the run directory's own record (metrics, samples, findings): an OSError (a full disk, a
        lost mount) becomes a StorageError naming the file, the cause and how to go on."""
        try:
            yield
        except OSError as e:
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            cause = "no space left on device" if full else (e.strerror or str(e))
            raise StorageError(
                f"Could not write {e.filename or self.output_dir}: {cause}. The run's state is in its checkpoints: "
                f"{'free some space' if full else 'fix the cause'}, then continue with the same command plus "
                f"--output_dir {self.output_dir} --resume_from_checkpoint latest (the rows after the last checkpoint "
                "are logged again)."
            ) from e

    def log(self, scalars: Mapping[str, Any], step: int) -> None:
        """Log scalar metrics at `step` as one line of metrics.jsonl (bare names) and to every tracker (TRL's keys,
        with train/global_step)."""
        values = {str(k): _number(v) for k, v in scalars.items()}
        if self.is_main:
            with self.recording():  # first: the run's own record never depends on a tracker
                self.run_dir.append_metrics(step, values)
            tracked = {**self._tracker_values(values), GLOBAL_STEP: step}
            for tracker in list(self.accelerator.trackers):
                self._guarded(tracker.name, lambda tracker=tracker: tracker.log(tracked, step=step))

    def log_histograms(self, histograms: Mapping[str, Any], step: int) -> None:
        """Log distributions with each tracker's own histogram type.

        Non-finite values are dropped (they cannot be binned; the scalar metrics show NaN). A histogram
        left empty is skipped.
        """
        if not self.is_main:
            return
        arrays = {k: v for k, v in ((str(k), _finite_values(v)) for k, v in histograms.items()) if v.size}
        if not arrays:
            return
        arrays = self._tracker_values(arrays)
        if (writer := self._tracker("tensorboard")) is not None:

            def tensorboard():
                for key, values in arrays.items():
                    writer.add_histogram(key, values, global_step=step)
                writer.flush()

            self._guarded("tensorboard", tensorboard)
        if (run := self._tracker("wandb")) is not None:
            import wandb

            histograms = {k: wandb.Histogram(v) for k, v in arrays.items()}
            self._guarded("wandb", lambda: run.log({**histograms, GLOBAL_STEP: step}, step=step))
        if (run := self._tracker("trackio")) is not None:
            import trackio

            self._guarded("trackio", lambda: run.log({k: trackio.Histogram(v) for k, v in arrays.items()}, step=step))

    def log_table(
        self,
        key: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        step: int,
        console_rows: int | None = None,
        extra_columns: Mapping[str, Sequence[Any]] | None = None,
        extra_before: str | None = None,
    ) -> None:
        """Show a table of completions at `step`: console, samples.jsonl and every tracker that can show one.

        console_rows: print only the first this many rows (all are logged); None prints every row.
        extra_columns: more columns, one value per row each (what reward functions logged with TRL's log_extra),
        inserted before column `extra_before` (TRL puts them before "advantage"), else after the last; a name that
        is already a column, or a column with another number of values than rows, is a ValueError (with_columns).
        Cells may be any JSON-able value (None where a row has none); the trackers get tables that allow mixed types.

        Every tracker gets the table under `key` at `step` (TRL's key is "completions"): Trackio keeps each
        step's table, TensorBoard gets a markdown table as text; W&B, whose table panel shows the latest table of a
        key, also gets it under `key`/step_NNNNNN so every step's samples stay in view.
        """
        if not self.is_main:
            return
        columns = [str(c) for c in columns]
        rows = [to_jsonable(list(row)) for row in rows]
        if any(len(row) != len(columns) for row in rows):
            raise ValueError(f"every row of table {key!r} must have {len(columns)} cells ({columns})")
        if extra_columns:
            columns, rows = with_columns(columns, rows, extra_columns, extra_before)
        if {"step", "key"} & set(columns):
            raise ValueError("table columns 'step' and 'key' are reserved for samples.jsonl")
        duplicates = sorted({c for c in columns if columns.count(c) > 1})
        if duplicates:  # samples.jsonl and the trackers would keep one of them
            raise ValueError(f"table {key!r} has the column {duplicates[0]!r} twice ({columns})")

        shown = rows if console_rows is None else rows[:console_rows]
        if shown:
            self.console.print(rich_table(f"{key} (step {step})", columns, shown))
        with self.recording():
            self.run_dir.append_samples(step, key, columns, rows)
        if (writer := self._tracker("tensorboard")) is not None:

            def tensorboard():
                writer.add_text(key, markdown_table(columns, rows), global_step=step)
                writer.flush()

            self._guarded("tensorboard", tensorboard)
        if (run := self._tracker("wandb")) is not None:
            import wandb

            table = wandb.Table(columns=columns, data=rows, allow_mixed_types=True)
            tables = {key: table, _wandb_table_key(key, step): table, GLOBAL_STEP: step}
            self._guarded("wandb", lambda: run.log(tables, step=step))
        if (run := self._tracker("trackio")) is not None:
            import trackio

            table = trackio.Table(columns=columns, data=rows, allow_mixed_types=True)
            self._guarded("trackio", lambda: run.log({key: table}, step=step))

    def tracker_ids(self) -> dict[str, str]:
        """Identifiers a resumed run needs to continue the same tracker runs (W&B's run id)."""
        run = self._tracker("wandb")
        return {"wandb": run.id} if run is not None else {}

    def alert(self, title: str, text: str, level: str) -> None:
        """Raise an alert with the trackers' own alert APIs (Trackio and W&B show them on the dashboard and can
        forward them to a webhook / Slack). level: "info", "warning" or "critical"."""
        if not self.is_main:
            return
        if (run := self._tracker("trackio")) is not None:
            from trackio.alerts import AlertLevel

            trackio_level = {"info": AlertLevel.INFO, "warning": AlertLevel.WARN}.get(level, AlertLevel.ERROR)
            self._guarded("trackio", lambda: run.alert(title=title, text=text, level=trackio_level))
        if (run := self._tracker("wandb")) is not None:
            wandb_level = {"info": "INFO", "warning": "WARN"}.get(level, "ERROR")
            self._guarded("wandb", lambda: run.alert(title=title, text=text, level=wandb_level))

    def progress(self, update: int, total: int, scalars: Mapping[str, Any], unit: str = "update") -> None:
        """Progress of training: episodes, eps and the registry's crucial values.

        On a terminal, a live rich progress bar (tables printed meanwhile appear above it); in a log file,
        one line every 5% of the updates (and the last), so logs stay readable.
        """
        if not self.is_main:
            return
        crucial = [m.name for m in M.REGISTRY.values() if m.importance == "crucial" and m.kind == "scalar"]
        parts = [f"{name} {format_cell(float(scalars[name]))}" for name in crucial if name in scalars]
        episode, eps = int(scalars.get(M.EPISODE.name, 0)), float(scalars.get(M.EPS.name, 0.0))
        status = f"{M.EPISODE.name} {episode} | {M.EPS.name} {format_cell(eps)} | " + " | ".join(parts)
        if self.console.is_terminal:
            if self._progress is None:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                self._progress = Progress(
                    TextColumn(f"{unit}s"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeRemainingColumn(),
                    TextColumn("{task.description}"),
                    console=self.console,
                )
                self._progress.start()
                self._task = self._progress.add_task("", total=total)
            self._progress.update(self._task, completed=update, description=status)
            if update >= total:
                self._progress.stop()
                self._progress = None
        elif update == total or update % max(1, total // 20) == 0:
            self.console.print(f"{unit} {update}/{total} | {status}", markup=False, highlight=False, soft_wrap=True)

    def finish(self) -> None:
        """End the tracker runs, then accelerator.end_training (which also tears down the process group)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self.is_main:
            for tracker in list(self.accelerator.trackers):
                self._guarded(tracker.name, tracker.finish)
        self.accelerator.trackers = []  # finished above: end_training must not finish them again
        # Every process arrives before any tears the process group down: a process that left early would destroy
        # it under the others' last collectives (seen as an abort at exit under DeepSpeed ZeRO-3 on gloo).
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()
