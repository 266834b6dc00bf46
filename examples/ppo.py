r"""PPO with rlhfkit, in the shape of TRL 1.12's examples/scripts/ppo/ppo.py: the script loads the tokenizer, the policy,
the reference, the reward and value models and the prompts itself, and hands them to ``PPOTrainer``.

On the built-in task (offline, a few minutes on 2 CPU cores; the assets are built on first use and cached):

    ASSETS=$(python -c "from rlhfkit.tasks import builtin_assets; print(builtin_assets('default', log=lambda *a, **k: None))")
    python examples/ppo.py \
        --model_name_or_path $ASSETS/tokenizer --sft_model_path $ASSETS/sft --reward_model_path $ASSETS/reward \
        --dataset_name $ASSETS/prompts --task $ASSETS --output_dir runs/ppo-example \
        --learning_rate 1e-4 --kl_coef 0.15 --lam 1.0 --num_ppo_epochs 2 --per_device_train_batch_size 64 \
        --total_episodes 4096 --response_length 8 --stop_token eos --report_to none

On a real model (TRL's TL;DR command; hub ids or local directories):

    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/ppo.py \
        --output_dir models/minimal/ppo_tldr --learning_rate 3e-6 \
        --per_device_train_batch_size 16 --gradient_accumulation_steps 4 --total_episodes 1000000 \
        --model_name_or_path EleutherAI/pythia-1b-deduped \
        --sft_model_path cleanrl/EleutherAI_pythia-1b-deduped__sft__tldr \
        --reward_model_path cleanrl/EleutherAI_pythia-1b-deduped__reward__tldr \
        --dataset_name trl-internal-testing/tldr-preference-sft-trl-style --dataset_test_split validation \
        --local_rollout_forward_batch_size 16 --non_eos_penalty --stop_token eos

The flags are read as TRL's script reads them, by one HfArgumentParser over the script, training and model
arguments (rlhfkit's ScriptArguments and ModelConfig have TRL's fields; TRL's own classes work as well).

Where it differs from TRL's script: the output directory is not deleted first (rlhfkit refuses to overwrite a run:
pass --overwrite_output_dir, or --resume_from_checkpoint latest to continue it); with ``--use_peft`` the reference is
the policy with its adapter disabled, so none is loaded; the prompts are
handed over as text (rlhfkit tokenizes them and drops those over --max_prompt_length), although a
dataset tokenized as TRL's ``prepare_dataset`` does (an ``input_ids`` column alone) works too; with --task, the
task's checker measures true success (eval/task_success). ``rlhfkit ppo`` with the same flags does all of this.
"""

from dataclasses import dataclass, field

from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, HfArgumentParser

from rlhfkit import PPOConfig, PPOTrainer
from rlhfkit.config import ModelConfig
from rlhfkit.config import ScriptArguments as DatasetArguments
from rlhfkit.config.rules import integer, meta
from rlhfkit.data import load_prompt_splits
from rlhfkit.tasks import load_task

# TRL's SIMPLE_CHAT_TEMPLATE: used only by conversational prompts, when the tokenizer has no template of its own.
SIMPLE_CHAT_TEMPLATE = (
    "{% for message in messages %}{{message['role'].capitalize() + ': ' + message['content'] + '\n\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


@dataclass
class ScriptArguments(DatasetArguments):
    """TRL's ScriptArguments (--dataset_name, --dataset_train_split, ...) and what this script adds."""

    eval_samples: int = field(
        default=100,
        metadata=meta(  # help text and the valid values, as rlhfkit's own fields declare them
            "Prompts held out of the train split for evaluation when the dataset has no --dataset_test_split (TRL's "
            "script holds out the last 100). 0: no evaluation.",
            integer(ge=0),
        ),
    )


def make_parser() -> HfArgumentParser:
    return HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))


def main(script_args: ScriptArguments, training_args: PPOConfig, model_args: ModelConfig) -> PPOTrainer:
    if training_args.reward_model_path is None:
        raise SystemExit(
            "examples/ppo.py trains against a reward model: pass --reward_model_path (a 1-label "
            "sequence-classification model with the policy's tokenizer). For reward functions use "
            "`rlhfkit ppo --reward_funcs ...`."
        )
    sft_model_path = training_args.sft_model_path or model_args.model_name_or_path
    model_kwargs = dict(trust_remote_code=training_args.trust_remote_code)
    if model_args.dtype is not None:
        model_kwargs["dtype"] = model_args.dtype
    if model_args.attn_implementation is not None:
        model_kwargs["attn_implementation"] = model_args.attn_implementation

    ################
    # Model & Tokenizer
    ################
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path or sft_model_path,
        revision=model_args.model_revision,
        padding_side="left",
        trust_remote_code=training_args.trust_remote_code,
    )
    if tokenizer.pad_token is None:  # TRL adds [PAD] always; rlhfkit pads with it even beyond the embeddings
        tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    if tokenizer.chat_template is None:
        tokenizer.chat_template = SIMPLE_CHAT_TEMPLATE
    value_model = AutoModelForSequenceClassification.from_pretrained(
        training_args.value_model_path or training_args.reward_model_path, num_labels=1, **model_kwargs
    )
    reward_model = AutoModelForSequenceClassification.from_pretrained(
        training_args.reward_model_path, num_labels=1, **model_kwargs
    )
    policy = AutoModelForCausalLM.from_pretrained(sft_model_path, **model_kwargs)
    # With --use_peft the reference is the policy with its adapter disabled: no copy is loaded.
    ref_policy = None if model_args.use_peft else AutoModelForCausalLM.from_pretrained(sft_model_path, **model_kwargs)

    ################
    # Dataset
    ################
    # A hub id, a directory written by save_to_disk, a directory of data files, or one .jsonl/.json/.csv/.parquet.
    train_dataset, eval_dataset = load_prompt_splits(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args.dataset_test_split,
        script_args.dataset_config,
    )
    if eval_dataset is None and 0 < script_args.eval_samples < len(train_dataset):
        dataset, eval_samples = train_dataset, script_args.eval_samples
        train_dataset = dataset.select(range(len(dataset) - eval_samples))
        eval_dataset = dataset.select(range(len(dataset) - eval_samples, len(dataset)))

    ################
    # Training
    ################
    trainer = PPOTrainer(
        args=training_args,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=model_args.lora_config(),
        task=load_task(training_args.task) if training_args.task else None,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    # Save (the policy with its tokenizer, the value model in value_model/) and show a few completions
    trainer.save_model(training_args.output_dir)
    if eval_dataset is not None:
        trainer.generate_completions()
    trainer.end()
    return trainer


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_into_dataclasses()
    main(script_args, training_args, model_args)
