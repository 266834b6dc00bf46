r"""GRPO with rlhfkit, in the shape of TRL 1.16's trl/scripts/grpo.py: reward models and reward functions from the
command line, the dataset loaded as TRL's script loads it, then ``GRPOTrainer`` trains, saves and ends.

On the built-in task (offline, a few minutes on 2 CPU cores; the assets are built on first use and cached), with the
task's rule-based rewards as a dotted reference, as TRL's --reward_funcs takes them:

    ASSETS=$(python -c "from rlhfkit.tasks import builtin_assets; print(builtin_assets('default', log=lambda *a, **k: None))")
    python examples/grpo.py \
        --model_name_or_path $ASSETS/sft --dataset_name $ASSETS/prompts --task $ASSETS \
        --reward_funcs rlhfkit.tasks.sort.correctness rlhfkit.tasks.sort.partial_credit \
        --output_dir runs/grpo-example --learning_rate 1e-4 --num_generations 8 --per_device_train_batch_size 64 \
        --max_completion_length 8 --max_steps 200 --report_to none

On a real model (hub ids or local directories; my_rewards.py in the current directory defines accuracy):

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml examples/grpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name trl-lib/DeepMath-103K \
        --reward_funcs my_rewards.accuracy think_format_reward --max_completion_length 256 \
        --num_generations 8 --per_device_train_batch_size 16 --output_dir runs/grpo-qwen

The flags are read as TRL's script reads them, by one HfArgumentParser over GRPOScriptArguments, GRPOConfig and
ModelConfig (rlhfkit's have TRL's fields; TRL's own classes work as well).

Where it differs from TRL's script: --reward_funcs also takes 'module:function', 'path/to/file.py:function'
and, with --task, the task's own reward names; the dataset's test split is the eval dataset whenever it exists
(rlhfkit's --num_sample_generations schedule evaluates on it even with --eval_strategy no); with --task, the task's
checker measures true success (eval/task_success). ``rlhfkit grpo`` with the same flags does all of this.
"""

from transformers import HfArgumentParser

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.config import GRPOScriptArguments, ModelConfig
from rlhfkit.data import load_prompt_splits
from rlhfkit.rewards import resolve_reward_funcs
from rlhfkit.tasks import load_task


def make_parser() -> HfArgumentParser:
    return HfArgumentParser((GRPOScriptArguments, GRPOConfig, ModelConfig))


def main(script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> GRPOTrainer:
    task = load_task(training_args.task) if training_args.task else None
    # How the trainer loads the model it is given by name (TRL's script does the same)
    training_args.model_init_kwargs = dict(
        revision=model_args.model_revision, attn_implementation=model_args.attn_implementation, dtype=model_args.dtype
    )

    # Get the reward models and functions, in TRL's order: the reward models first, then the functions.
    reward_funcs = [*(training_args.reward_model_path or [])]
    if script_args.reward_model_name_or_path:
        reward_funcs.append(script_args.reward_model_name_or_path)
    if script_args.reward_funcs or not reward_funcs:  # no reward named at all: the task's own rewards, if any
        reward_funcs += resolve_reward_funcs(script_args.reward_funcs, task)

    # Load the dataset: a hub id, a directory written by save_to_disk, a directory of data files, or one file.
    train_dataset, eval_dataset = load_prompt_splits(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args.dataset_test_split,
        script_args.dataset_config,
    )

    # Initialize the GRPO trainer (model: a hub id or local path; LoRA from --use_peft and the --lora_* flags)
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=model_args.lora_config(),
        task=task,
    )

    # Train the model
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print("Training completed.")

    # Save the model (with its tokenizer), then finish the trackers and the process group
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    trainer.end()
    return trainer


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_into_dataclasses()
    main(script_args, training_args, model_args)
