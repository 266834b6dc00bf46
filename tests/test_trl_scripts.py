"""TRL's own scripts, run with rlhfkit's trainers and configs in place of TRL's, on the tiny built-in task.

(a) The shape of TRL 1.12's examples/scripts/ppo/ppo.py (not installed with TRL 1.16; copied below statement by
    statement): the script tokenizes the prompts into an ``input_ids`` column alone, adds ``[PAD]`` to the tokenizer
    beyond the model's embeddings, loads the value and reward models with AutoModelForSequenceClassification, passes
    ``peft_config=None``, then ``train()``, ``save_model()``, ``push_to_hub`` if asked, ``generate_completions()``.
(b) TRL 1.16's shipped ``trl/scripts/grpo.py`` ``main()`` itself, with ``trl.GRPOTrainer`` replaced by rlhfkit's.

Both parse their command line as TRL's scripts do, with one parser over TRL's own dataclasses and rlhfkit's config:
``HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))`` and ``TrlParser((GRPOScriptArguments, GRPOConfig,
ModelConfig, DatasetMixtureConfig))``.
"""

import json
import os
from pathlib import Path

import pytest
import trl
from accelerate import PartialState
from datasets import load_dataset, load_from_disk
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    HfArgumentParser,
)
from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.scripts.grpo import GRPOScriptArguments
from trl.scripts.grpo import main as trl_grpo_main

from rlhfkit import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer


def digit_share(completions, **kwargs):
    """A tiny reward function, named to TRL's script by its dotted path (tests.test_trl_scripts.digit_share)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


@pytest.fixture(scope="module")
def jsonl_prompts(tiny_assets, tmp_path_factory):
    """The tiny prompts as a directory of one jsonl file per split: what `load_dataset(path)` reads offline (a
    save_to_disk directory it does not)."""
    root = tmp_path_factory.mktemp("prompts") / "data"
    root.mkdir()
    for split, dataset in load_from_disk(str(tiny_assets / "prompts")).items():
        dataset.to_json(root / f"{split}.jsonl")
    return root


def metric_rows(output_dir) -> list[dict]:
    with open(Path(output_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


# --- (a) TRL 1.12's examples/scripts/ppo/ppo.py ---------------------------------------------------------------------

SIMPLE_CHAT_TEMPLATE = (  # trl.trainer.utils.SIMPLE_CHAT_TEMPLATE in TRL 1.12
    "{% for message in messages %}{{message['role'].capitalize() + ': ' + message['content'] + '\n\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def trl_ppo_script(argv: list[str], progress: list[str]) -> None:
    """TRL 1.12's ppo.py with rlhfkit's PPOConfig and PPOTrainer; `progress` records how far it got."""
    parser = HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_into_dataclasses(args=argv)
    # (TRL removes output_dir here: shutil.rmtree(training_args.output_dir, ignore_errors=True); the test's is new.)

    ################
    # Model & Tokenizer
    ################
    # (TRL 1.12 read model_args.trust_remote_code; TRL 1.16's ModelConfig moved it to the training config.)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, padding_side="left", trust_remote_code=training_args.trust_remote_code
    )
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    if tokenizer.chat_template is None:
        tokenizer.chat_template = SIMPLE_CHAT_TEMPLATE
    value_model = AutoModelForSequenceClassification.from_pretrained(
        training_args.reward_model_path, trust_remote_code=training_args.trust_remote_code, num_labels=1
    )
    reward_model = AutoModelForSequenceClassification.from_pretrained(
        training_args.reward_model_path, trust_remote_code=training_args.trust_remote_code, num_labels=1
    )
    policy = AutoModelForCausalLM.from_pretrained(
        training_args.sft_model_path, trust_remote_code=training_args.trust_remote_code
    )

    peft_config = get_peft_config(model_args)
    if peft_config is None:
        ref_policy = AutoModelForCausalLM.from_pretrained(
            training_args.sft_model_path, trust_remote_code=training_args.trust_remote_code
        )
    else:
        ref_policy = None

    ################
    # Dataset
    ################
    dataset = load_dataset(
        script_args.dataset_name, name=script_args.dataset_config, split=script_args.dataset_train_split
    )
    eval_samples = 100
    train_dataset = dataset.select(range(len(dataset) - eval_samples))
    eval_dataset = dataset.select(range(len(dataset) - eval_samples, len(dataset)))
    dataset_text_field = "prompt"

    def prepare_dataset(dataset, tokenizer):
        """pre-tokenize the dataset before training; only collate during training"""

        def tokenize(element):
            outputs = tokenizer(
                element[dataset_text_field],
                padding=False,
            )
            return {"input_ids": outputs["input_ids"]}

        return dataset.map(
            tokenize,
            batched=True,
            remove_columns=dataset.column_names,
            num_proc=training_args.dataset_num_proc,
        )

    # Compute that only on the main process for faster data processing.
    # see: https://github.com/huggingface/trl/pull/1255
    with PartialState().local_main_process_first():
        train_dataset = prepare_dataset(train_dataset, tokenizer)
        eval_dataset = prepare_dataset(eval_dataset, tokenizer)
        # filtering
        train_dataset = train_dataset.filter(
            lambda x: len(x["input_ids"]) <= 512, num_proc=training_args.dataset_num_proc
        )
        eval_dataset = eval_dataset.filter(
            lambda x: len(x["input_ids"]) <= 512, num_proc=training_args.dataset_num_proc
        )

    assert train_dataset[0]["input_ids"][-1] != tokenizer.eos_token_id, "The last token should not be an EOS token"
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
        peft_config=peft_config,
    )
    trainer.train()
    progress.append("train")

    # Save and push to hub
    trainer.save_model(training_args.output_dir)
    progress.append("save_model")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    progress.append("push_to_hub")

    trainer.generate_completions()
    progress.append("generate_completions")


@pytest.fixture(scope="module")
def trl_ppo_run(tiny_assets, jsonl_prompts, tmp_path_factory):
    """One run of the TRL-shaped script (256 train prompts: 156 to train on, the last 100 to evaluate, as TRL's
    script splits them): its output_dir and how far it got."""
    out = tmp_path_factory.mktemp("trl_ppo") / "run"
    argv = [
        "--dataset_name", str(jsonl_prompts), "--dataset_train_split", "train",
        "--model_name_or_path", str(tiny_assets / "tokenizer"), "--sft_model_path", str(tiny_assets / "sft"),
        "--reward_model_path", str(tiny_assets / "reward"), "--output_dir", str(out), "--report_to", "none",
        "--learning_rate", "3e-4", "--per_device_train_batch_size", "8", "--num_ppo_epochs", "1",
        "--total_episodes", "16", "--response_length", "8", "--local_rollout_forward_batch_size", "8",
        "--per_device_eval_batch_size", "100", "--num_sample_generations", "0", "--save_steps", "0",
        "--missing_eos_penalty", "1.0",
    ]  # fmt: skip
    progress: list[str] = []
    trl_ppo_script(argv, progress)
    return out, progress


def test_trl_ppo_script_trains_and_saves(trl_ppo_run, tiny_assets):
    """Everything of TRL's ppo.py up to save_model: the [PAD] beyond the embeddings, the input_ids-only dataset,
    the value and reward models the script loaded, train(), save_model()."""
    out, progress = trl_ppo_run
    assert progress[:2] == ["train", "save_model"]
    rows = metric_rows(out)
    updates = [r for r in rows if "episode" in r]
    assert [r["step"] for r in updates] == [1, 2]
    assert all(r["objective/scores"] == r["objective/scores"] for r in updates)  # finite, not NaN
    policy = AutoModelForCausalLM.from_pretrained(out)
    sft = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft")
    assert policy.get_input_embeddings().num_embeddings == sft.get_input_embeddings().num_embeddings  # not resized
    AutoModelForSequenceClassification.from_pretrained(out / "value_model", num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.pad_token == "[PAD]"  # the script's tokenizer is the one saved


def test_trl_ppo_script_runs_to_its_end(trl_ppo_run):
    out, progress = trl_ppo_run
    assert progress == ["train", "save_model", "push_to_hub", "generate_completions"]
    evals = [r for r in metric_rows(out) if "eval/scores" in r]
    assert [r["step"] for r in evals] == [2]  # generate_completions() at the step training reached


# --- (b) TRL 1.16's trl/scripts/grpo.py main() ----------------------------------------------------------------------


def parse_trl_grpo_command_line(argv: list[str]):
    """trl/scripts/grpo.py's parser: TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig))
    with rlhfkit's GRPOConfig."""
    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig))
    return parser.parse_args_and_config(args=argv)


def test_trl_grpo_script_main_with_rlhfkit(tiny_assets, jsonl_prompts, tmp_path, monkeypatch):
    out = tmp_path / "run"
    argv = [
        "--model_name_or_path", str(tiny_assets / "sft"), "--dataset_name", str(jsonl_prompts),
        "--reward_model_name_or_path", str(tiny_assets / "reward"),
        "--reward_funcs", "tests.test_trl_scripts.digit_share", "get_soft_overlong_punishment",
        "--output_dir", str(out), "--report_to", "none", "--num_generations", "4",
        "--per_device_train_batch_size", "8", "--max_completion_length", "8", "--max_steps", "1",
        "--num_sample_generations", "0", "--save_steps", "0",
    ]  # fmt: skip
    script_args, training_args, model_args, dataset_args = parse_trl_grpo_command_line(argv)
    assert type(training_args) is GRPOConfig
    assert script_args.reward_model_name_or_path == str(tiny_assets / "reward")
    assert model_args.model_name_or_path == str(tiny_assets / "sft")

    built = []

    class RecordingGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(trl, "GRPOTrainer", RecordingGRPOTrainer)  # main() imports it from trl when called
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # main() imports dotted reward paths from the cwd
    trl_grpo_main(script_args, training_args, model_args, dataset_args)

    (trainer,) = built
    assert trainer.rewards.names == [
        "reward",
        "digit_share",
        "soft_overlong_punishment_reward",
    ]  # model first, as TRL's order
    assert trainer.eval_dataset is None  # --eval_strategy no: main() passes no eval dataset
    steps = [r for r in metric_rows(out) if "reward" in r]
    assert [r["step"] for r in steps] == [1]
    assert {"rewards/digit_share/mean", "rewards/soft_overlong_punishment_reward/mean"} <= set(steps[0])
    AutoModelForCausalLM.from_pretrained(out)
    assert os.path.isfile(out / "tokenizer.json")
