"""The run lifecycle both trainers hold: everything a training run does around its algorithm, in one object.

A trainer builds a :class:`TrainingRun` first: it resolves output_dir, reads the checkpoint to resume from and
creates the accelerator with the trackers, and writes nothing. The trainer then prepares its models and hands itself
to :meth:`TrainingRun.start`. The run begins when train() calls :meth:`TrainingRun.begin` (or an evaluate() or log()
before it): it restores the checkpoint (train()'s resume_from_checkpoint may name another, as in transformers) and
opens the run directory, the trackers and the health watch. ``train()`` then loops over :meth:`TrainingRun.steps`
with its own numbered phases, adds raw metric sums to ``run.metrics`` (its rollout and optimization inside
:meth:`TrainingRun.phase`, which logs their seconds, peak memory and, from the training forwards counted with
:meth:`TrainingRun.count_training_tokens`, MFU) and ends each step with :meth:`TrainingRun.end_step`, where the
logging window, health checks, progress, evaluation, checkpoints and early stops happen the same way for PPO and
GRPO. After the last step the run logs transformers' summary row of the train() call (train_runtime, ..., train_loss:
the mean of the losses the trainer gave :meth:`TrainingRun.add_loss`) and keeps train()'s TrainOutput in
``train_output``.

The logging window: a row logged on the ``logging_strategy`` schedule (by default every ``logging_steps`` steps)
pools every sum and count added since the previous row, as the registry declares per metric (histograms included),
reduced across processes once. A window still open when training ends (a run whose length is not a multiple of
``logging_steps``, or a callback's stop) is merged into the summary row, as TRL's ``log()`` merges its pending
metrics into whatever it logs: that row then holds ``train_loss`` and the last window's ``reward``, ``loss``, ...,
and the health rules see it as they see every window. Counters of the window (skipped non-finite steps) add up
over it; "last" metrics (lr, episode, eps, kl_coef, ...) are the values at the logged step. An unfinished window is
part of a checkpoint, so a resumed run logs the same rows.

What the run needs from its trainer (``start(trainer, ...)``) is the ``Trainee`` protocol (run_parts.py).

One writer per run directory: the main process holds output_dir's lock (tracking.rundir.RunLock) from the end of
``TrainingRun()`` until the run ends (the last step's saves, a clean stop, the trainer's ``end()``); another run on
the directory, in any process of any launch, is refused with RunLockedError naming the holder.

Where the run writes, which checkpoint it resumes and which settings a resume may change are decided in resume.py;
the run records every part of it in run_config_history.jsonl.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, NoReturn

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import broadcast_object_list, set_seed
from transformers.trainer_utils import TrainOutput

from rlhfkit import perf
from rlhfkit.checkpoint import (
    ENGINE_DIR,
    checkpoint_path,
    load_optimizer,
    load_process_state,
    resolve_checkpoint,
    save_checkpoint,
    save_into,
    set_rng_state,
)
from rlhfkit.config import TrainConfig
from rlhfkit.engines import (
    Engine,
    deepspeed_step,
    full_state_dict,
    gathered,
    make_accelerator,
    name_deepspeed_accelerator,
    prepare_frozen,
    process_share,
)
from rlhfkit.errors import (
    ConfigError,
    GenerationWorkerStopped,
    HealthStop,
    Interrupted,
    NonFiniteStop,
    RunLockedError,
    StorageError,
)
from rlhfkit.health.watch import HealthWatch
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.models import enable_gradient_checkpointing, mixed_precision, padding_free_refused, write_merged
from rlhfkit.optim import lr_schedule, make_optimizer, set_lr
from rlhfkit.rewards import LoggedMetricsWindow
from rlhfkit.tracking.logger import RunLogger
from rlhfkit.tracking.rundir import MERGED_DIR, RunLock, locked_message
from rlhfkit.tracking.trackers import make_trackers, resolve_report_to
from rlhfkit.trainers.callbacks import EVAL_PREFIX, Callbacks, prefixed
from rlhfkit.trainers.guards import InterruptGuard, StepGuard
from rlhfkit.trainers.resume import (
    Resume,
    check_changes,
    recorded_config,
    refuse_other_run,
    resolve_output_dir,
    resume_from,
    unsafe_changes,
)
from rlhfkit.trainers.run_parts import PHASES, LockReleasingLogger, Progress, StepLosses, Trainee, TrainingFlops
from rlhfkit.trainers.schedule import Schedule


class TrainingRun:
    """One training run's accelerator, trackers, logging window, health watch, progress and checkpoints."""

    def __init__(self, args: TrainConfig):
        """Resolve output_dir and report_to, read the checkpoint to resume from and compare its config, create the
        accelerator, then lock output_dir (the main process). Writes nothing before the lock: a bad flag or
        checkpoint, a refused config change or a run already writing output_dir fails here with it untouched."""
        self.args = args
        name_deepspeed_accelerator()
        resolve_output_dir(args)
        try:
            self.report_to = resolve_report_to(args.report_to)
        except (ValueError, ImportError) as e:
            raise ConfigError(f"--report_to: {e}") from None
        self.config = recorded_config(args)
        self.resume = resume_from(args)
        self.changes: dict[str, tuple[Any, Any]] = {}  # fields changed from the checkpoint's (resume)
        if self.resume is not None:
            self.changes = check_changes(self.resume, self.config, args)
        self.accelerator, self.engine = self._make_accelerator()
        if getattr(args, "async_generation", False) and self.engine.sharded:
            raise ConfigError(
                f"async_generation with {self.engine} is not supported yet: the generation worker needs the policy's "
                "whole weights after every update, and this engine shards them. Use DDP, DeepSpeed ZeRO-1/2 or one "
                "process, or leave async_generation off."
            )
        self.lock: RunLock | None = None
        self._lock_output_dir()
        self._frozen: list = []  # what keeps the frozen models' engines alive (engines.prepare_frozen)
        self.progress = Progress()
        self.guard = StepGuard(args.max_nonfinite_steps)
        self.interrupt = InterruptGuard()
        self.metrics = MetricAccumulator()
        self.reward_metrics = LoggedMetricsWindow()  # what reward functions log with log_metric (TRL 1.16)
        self.logger: RunLogger | None = None
        self.health: HealthWatch | None = None
        self._rng: dict | None = None
        self._lr = 0.0
        self._row: dict[str, float] = {}  # the latest logged row: the progress bar shows it until the next one
        self._open_window: Mapping[str, float] | None = None  # a step's "last" scalars while its window is unlogged
        self.losses = StepLosses()  # each step's training loss in the current train() call (train_loss)
        self.train_output: TrainOutput | None = None  # what the last train() call returns (its summary row)

    def _lock_output_dir(self) -> None:
        """Take output_dir's lock on the main process (the only one writing the run directory) for the life of the
        run; when another run holds it, every process raises RunLockedError naming that run (a collective under a
        multi-process launch, so no process goes on alone to wait in the first collective of training)."""
        acc, message = self.accelerator, None
        if acc.is_main_process:
            self.lock, holder = RunLock.acquire(self.args.output_dir)
            if self.lock is None:
                message = locked_message(self.args.output_dir, holder)
        if acc.num_processes > 1:
            message = broadcast_object_list([message])[0]
        if message is not None:
            raise RunLockedError(message)

    def release_lock(self) -> None:
        """Let other runs write output_dir: the run has ended (nothing when this process holds no lock)."""
        if self.lock is not None:
            self.lock.release()

    def _trackers(self) -> list:
        """The run's tracker objects (nothing starts until the run begins): a resumed run continues its W&B run."""
        args = self.args
        tracker_ids = self.resume.state.get("tracker_ids", {}) if self.resume is not None else {}
        return make_trackers(
            self.report_to,
            project=args.project,
            run_name=args.run_name,
            output_dir=args.output_dir,
            logging_dir=args.logging_dir,
            resume=self.resume is not None,
            wandb_id=tracker_ids.get("wandb"),
        )

    def _make_accelerator(self) -> tuple[Accelerator, Engine]:
        """An Accelerator holding the run's trackers, with every library's RNG seeded (differently per process), and
        the engine it runs (the launch's)."""
        args = self.args
        precision = mixed_precision(args.bf16, args.fp16)
        if precision == "fp16" and not torch.cuda.is_available():
            raise ConfigError(
                "--fp16 is float16 mixed precision with loss scaling, which needs a CUDA GPU; this machine has none. "
                "Use --bf16 (bfloat16 autocast works on CPUs, though slower than fp32 without bf16 units) or no flag."
            )
        # accelerate keeps one AcceleratorState per process and refuses a second Accelerator with another precision;
        # a run is a fresh start (a notebook's second trainer, a test), so forget it. The process group (PartialState)
        # stays.
        AcceleratorState._reset_state()
        accelerator, engine = make_accelerator(
            precision,
            self._trackers(),
            per_device_train_batch_size=args.per_device_train_batch_size,
            max_grad_norm=args.max_grad_norm,
            ds3_gather_for_generation=args.ds3_gather_for_generation,
            sync_ref_model=getattr(args, "sync_ref_model", False),  # GRPO's; PPOConfig has none
            merge_adapter=args.merge_adapter,
            cache_implementation=getattr(args, "cache_implementation", None),  # GRPO's; PPOConfig has none
            load_in_4bit=args.load_in_4bit,
            load_in_8bit=args.load_in_8bit,
        )
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if accelerator.num_processes != launched:  # each process would train alone: N copies of one run
            raise ConfigError(
                f"{launched} processes were launched but accelerate joined {accelerator.num_processes} of them "
                f"(distributed type {accelerator.distributed_type.value}): they would train independent copies of the "
                "run. Launch with a config of examples/accelerate_configs/ (multi_gpu.yaml, deepspeed_zero*.yaml, "
                "fsdp2.yaml; cpu_2proc.yaml on CPUs)."
            )
        set_seed(args.seed, device_specific=True)  # each process samples different responses
        return accelerator, engine

    def start(
        self,
        trainer: Trainee,
        num_steps: int,
        extra_metrics: Sequence[M.Metric] = (),
        unit="step",
        epoch_ends: Collection[int] = (),
        callbacks: Sequence | None = None,
        *,
        loss: M.Metric,
    ) -> None:
        """What the run needs from its trainer, at the end of the trainer's construction (then on_init_end). The run
        begins later (:meth:`begin`).

        num_steps: steps of the whole run. extra_metrics: template expansions the trainer logs (per-reward-function
        metrics). unit: what the progress bar counts ("update" for PPO). epoch_ends: the steps that end a pass over
        the prompts (schedule.epoch_end_steps), for the epoch strategies; the last step always counts. callbacks:
        transformers TrainerCallbacks (classes or instances), called as callbacks.py says. loss: the metric of the
        training loss (GRPO's loss, PPO's loss/total_avg), which the trainer adds to with add_loss; its mean over
        the steps of a train() call is train_loss."""
        args = self.args
        if (args.eval_strategy != "no" or args.eval_on_start) and trainer.eval_prompts is None:
            asked = f"eval_strategy={args.eval_strategy!r}" if args.eval_strategy != "no" else "eval_on_start=True"
            raise ConfigError(
                f"{asked} but the trainer got no eval_dataset: nothing to evaluate on. Pass eval_dataset= (the prompts "
                "to evaluate on), or leave eval_strategy at 'no' and eval_on_start off."
            )
        self.trainer, self.num_steps, self.unit, self.loss_metric = trainer, num_steps, unit, loss
        self.metrics = MetricAccumulator(extra_metrics)
        # perf/: the trained model's FLOPs (counted by its modules' shapes, so sharding does not matter), the peak of
        # the device in the dtype it computes in, and whether each phase's peak memory is measured.
        acc = self.accelerator
        self.training_flops = TrainingFlops(trainer.model)
        try:
            self.peak_flops = perf.device_peak_flops(acc.device, self._compute_dtype(trainer.model))
            self.phase_memory = perf.phase_memory_enabled(acc.device)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.schedule = Schedule(args, num_steps, epoch_ends)
        self.lr_at = lr_schedule(args, num_steps)
        self.callbacks = Callbacks(
            args,
            callbacks,
            model=trainer.model,
            processing_class=trainer.tokenizer,
            optimizer=trainer.optimizer,
            max_steps=num_steps,
            num_train_epochs=len(self.schedule.epoch_ends),
            is_local_process_zero=acc.is_local_main_process,
            is_world_process_zero=acc.is_main_process,
        )
        self.callbacks.event("on_init_end")

    def begin(self, resume_from_checkpoint: bool | str | None = None) -> None:
        """Begin the run, once, when it first needs its directory (train(); an evaluate() or log() before it): refuse
        an output_dir holding another run, restore the checkpoint being resumed, then open the run directory, the
        trackers and the health watch.

        resume_from_checkpoint: train()'s, as transformers' Trainer takes it: a checkpoint path, True or "latest"
        (the newest in output_dir), resumed instead of the one the trainer was built with (args.resume_from_checkpoint,
        which it then becomes); None or False: the trainer's. Once the run has begun, only the checkpoint it resumed
        (ConfigError for another)."""
        if resume_from_checkpoint not in (None, False):
            self._resume_instead(resume_from_checkpoint)
        if self.logger is not None:
            return
        args, acc = self.args, self.accelerator
        refuse_other_run(args)
        if self.resume is not None:
            self._restore(self.resume)
        self.logger = LockReleasingLogger(
            self.lock,
            self.accelerator,
            output_dir=args.output_dir,
            config=args.to_dict(),
            project=args.project,
            run_name=args.run_name,
            report_to=self.report_to,
            logging_dir=args.logging_dir,
            resume=self.resume is not None,
            resume_step=self.resume.step if self.resume is not None else None,
            legacy_names=args.log_legacy_names,
        )
        resume_step = self.progress.step if self.resume is not None else None
        if acc.is_main_process:
            unsafe = list(unsafe_changes(self.changes))
            resumed_from = str(self.resume.path) if self.resume is not None else None
            self.logger.run_dir.record_part(self.config, resume_step or 0, resumed_from, self.changes, unsafe)
        self.health = HealthWatch(args.health, args.health_thresholds, self.logger, self.accelerator, resume_step)
        if resume_step is not None:
            self.callbacks.read_history(args.output_dir, resume_step)
            self.callbacks.at_step(resume_step, self.resume.state.get("epoch"))
        if acc.is_main_process:  # `accelerate launch` without a multi-process config trains one process: say so
            processes = f"{acc.num_processes} process{'es' if acc.num_processes > 1 else ''}"
            self.logger.console.print(
                f"[rlhfkit] training on {processes} ({acc.distributed_type.value}, {acc.device}); run directory "
                f"{args.output_dir}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _resume_instead(self, checkpoint: bool | str) -> None:
        """train(resume_from_checkpoint=checkpoint): resume it (and compare its config, as a resume at construction
        does) unless it is the checkpoint the run already resumes."""
        args = self.args
        wanted = "latest" if checkpoint is True else str(checkpoint)
        if self.resume is not None and resolve_checkpoint(wanted, args.output_dir) == self.resume.path:
            return
        if self.logger is not None:
            raise ConfigError(
                f"train(resume_from_checkpoint={checkpoint!r}) after the run began (an earlier train(), evaluate() or "
                "log() call opened it): a checkpoint is restored before the run's first row. Call "
                "train(resume_from_checkpoint=...) first, or build the trainer with args.resume_from_checkpoint="
                f"{wanted!r}."
            )
        args.resume_from_checkpoint = wanted
        self.config = recorded_config(args)
        self.resume = resume_from(args)
        self.changes = check_changes(self.resume, self.config, args)
        self.accelerator.log_with = self._trackers()  # started when the run begins: continue the checkpoint's W&B run

    def _restore(self, resume: Resume) -> None:
        """Weights, optimizer, the trainer's own state, the unfinished logging window, counters and RNG states
        (applied when training starts) of a checkpoint."""
        acc, engine = self.accelerator, self.engine
        extra, self._rng = load_process_state(
            resume.path, resume.state, acc.process_index, acc.num_processes, str(engine)
        )
        if engine.sharded:  # the trained model and optimizer as the engine sharded them; the trainer's other models
            acc.load_state(str(resume.path / ENGINE_DIR))
            self.trainer.load_models(resume.path, trained=False)
        else:
            self.trainer.load_models(resume.path, trained=True)
            load_optimizer(self.trainer.optimizer, resume.path)
        self.trainer.load_state_dict(extra["trainer"])
        self.metrics.load_state_dict(extra["window"])
        self.callbacks.load_state_dict(extra.get("callbacks", {}))
        self.guard.load_state_dict(resume.state["nonfinite"])
        self.progress = Progress(**resume.state["progress"])

    def save_checkpoint(self, step: int) -> str:
        """The whole training state after `step` in output_dir/checkpoint-<step> (atomic; oldest pruned)."""
        path = checkpoint_path(self.args.output_dir, step)
        extra = {
            "trainer": self.trainer.state_dict(),
            "window": self.metrics.state_dict(),
            "callbacks": self.callbacks.state_dict(),
        }
        state = {
            "progress": asdict(self.progress),
            "epoch": self.callbacks.state.epoch,
            "nonfinite": self.guard.state_dict(),
            "tracker_ids": self.logger.tracker_ids(),
            "engine": str(self.engine),
            "config": self.config,  # what a resume compares its config with
        }
        limit = self.args.save_total_limit
        sharded = self.engine.sharded
        optimizer = None if sharded else self.trainer.optimizer
        save_engine = self.accelerator.save_state if sharded else None
        write = self._model_writer()
        save_checkpoint(self.accelerator, path, write, optimizer, state, extra, limit, save_engine)
        self.callbacks.event("on_save")
        return path

    def _model_writer(self):
        """The trainer's write_models(dir, state_dict), given the full weights gathered from the engine (a
        collective under ZeRO-3 and FSDP; None elsewhere: the models' own weights are whole)."""
        state_dict = full_state_dict(self.accelerator, self.engine, self.trainer.model)
        return lambda directory: self.trainer.write_models(directory, state_dict)

    # What a trainer calls where the engine matters (engines.py).
    def gathered(self, model: torch.nn.Module):
        """A context giving the unwrapped `model` (prepared) with whole weights, for sampling (engines.gathered)."""
        return gathered(self.accelerator, self.engine, model)

    def prepare_frozen(self, model: torch.nn.Module | None) -> torch.nn.Module | None:
        """A frozen model (reference, reward model) prepared for the engine (engines.prepare_frozen)."""
        if model is None:
            return None
        return prepare_frozen(self.accelerator, self.engine, model, self._frozen)

    def prepare_trained(
        self, module: torch.nn.Module, policy: torch.nn.Module, checkpointed: Iterable[torch.nn.Module]
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The trained `module` and its optimizer (--optim, over its trainable parameters), prepared by accelerate for
        the launch's engine; with --gradient_checkpointing, the `checkpointed` models recompute their activations. With
        --padding_free, a `policy` whose forward cannot take a packed batch is refused first. On a CPU, --trim_cpu_heap
        (by default: a policy of a large vocabulary) switches the process's heap handling (perf.lean_heap)."""
        args = self.args
        if args.padding_free and (why := padding_free_refused(policy)) is not None:
            raise ConfigError(
                f"--padding_free true: {why}. Load the model with an attention implementation that packs "
                "(--attn_implementation sdpa, or flash_attention_2 on a GPU), or leave --padding_free off."
            )
        if args.gradient_checkpointing:
            for model in checkpointed:
                enable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs)
        vocabulary = getattr(policy.config, "vocab_size", 0) or 0
        if self.accelerator.device.type == "cpu" and perf.wants_lean_heap(args.trim_cpu_heap, vocabulary):
            perf.lean_heap()  # memory for time: where a large vocabulary's logits rows would fill the heap
        optimizer = make_optimizer([p for p in module.parameters() if p.requires_grad], args, self.accelerator.device)
        return self.accelerator.prepare(module, optimizer)

    @contextmanager
    def accumulating(self, model: torch.nn.Module, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward and backward: gradients are synchronised (and, under DeepSpeed, the
        optimizer step taken) only after the `last` micro-batch of an optimizer step."""
        acc = self.accelerator
        acc.sync_gradients = last  # DeepSpeed steps at the end of the accumulation accelerate reports
        try:
            if last:
                yield
            else:
                with acc.no_sync(model):
                    yield
        finally:
            acc.sync_gradients = True

    # ------------------------------------------------------------------------------------------------
    def steps(self) -> Iterator[int]:
        """The steps left to train (1-based), each after setting its learning rate (--lr_scheduler_type).

        Before the first: the evaluation at step 0 (num_sample_generations schedule, or --eval_on_start) and a resumed
        run's RNG states; during: SIGINT/SIGTERM become a clean stop at the end of the step; after the last: the final
        checkpoint (whatever --save_strategy), the models saved into output_dir (which then loads as the trained
        policy), the summary row of the call (train_output), the trackers closed and, with --merge_adapter, the merged
        policy in output_dir/merged."""
        args = self.args
        # Everything a step computes (sampling, scoring, the training forward, evaluation) runs under one precision:
        # accelerate's autocast of --bf16 / --fp16 (nothing without), so the log-probs of sampling and of the
        # update agree as closely as that precision allows.
        autocast = self.accelerator.autocast
        # What this train() call's summary row measures from (transformers starts its clock before on_train_begin).
        call_start, first_step, first_episode = time.time(), self.progress.step, self.progress.episode
        self.losses = StepLosses()
        self.callbacks.event("on_train_begin")
        if self.progress.step == 0 and self.schedule.evaluates_first():
            with self.interrupt, autocast():
                self._evaluate(step=0)
            self._stop_if_asked(0, None)  # a signal during it: checkpoint-0 and the resume line
        if self._rng is not None:
            set_rng_state(self._rng)  # a resumed run samples exactly what the uninterrupted run would have
        self._start = time.time() - self.progress.elapsed
        with self.interrupt, autocast():
            for step in range(self.progress.step + 1, self.num_steps + 1):
                self._lr = self.lr_at(step)
                set_lr(self.trainer.optimizer, self._lr)
                self._step_start = time.perf_counter()
                self.callbacks.event("on_step_begin")
                yield step
                if self.callbacks.control.should_training_stop:  # a callback made this step the last
                    break
        self.save_checkpoint(self.progress.step)
        try:
            save_into(self.accelerator, args.output_dir, self._model_writer())
        except StorageError:  # the final checkpoint holds the trained state; close the trackers before exiting
            self.logger.finish()
            raise
        self.train_output = self._end_of_training(call_start, first_step, first_episode)  # before the trackers close
        self.logger.finish(release=False)  # the merged policy is still to be written into output_dir
        # After the final checkpoint and save, which keep the adapter; the run (its process group too) has ended, so
        # the main process writes it alone.
        if args.merge_adapter and self.accelerator.is_main_process:
            write_merged(self.trainer.policy, self.trainer.tokenizer, os.path.join(args.output_dir, MERGED_DIR))
        self.release_lock()
        self.callbacks.event("on_train_end")

    def sampling_logprobs_exact(self, model: torch.nn.Module) -> bool:
        """Whether the log-probs computed while sampling (KV cache, one token at a time) can stand for a full
        forward's: in fp32 weights without mixed precision they agree to ~1e-6; in bf16 or fp16, weights or
        autocast, cached decoding and a full pass differ by ~1e-2, which PPO would see as spurious clipping."""
        # every weight: a float32 LM head (cast_lm_head_to_fp32) leaves the rest of a bf16 model in bf16
        weights_fp32 = all(p.dtype == torch.float32 for p in model.parameters())
        return weights_fp32 and self.accelerator.mixed_precision == "no"

    @property
    def lr(self) -> float:
        """The learning rate of the current step."""
        return self._lr

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """One of a step's PHASES ("rollout", "optimization"): its seconds (time/<name>) and, where measured, its peak
        memory (perf/peak_memory_gb/<name>). The optimization phase also gives perf/training_tokens_per_s and
        perf/mfu from the training forwards the trainer counted in it (count_training_tokens)."""
        seconds_metric, memory_metric = PHASES[name]
        device = self.accelerator.device
        measure_memory = self.phase_memory and perf.reset_peak_memory(device)
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        self.metrics.add(seconds_metric, seconds, 1)
        if measure_memory and (peak := perf.peak_memory_bytes(device)) is not None:
            self.metrics.add_extreme(memory_metric, peak / 1e9)
        if name == "optimization":
            # Pooled as sums over the window's phases and the processes: sum FLOPs / sum seconds, so FLOPs / (seconds
            # x processes) of the run's devices working side by side.
            tokens, flops = self.training_flops.take()
            self.metrics.add(M.PERF_TRAINING_TOKENS_PER_S, tokens, seconds)
            if self.peak_flops is not None:
                self.metrics.add(M.PERF_MFU, flops / self.peak_flops, seconds)

    def count_training_tokens(self, attention_mask: torch.Tensor) -> None:
        """Count a training forward (one with a backward) over (B, L) `attention_mask`, True on real prompt and
        completion tokens, towards the optimization phase's perf/ metrics."""
        self.training_flops.count(attention_mask)

    def _compute_dtype(self, model: torch.nn.Module) -> torch.dtype:
        """The dtype the trained model's matrix multiplies run in: the autocast dtype of --bf16 / --fp16, else the
        dtype holding most of its floating-point weights (a model loaded in bf16 computes in bf16)."""
        precision = self.accelerator.mixed_precision
        if precision in ("bf16", "fp16"):
            return torch.bfloat16 if precision == "bf16" else torch.float16
        sizes: dict[torch.dtype, int] = {}
        for p in model.parameters():
            if p.is_floating_point():  # ZeRO-3 keeps an empty placeholder and the full size in ds_numel
                sizes[p.dtype] = sizes.get(p.dtype, 0) + getattr(p, "ds_numel", p.numel())
        return max(sizes, key=sizes.get) if sizes else torch.float32

    def optimizer_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Clip the gradients to max_grad_norm and apply them, unless they are NaN/inf (then the step is skipped
        and counted in nonfinite_steps); the norm before clipping goes into grad_norm. Under DeepSpeed the engine
        took the step at the end of the accumulation (accumulating); this records its norm and whether it skipped."""
        if self.accelerator.device.type == "cpu":  # the backward's freed heap, before AdamW's moments need room
            perf.return_freed_heap()
        if self.engine.kind == "deepspeed":
            norm = self.guard.record(*deepspeed_step(model))
        else:
            norm = self.guard.step(self.accelerator, model, optimizer, self.args.max_grad_norm)
        # Autocast keeps the bf16/fp16 copies of the trained weights until its outermost region ends, and the training
        # loop is one region: without this, every forward after the first step would read the first step's weights
        # (--bf16 PPO diverged from update 2, its training and sampling log-probs 0.17 nats/token apart).
        torch.clear_autocast_cache()
        if math.isfinite(norm):
            self.metrics.add(M.GRAD_NORM, norm, 1)

    def global_mean(self, values: torch.Tensor) -> float:
        """Mean of `values` over every process (a collective: every process must call it)."""
        pair = torch.stack([values.double().sum(), torch.tensor(values.numel(), dtype=torch.float64)])
        total, count = self.accelerator.reduce(pair.to(self.accelerator.device), "sum").tolist()
        return total / count if count else 0.0

    def local_rows(self, dataset) -> tuple[list[dict], int]:
        """This process's share of a dataset (every num_processes-th row), e.g. the eval prompts, and how many of
        them are its own: where forwards run in lockstep (ZeRO-3, FSDP) the shares are padded to one length
        (engines.process_share), and the rows past `own` are left out of what the caller reports."""
        acc = self.accelerator
        indices, own = process_share(len(dataset), acc.process_index, acc.num_processes, self.engine.lockstep)
        return [dataset[i] for i in indices], own

    def end_step(self, step: int, scalars: Mapping[str, float] | None = None) -> None:
        """Close training step `step` (a collective: every process calls it).

        scalars: the trainer's "last" metrics at this step (e.g. objective/kl_coef), logged if it ends a window.
        On a logging step the window's metrics are reduced, checked by the health rules and logged; on a sample step
        the trainer evaluates; then the run stops cleanly if asked (signal, critical finding with --health stop,
        too many non-finite steps) or checkpoints on schedule."""
        scalars = scalars or {}
        self.metrics.add(M.STEP_TIME, time.perf_counter() - self._step_start, 1)
        self.losses.end_step()
        self.progress.step, self.progress.elapsed = step, time.time() - self._start
        self.callbacks.at_step(step, scalars.get(M.EPOCH.name))
        control = self.callbacks.event(
            "on_step_end"
        )  # a callback may ask for a row, an evaluation, a checkpoint, a stop
        last = control.should_training_stop
        finding = None
        if self.schedule.is_log_step(step) or control.should_log:
            finding = self._log_window(step, scalars)
            self._open_window = None
        elif self.args.logging_strategy == "no":  # no row will ever pool this window: drop it rather than grow it
            self.metrics.clear()
            self.reward_metrics.reduce()
            self.guard.take_skipped()
        else:  # the next logging step's row pools it, or the summary row if training ends first
            self._open_window = scalars
        self.logger.progress(step, self.num_steps, {**self._row, **self._counters()}, unit=self.unit)
        if self.schedule.is_eval_step(step) or control.should_evaluate:
            self._evaluate(step)
        self._stop_if_asked(step, finding)
        if (self.schedule.is_save_step(step) or control.should_save) and not last:  # the last: steps() saves it
            self.save_checkpoint(step)

    def _counters(self) -> dict[str, float]:
        progress = self.progress
        eps = progress.episode / progress.elapsed if progress.elapsed > 0 else 0.0
        return {M.EPS.name: eps, M.EPISODE.name: progress.episode}

    def _evaluate(self, step: int, dataset=None, prefix: str = EVAL_PREFIX) -> dict[str, float]:
        """The trainer's evaluation at `step` on `dataset` (tokenized; None: its eval_dataset), logged with its
        metrics named `prefix`/... (the registry's eval/... by default); returned under transformers' names
        (`prefix`_..., on_evaluate's). Several named sets (a dict) are evaluated one by one under `prefix`_<name>, as
        transformers' Trainer does: eval_easy/reward logged, eval_easy_reward returned. Only the eval set's own
        evaluations under "eval" move state.best_metric (over every set's metrics together)."""
        own = dataset is None
        dataset = self.trainer.eval_prompts if own else dataset
        if dataset is None:
            return {}
        named = dataset.items() if isinstance(dataset, Mapping) else [(None, dataset)]
        metrics = {}
        for name, part in named:
            part_prefix = prefix if name is None else f"{prefix}_{name}"
            scalars = prefixed(self.trainer.evaluation(step, part), part_prefix)
            self.log(scalars, step)
            metrics |= self.callbacks.evaluated(scalars, part_prefix)
        if own and prefix == EVAL_PREFIX:
            self.callbacks.track_best(metrics)
        return metrics

    def evaluate(self, dataset=None, prefix: str = EVAL_PREFIX) -> dict[str, float]:
        """An evaluation now, at the step training has reached (trainer.evaluate()): on `dataset` (tokenized; None:
        the eval_dataset), its metrics named `prefix`/... in the run directory and `prefix`_... in what it returns."""
        with self.accelerator.autocast():
            return self._evaluate(self.progress.step, dataset, prefix)

    def log(self, values: Mapping[str, float], step: int) -> None:
        """A row of `values` at `step`: metrics.jsonl, the trackers, state.log_history and on_log."""
        self.logger.log(values, step=step)
        self.callbacks.logged(step, values)

    def add_loss(self, total, count=1) -> None:
        """Add to the step's training loss (a sum and how many values it holds): the loss metric's window (start's
        `loss`) and the step's entry in this call's losses, whose mean is train_loss."""
        self.metrics.add(self.loss_metric, total, count)
        self.losses.add(total, count)

    def _end_of_training(self, call_start: float, first_step: int, first_episode: int) -> TrainOutput:
        """The summary row of a train() call as transformers' Trainer logs it at the end of training
        (Trainer._finalize_training, speed_metrics): train_runtime, train_samples_per_second (episodes generated
        during the call), train_steps_per_second, total_flos (0.0: not counted, as TRL's GRPO reports), train_loss
        (the mean of the call's step losses) and epoch, logged at the last step (metrics.jsonl, the trackers,
        state.log_history, on_log). A collective. Returns train()'s TrainOutput(global_step, training_loss,
        metrics)."""
        progress, state = self.progress, self.callbacks.state
        loss = self.losses.mean(self.accelerator)
        runtime = time.time() - call_start
        metrics = {M.TRAIN_RUNTIME.name: round(runtime, 4)}
        if runtime > 0:
            metrics[M.TRAIN_SAMPLES_PER_SECOND.name] = round((progress.episode - first_episode) / runtime, 3)
            metrics[M.TRAIN_STEPS_PER_SECOND.name] = round((progress.step - first_step) / runtime, 3)
        metrics |= {M.TOTAL_FLOS.name: 0.0, M.TRAIN_LOSS.name: loss}
        if state.epoch is not None:
            metrics[M.EPOCH.name] = state.epoch
        state.total_flos = 0.0
        if self._open_window is not None:  # TRL's summary row: the window still open, then the summary's own keys
            window, histograms, _ = self._window_row(progress.step, self._open_window)  # training is over: no stop
            self.log({**window, **metrics}, progress.step)
            self.logger.log_histograms(histograms, step=progress.step)
            self._open_window = None
        else:
            self.log(metrics, progress.step)
        return TrainOutput(progress.step, loss, metrics)

    def _window_row(self, step: int, scalars: Mapping[str, float]):
        """The window reduced into one row (with the step's "last" `scalars`) and checked by the health rules: the
        row, its histograms and the health finding that should stop training (None)."""
        reduced = self.metrics.reduce(self.accelerator)
        row = {
            **reduced.scalars,
            **scalars,
            **self.reward_metrics.reduce(),
            **self._counters(),
            M.LR.name: self._lr,
            M.NONFINITE_STEPS.name: self.guard.take_skipped(),
        }
        finding = self.health.observe(step, row)
        self._row = row
        return row, reduced.histograms, finding

    def _log_window(self, step: int, scalars: Mapping[str, float]):
        """Reduce the window into one row; health checks; log it. Returns a finding that should stop training."""
        row, histograms, finding = self._window_row(step, scalars)
        self.log(row, step)
        self.logger.log_histograms(histograms, step=step)
        return finding

    def _stop_if_asked(self, step: int, finding) -> None:
        """End training cleanly after `step` on a signal, a critical finding (--health stop) or max_nonfinite_steps
        skipped steps in a row: save a checkpoint, close the trackers and raise the TrainingStopped that explains
        what happened and how to go on."""
        signum = self.interrupt.requested(self.accelerator)
        if finding is None and signum is None and not self.guard.exhausted:
            return
        checkpoint = self.save_checkpoint(step)
        self.logger.finish()
        output_dir = self.args.output_dir
        if finding is not None:
            raise HealthStop(finding, checkpoint, output_dir)
        if self.guard.exhausted:
            raise NonFiniteStop(self.guard.streak, step, checkpoint)
        raise Interrupted(signum, step, checkpoint, output_dir)

    def stop_for_generation_worker(self, cause: str) -> NoReturn:
        """The generation worker is gone (`cause` says how), between steps: checkpoint the state after the last
        finished step, close the trackers and raise the GenerationWorkerStopped that says how to resume."""
        step = self.progress.step
        checkpoint = self.save_checkpoint(step)
        self.logger.finish()
        raise GenerationWorkerStopped(cause, step, checkpoint, self.args.output_dir)
