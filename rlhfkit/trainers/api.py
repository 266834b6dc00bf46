"""TRL's trainer methods on rlhfkit's trainers, with TRL's names and meanings, over the run both trainers hold
(run.py): a TRL script calls ``trainer.train()``, ``trainer.save_model()``, ``trainer.state``, callbacks and the rest,
and gets what transformers' Trainer would give it.

``train()`` (each trainer's) returns transformers' ``TrainOutput(global_step, training_loss, metrics)`` and ends
with transformers' summary row in ``state.log_history`` (run.py ``_end_of_training``): ``train_runtime``,
``train_samples_per_second`` (episodes generated), ``train_steps_per_second``, ``total_flos`` (0.0, as TRL's GRPO
reports: rlhfkit counts no FLOPs), ``train_loss`` and ``epoch``, with its ``step``. training_loss is the mean over the
steps of that call (a resumed run: its own steps) of the step's loss: GRPO's ``loss``; PPO's ``loss/total_avg``, the
loss each update minimised (policy plus vf_coef x value loss, pooled over its tokens; TRL's PPO returns nothing).

Also what both constructors do with TRL's arguments that rlhfkit takes in another form (``peft_config``,
``quantization_config``, ``optimizers``): :func:`trl_constructor_arguments`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState

from rlhfkit.checkpoint import save_into
from rlhfkit.errors import ConfigError
from rlhfkit.models import lora_flags
from rlhfkit.tracking.rundir import LOCK_FILE, MUTEX_FILE
from rlhfkit.trainers.callbacks import EVAL_PREFIX
from rlhfkit.trainers.datasets import tokenize_eval_dataset
from rlhfkit.trainers.run import TrainingRun

# transformers' Trainer.push_to_hub hands its other keywords to create_model_card (TRL's scripts pass dataset_name);
# rlhfkit writes no model card, so they are accepted and change nothing.
MODEL_CARD_KEYWORDS = frozenset(
    {"model_name", "dataset_name", "language", "license", "tags", "finetuned_from", "tasks", "dataset_tags", "dataset",
     "dataset_args"}
)  # fmt: skip
# huggingface_hub's HfApi.upload_folder keywords push_to_hub passes on (repo_id, folder_path, commit_message, token,
# revision and run_as_future come from its own arguments; the repository is a model repository).
UPLOAD_KEYWORDS = frozenset(
    {"path_in_repo", "commit_description", "create_pr", "parent_commit", "allow_patterns", "ignore_patterns",
     "delete_patterns"}
)  # fmt: skip
NEVER_UPLOADED = (LOCK_FILE, MUTEX_FILE)  # the run directory's lock (tracking/rundir.py): whose run, not the model


class TRLTrainerAPI:
    """The methods and attributes of TRL's trainers (transformers' Trainer) that a TRL script uses. A trainer has
    ``self.run`` (its TrainingRun) and ``self.args``."""

    run: TrainingRun

    # State and callbacks (callbacks.py says when each event fires).
    @property
    def state(self) -> TrainerState:
        return self.run.callbacks.state

    @state.setter
    def state(self, state: TrainerState) -> None:
        """transformers' Trainer.state is a plain attribute that tests and callbacks replace: the run then keeps its
        global_step, epoch and log_history in the new object, and the callbacks get it."""
        self.run.callbacks.state = state

    @property
    def control(self) -> TrainerControl:
        return self.run.callbacks.control

    @property
    def callback_handler(self):
        return self.run.callbacks.handler

    def add_callback(self, callback: TrainerCallback | type) -> None:
        self.run.callbacks.handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type) -> TrainerCallback | None:
        return self.run.callbacks.handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type) -> None:
        self.run.callbacks.handler.remove_callback(callback)

    def is_world_process_zero(self) -> bool:
        return self.run.accelerator.is_main_process

    def is_local_process_zero(self) -> bool:
        return self.run.accelerator.is_local_main_process

    @property
    def processing_class(self):
        """The policy's tokenizer under TRL's name (``tokenizer`` is the same object)."""
        return self.tokenizer

    @processing_class.setter
    def processing_class(self, value) -> None:
        self.tokenizer = value

    # What a script calls around train().
    def log(self, logs: Mapping[str, float], start_time: float | None = None) -> None:
        """Log `logs` at the step training has reached: metrics.jsonl, the trackers, state.log_history, on_log.

        start_time: transformers' Trainer adds speed metrics from it (train_runtime, train_tokens_per_second) only
        with --include_num_input_tokens_seen, which rlhfkit does not take; so it changes nothing here, as in
        transformers without that flag. The summary row of train() has its own (run.py)."""
        self.run.begin()
        self.run.log(dict(logs), self.run.progress.step)

    def evaluate(
        self, eval_dataset=None, ignore_keys: list[str] | None = None, metric_key_prefix: str = EVAL_PREFIX
    ) -> dict[str, float]:
        """Evaluate now, as transformers' Trainer.evaluate: on `eval_dataset` when given (prompts, tokenized as the
        trainer's eval_dataset is), else on the trainer's eval_dataset; logged at the step training has reached and
        returned under transformers' names, ``{metric_key_prefix}_{name}``: eval_reward, eval_task_success, GRPO's
        eval_loss (PPO: eval_scores). Another prefix renames the logged metrics too: "test" logs test/reward
        (metrics.jsonl, and test/reward in the trackers, where transformers' callbacks send test_* keys) and returns
        test_reward. Several
        named sets (a dict or DatasetDict, given here or to the trainer) are evaluated one by one under
        ``{metric_key_prefix}_{set name}``, as transformers does: eval_easy/reward logged, eval_easy_reward returned.
        Only the trainer's own eval_dataset under "eval" moves state.best_metric (--metric_for_best_model).

        ignore_keys: in transformers, the keys of the model's outputs left out of the predictions gathered for
        compute_metrics. rlhfkit's evaluation generates completions and scores them, gathering no model outputs,
        so the argument has no effect."""
        if not isinstance(metric_key_prefix, str) or not metric_key_prefix or "/" in metric_key_prefix:
            raise ConfigError(
                f"evaluate(metric_key_prefix={metric_key_prefix!r}): a prefix is a name without '/', such as 'eval' "
                "(the default) or 'test'."
            )
        if eval_dataset is None and getattr(self, "eval_prompts", None) is None:
            raise ConfigError(
                "evaluate() needs an evaluation dataset: pass eval_dataset= to the trainer (or --dataset_test_split) "
                "or to evaluate()."
            )
        tools = getattr(self, "tools", None) or None  # with tools, the prompts show the model its tools
        dataset = (
            None if eval_dataset is None else tokenize_eval_dataset(self.args, self.tokenizer, eval_dataset, tools)
        )
        self.run.begin()
        return self.run.evaluate(dataset, metric_key_prefix)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the models and the tokenizer into `output_dir` (default args.output_dir), as checkpoints and the end
        of training save them (the policy loads on its own; with LoRA the adapter)."""
        save_into(self.run.accelerator, output_dir or self.args.output_dir, self.run._model_writer())

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs: Any,
    ):
        """Upload output_dir to the hub repository --hub_model_id (default: the output_dir's name under your user), as
        transformers' Trainer.push_to_hub does. Returns the commit's CommitInfo, or with blocking=False at once a
        Future of it (huggingface_hub's run_as_future); None on processes other than the main one.

        token: default --hub_token. revision: the branch to commit to (default main). private: the visibility of a
        repository created now (default --hub_private_repo). kwargs: huggingface_hub's upload_folder keywords
        path_in_repo, commit_description, create_pr, parent_commit, allow_patterns, ignore_patterns and
        delete_patterns, passed on; transformers' model-card keywords (model_name, dataset_name, tags, ...) are
        accepted and change nothing (rlhfkit writes no model card); any other is refused. The run directory's lock
        files (.rlhfkit.lock, .rlhfkit.mutex) are never uploaded."""
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

        unknown = sorted(set(kwargs) - MODEL_CARD_KEYWORDS - UPLOAD_KEYWORDS)
        if unknown:
            raise ConfigError(
                f"push_to_hub({', '.join(f'{name}=...' for name in unknown)}): not a keyword push_to_hub takes. It "
                f"takes commit_message, blocking, token, revision, private, upload_folder's "
                f"{', '.join(sorted(UPLOAD_KEYWORDS))}, and transformers' model-card keywords "
                f"({', '.join(sorted(MODEL_CARD_KEYWORDS))}), which change nothing."
            )
        upload = {name: value for name, value in kwargs.items() if name in UPLOAD_KEYWORDS}
        upload["ignore_patterns"] = [*_patterns(upload.get("ignore_patterns")), *NEVER_UPLOADED]
        repo_id = getattr(self.args, "hub_model_id", None) or os.path.basename(os.path.abspath(self.args.output_dir))
        self.run.accelerator.wait_for_everyone()
        if not self.is_world_process_zero():
            return None
        api = HfApi(token=token if token is not None else getattr(self.args, "hub_token", None))
        private = private if private is not None else getattr(self.args, "hub_private_repo", None)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=self.args.output_dir,
                commit_message=commit_message,
                revision=revision,
                run_as_future=not blocking,
                **upload,
            )
        except (OfflineModeIsEnabled, HfHubHTTPError, OSError) as e:
            raise ConfigError(
                f"push_to_hub could not upload {self.args.output_dir} to the hub repository {repo_id}: {e}. The "
                "trained model is saved in output_dir; upload it later with `hf upload "
                f"{repo_id} {self.args.output_dir}` once the hub is reachable and you are logged in (`hf auth login`)."
            ) from None

    @property
    def hub_model_id(self) -> str | None:
        return getattr(self.args, "hub_model_id", None)

    def end(self) -> None:
        """Finish the trackers (train() already did), release the run directory and end the process group of a
        multi-process launch (RunLogger.finish does all three); a run that never began only releases the directory."""
        if self.run.logger is None:
            self.run.release_lock()
        else:
            self.run.logger.finish()


def _patterns(patterns: str | list[str] | None) -> list[str]:
    """upload_folder's allow/ignore patterns (one, a list, or none) as a list."""
    if patterns is None:
        return []
    return [patterns] if isinstance(patterns, str) else list(patterns)


def refuse_arguments(owner: str, why: str, **arguments: Any) -> None:
    """TRL constructor arguments rlhfkit takes as None only: any other value exits 2 with `why`, naming them as
    ``owner(name=...)``."""
    given = [name for name, value in arguments.items() if value is not None]
    if given:
        raise ConfigError(f"{owner}({', '.join(f'{name}=...' for name in given)}): {why}")


def trl_constructor_arguments(
    args, peft_config=None, quantization_config=None, optimizers=(None, None), data_collator=None
):
    """The trainer's full arguments (PPOArguments / GRPOArguments): `args` itself when it is one, else a TRL script's
    PPOConfig / GRPOConfig with the script and model groups' defaults (the script loaded its models and data itself).
    TRL's constructor arguments that rlhfkit takes as config fields are moved into them (or refused with the reason):
    a peft LoraConfig becomes --use_peft and its lora_* fields; a BitsAndBytesConfig --load_in_4bit/8bit; a custom
    optimizer or data collator cannot be used."""
    if optimizers is not None and any(o is not None for o in optimizers):
        raise ConfigError(
            "optimizers=(optimizer, scheduler): rlhfkit builds the optimizer over every trained parameter (PPO: the "
            "policy and the value model) and sets each step's learning rate itself. Choose them with --optim, "
            "--learning_rate, --weight_decay, --lr_scheduler_type and --lr_scheduler_kwargs, and pass (None, None)."
        )
    if data_collator is not None:
        raise ConfigError(
            "data_collator: rlhfkit pads the prompts itself (left, with the tokenizer's pad token). Pass None."
        )
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    if peft_config is not None:
        values |= lora_flags(peft_config)
    if quantization_config is not None:
        values |= _quantization_fields(quantization_config, values)
    full = type(args).full_arguments
    if isinstance(args, full):  # rlhfkit's own: the values moved in, checked again by its rules
        if peft_config is not None or quantization_config is not None:
            for name, value in values.items():
                setattr(args, name, value)
            args.__post_init__()
        return args
    return full(**values)


def _quantization_fields(quantization_config, values: dict[str, Any]) -> dict[str, Any]:
    load_in_4bit = bool(getattr(quantization_config, "load_in_4bit", False))
    load_in_8bit = bool(getattr(quantization_config, "load_in_8bit", False))
    if not (load_in_4bit or load_in_8bit):
        raise ConfigError(
            f"quantization_config {type(quantization_config).__name__} asks for neither 4-bit nor 8-bit weights: "
            "rlhfkit quantises the policy with bitsandbytes (--load_in_4bit / --load_in_8bit). Pass None or a "
            "BitsAndBytesConfig."
        )
    fields = {"load_in_4bit": load_in_4bit, "load_in_8bit": load_in_8bit}
    if load_in_4bit:
        quant_type = getattr(quantization_config, "bnb_4bit_quant_type", values.get("bnb_4bit_quant_type", "nf4"))
        fields["bnb_4bit_quant_type"] = quant_type
        fields["use_bnb_nested_quant"] = bool(getattr(quantization_config, "bnb_4bit_use_double_quant", False))
    return fields
