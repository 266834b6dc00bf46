"""Every field of TRL's configs is accepted at TRL's default: a Python config, a --config YAML file and a
command line that spell out TRL 1.16's GRPOConfig (TRL 1.12's PPOConfig) build and train on the tiny built-in task,
silently; a field rlhfkit does not take, at another value, still exits 2 with the reason."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import trl
import yaml
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments
from trl import ModelConfig
from trl.scripts.grpo import GRPOScriptArguments
from trl.scripts.utils import DatasetMixtureConfig

from rlhfkit import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer
from rlhfkit.cli import main
from rlhfkit.config import GRPOArguments, PPOArguments, config_field_names, trl_flags
from rlhfkit.config.parse import parse_config
from rlhfkit.config.trl_recorded import TRL_1_12_PPO_DEFAULTS
from rlhfkit.errors import FieldNotTakenError, UsageError
from rlhfkit.models import load_reward_model


def defaults_of(cls) -> dict:
    """The default of every field of the dataclass `cls` (those its __init__ takes)."""
    return {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
        if f.init
    }


def length_reward(prompts, completions, **kwargs):
    return [len(c) / 10 for c in completions]


# What must change for a run on the tiny task to be short, and nothing else. TRL's defaults would train 3 epochs of the
# prompts (max_steps -1) with 8 completions of up to 512 tokens per prompt, 8 prompts a device, into no directory.
TINY_GRPO = dict(
    max_steps=2,  # a couple of steps show that it trains; TRL's -1 means 3 whole epochs
    per_device_train_batch_size=4,  # one group of 4 completions a step, instead of 8 x 8
    num_generations=4,
    max_completion_length=8,  # the tiny task's answers are a few characters; 512 would only cost time
)


def test_a_grpo_config_of_every_trl_field_at_its_default_trains_silently(tiny_assets, tmp_path, capsys):
    """trl.GRPOConfig's own dataclass fields (installed TRL 1.16), every one at TRL's default, in one config."""
    values = defaults_of(trl.GRPOConfig)
    assert len(values) > 150 and values["use_liger_kernel"] is False and values["use_vllm"] is False
    values.update(TINY_GRPO, output_dir=str(tmp_path / "run"))  # TRL's default None is no directory to write
    args = GRPOConfig(**values)
    assert type(args) is GRPOConfig and args.learning_rate == 1e-6 and args.gradient_checkpointing is True
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    trainer = GRPOTrainer(str(tiny_assets / "sft"), length_reward, args, train_dataset=dataset["train"])
    output = trainer.train()
    assert output.global_step == 2 and trainer.state.log_history[-1]["train_loss"] == output.training_loss
    assert "rlhfkit: note:" not in capsys.readouterr().err  # TRL's defaults ask for nothing: nothing to say


def trl_grpo_command_defaults() -> dict:
    """Every flag of `trl grpo` (TRL 1.16's scripts/grpo.py: GRPOScriptArguments, GRPOConfig, ModelConfig,
    DatasetMixtureConfig) at TRL's default, as a YAML file spells it."""
    values = {}
    for cls in (GRPOScriptArguments, trl.GRPOConfig, ModelConfig, DatasetMixtureConfig):
        values.update(defaults_of(cls))
    return values


def test_a_yaml_of_every_trl_grpo_flag_at_its_default_trains_through_the_command_line(tiny_assets, tmp_path, capsys):
    values = trl_grpo_command_defaults()
    assert {"use_liger_kernel", "hub_strategy", "accelerator_config", "datasets", "lora_target_parameters"} <= set(
        values
    )
    values.update(
        TINY_GRPO,
        output_dir=str(tmp_path / "run"),  # TRL's None: no directory
        model_name_or_path=str(tiny_assets / "sft"),  # TRL's None: no model
        dataset_name=str(tiny_assets / "prompts"),  # TRL's None: no prompts
        reward_funcs=["tests.config.test_trl_field_defaults:length_reward"],  # TRL's None: no reward
    )
    path = tmp_path / "trl_grpo.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    assert main(["grpo", "--config", str(path)]) == 0
    assert "rlhfkit: note:" not in capsys.readouterr().err
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [row["episode"] for row in rows if "loss" in row] == [8]  # TRL's logging_steps 10: one row, at the end
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert config["learning_rate"] == 1e-6 and config["loss_type"] == "dapo"  # TRL's values of the fields it takes


def test_a_ppo_config_of_every_trl_1_12_field_at_its_default_trains(tiny_assets, tmp_path, capsys):
    """TRL 1.12's PPOConfig: its recorded own fields and overrides, on transformers' TrainingArguments."""
    values = {**defaults_of(TrainingArguments), **TRL_1_12_PPO_DEFAULTS}
    assert {"world_size", "model_adapter_name", "use_liger_kernel", "hub_strategy"} <= set(values)
    values.update(
        output_dir=str(tmp_path / "ppo"),  # TRL's None: no directory
        total_episodes=16,  # TRL's None: 3 epochs of the prompts
        per_device_train_batch_size=4,  # two updates of 4 x 2 episodes
        gradient_accumulation_steps=2,
        local_rollout_forward_batch_size=8,  # TRL's 64 is more than an update's episodes
        response_length=8,  # TRL's 53 tokens would only cost time
        num_sample_generations=0,  # no sample table: nothing to evaluate on
    )
    args = PPOConfig(**values)
    assert type(args) is PPOConfig and args.kl_coef == 0.05 and args.sft_model_path == "EleutherAI/pythia-160m"
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    reward_model, _ = load_reward_model(str(tiny_assets / "reward"), tokenizer, torch.float32, flag="reward")
    trainer = PPOTrainer(  # TRL 1.12's call: the models given, so sft_model_path and reward_model_path load nothing
        args=args,
        processing_class=tokenizer,
        model=AutoModelForCausalLM.from_pretrained(tiny_assets / "sft"),
        reward_model=reward_model,
        train_dataset=load_from_disk(str(tiny_assets / "prompts"))["train"],
    )
    assert trainer.train().global_step == 2
    assert "rlhfkit: note:" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, flags",
    [
        ("grpo", ["--use_liger_kernel", "False"]),  # HfArgumentParser reads true/false/yes/no/1/0, any case
        ("grpo", ["--use_vllm=false", "--vllm_mode", "colocate", "--vllm_server_port", "8000"]),
        ("grpo", ["--vllm_server_timeout", "240", "--vllm_gpu_memory_utilization=0.30"]),  # the numbers themselves
        ("grpo", ["--log_multimodal", "--logging_nan_inf_filter", "true"]),  # bare on/off flags: true, their default
        ("grpo", ["--hub_strategy", "every_save", "--include_num_input_tokens_seen", "no"]),
        ("grpo", ["--remove_unused_columns", "false"]),  # TRL 1.16's GRPOConfig turns it off
        ("ppo", ["--remove_unused_columns", "true", "--no_torch_compile"]),  # TRL 1.12's PPO: transformers' true
        ("ppo", ["--accelerator_config", '{"split_batches": false, "even_batches": true}']),  # transformers' values
        ("ppo", ["--dataset_streaming", "0", "--ignore-bias-buffers=no"]),  # ScriptArguments' too, dashed or not
    ],
)
def test_a_trl_flag_at_its_default_is_dropped_silently(command, flags, capsys):
    config, explicit = parse_config(
        GRPOConfig if command == "grpo" else PPOConfig, [*flags, "--learning_rate", "2e-6"], f"rlhfkit {command}"
    )
    assert config.learning_rate == 2e-6 and explicit == {"learning_rate"}  # no value leaked into another flag
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["grpo", "--use_liger_kernel"], "--use_liger_kernel is a TRL/transformers flag that rlhfkit does not "
         "support: speed and memory features"),  # bare: true, not TRL's default
        (["grpo", "--use_vllm", "yes"], "TRL's default (--use_vllm false) is accepted."),
        (["grpo", "--vllm_server_port", "8001"], "TRL's default (--vllm_server_port 8000) is accepted."),
        (["ppo", "--remove_unused_columns", "false"], "TRL's default (--remove_unused_columns true) is accepted."),
        (["grpo", "--hub_strategy", "checkpoint"], "rlhfkit uploads output_dir once"),
        (["ppo", "--deepspeed", "None"], "TRL's default (leaving --deepspeed out) is accepted."),  # "None" is text
        (["ppo", "--accelerator_config", '{"split_batches": true}'], "devices, processes and sharding come from"),
        (["ppo", "--world_size", "2"], "rlhfkit's batch sizes are computed from per_device_train_batch_size"),
    ],
)  # fmt: skip
def test_a_trl_flag_at_another_value_exits_2_with_its_reason(capsys, tmp_path, argv, needle):
    out = tmp_path / "run"
    assert main([*argv, "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "See docs/trl-flags.md." in err and "Traceback" not in err, err
    assert not out.exists()


def test_python_keywords_and_yaml_keys_follow_the_same_rule(tmp_path, capsys):
    # Python: TRL's values as a TRL config holds them after its __post_init__ (an enum, a filled-in dict) too
    from transformers.trainer_pt_utils import AcceleratorConfig
    from transformers.trainer_utils import HubStrategy

    config = GRPOConfig(
        hub_strategy=HubStrategy.EVERY_SAVE,
        accelerator_config=AcceleratorConfig(),
        include_for_metrics=[],
        debug=[],  # transformers' [] for its default ""
        torch_compile=False,
        beta=0.1,
    )
    assert config.beta == 0.1 and capsys.readouterr().err == ""
    with pytest.raises(FieldNotTakenError, match=r"TRL's default \(torch_compile=False\) is accepted"):
        GRPOConfig(torch_compile=True)
    with pytest.raises(FieldNotTakenError, match="use_cache"):  # a bool is not a number: 0 is no False
        GRPOConfig(use_cache=0)
    with pytest.raises(FieldNotTakenError, match="accelerator_config"):
        PPOConfig(accelerator_config={"split_batches": True})
    # YAML: text is read as the flag's text would be; other values as they are
    path = tmp_path / "run.yaml"
    path.write_text("use_vllm: 'false'\nvllm_server_port: 8000\ndeepspeed: null\nlog_multimodal: true\nbeta: 0.2\n")
    assert parse_config(GRPOConfig, ["--config", str(path)], "x")[0].beta == 0.2
    path.write_text("vllm_server_port: 8001\n")
    with pytest.raises(UsageError, match=r"has the key vllm_server_port: .* \(--vllm_server_port 8000\) is accepted"):
        parse_config(GRPOConfig, ["--config", str(path)], "x")


def test_an_ignored_flag_at_its_default_says_nothing_and_at_another_value_one_note(capsys):
    GRPOConfig(dataloader_num_workers=0, do_train=False, local_rank=-1)
    assert capsys.readouterr().err == ""
    parse_config(GRPOConfig, ["--dataloader_num_workers", "0", "--do_train"], "x")
    assert capsys.readouterr().err.strip() == (
        "rlhfkit: note: --do_train has no effect in rlhfkit: transformers itself does not read these (they are for "
        "scripts); rlhfkit's trainers always train, and evaluate on their own schedule (--eval_strategy)."
    )


@pytest.mark.parametrize("command, cls", [("ppo", PPOArguments), ("grpo", GRPOArguments)])
def test_every_trl_flag_rlhfkit_does_not_take_has_a_default_at_run_time(command, cls):
    """The defaults come from config/trl_recorded.py and transformers, never from an import of TRL."""
    refused = trl_flags.not_taken(command, set(config_field_names(cls)))
    assert refused and all(trl_flags.trl_default(command, name) is not dataclasses.MISSING for name in refused)


@pytest.mark.slow
def test_rlhfkit_does_not_import_trl_to_judge_a_default():
    code = (
        "import sys; from rlhfkit.config import GRPOConfig, PPOConfig; from rlhfkit.config.parse import parse_config; "
        "GRPOConfig(use_vllm=False, hub_strategy='every_save'); PPOConfig(world_size=None); "
        "parse_config(GRPOConfig, ['--use_liger_kernel', 'false'], 'x'); assert 'trl' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_trl_s_fields_read_as_trl_s_defaults_and_dispatch_batches_false_is_taken():
    # A TRL script reads TrainingArguments fields rlhfkit does not hold (args.dataloader_num_workers) and sets
    # accelerator_config={"dispatch_batches": False}, which TRL requires with a streamed train set: what rlhfkit does.
    for config in (GRPOConfig(output_dir="out"), PPOConfig(output_dir="out")):
        assert config.dataloader_num_workers == 0 and config.dataloader_pin_memory is True
        with pytest.raises(AttributeError, match="no attribute 'dataloader_num_wrokers'"):
            config.dataloader_num_wrokers  # noqa: B018 - a misspelt name is no TRL field
    assert GRPOConfig(output_dir="out", accelerator_config={"dispatch_batches": False}).accelerator_config is None
    with pytest.raises(FieldNotTakenError, match=r"accelerator_config=\.\.\.\): .*dispatch_batches false"):
        GRPOConfig(output_dir="out", accelerator_config={"dispatch_batches": True})
    with pytest.raises(FieldNotTakenError, match=r"accelerator_config"):
        GRPOConfig(output_dir="out", accelerator_config={"dispatch_batches": False, "split_batches": True})
