"""LoRA (--use_peft, TRL's flags): PPO and GRPO train adapters only, the reference is the adapter-disabled policy (no
second copy of the base), output_dir holds the adapters (and with --merge_adapter a merged model), quantised loading
without a GPU exits 2. Exact resume with LoRA: tests/trainers/test_resume.py."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlhfkit.cli import main
from rlhfkit.config import GRPOConfig, PPOArguments, PPOConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import ConfigError
from rlhfkit.metrics import registry
from rlhfkit.models import LORA_FLAGS, completion_logits, is_peft_model, load_scalar_model, policy_logits, with_lora
from rlhfkit.ops import logprobs_from_logits
from rlhfkit.trainers.build import build_grpo_trainer, build_ppo_trainer
from tests.helpers import asset_flags, expand_templates, run_two_processes
from tests.test_cli import rlhfkit
from tests.trainers.test_grpo import grpo_config
from tests.trainers.test_ppo import read_jsonl, small_config, update_rows

pytest.importorskip("peft")


def is_adapter(name: str) -> bool:
    """Parameters peft trains: the LoRA matrices and the trained copies of modules_to_save (the value head)."""
    return ".lora_" in name or ".modules_to_save." in name


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def changed(before: dict, module: torch.nn.Module) -> set[str]:
    return {k for k, v in module.named_parameters() if not torch.equal(before[k], v)}


def copies_of(weights: dict[str, torch.Tensor], trainer) -> dict[str, int]:
    """How many distinct tensors of the trainer's models hold each of `weights` (by value)."""
    modules = [m for m in vars(trainer).values() if isinstance(m, torch.nn.Module)]
    tensors = {t.data_ptr(): t for m in modules for t in (*m.parameters(), *m.buffers())}.values()
    return {
        name: sum(1 for t in tensors if t.shape == w.shape and torch.equal(t.detach(), w))
        for name, w in weights.items()
    }


def prompts_batch(trainer, n=8):
    """(ids, mask) of n eval prompts, left-padded as in training."""
    from rlhfkit.sampling import left_pad

    rows = [trainer.eval_prompts[i]["input_ids"] for i in range(n)]
    return left_pad(rows, trainer.tokenizer.pad_token_id)


# ---------------------------------------------------------------------------------------------------------------------
# PPO
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ppo_run(tiny_assets, tmp_path_factory):
    """Three LoRA updates with --merge_adapter; returns (trainer, metrics rows, parameters before training)."""
    tmp = tmp_path_factory.mktemp("ppo_lora")
    args = small_config(tiny_assets, tmp, use_peft=True, merge_adapter=True, lora_r=4, lora_alpha=8)
    trainer = build_ppo_trainer(args)
    before = snapshot(trainer.unwrapped)
    trainer.train()
    return trainer, read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")), before


def test_ppo_trains_the_adapters_only(ppo_run, tiny_assets):
    trainer, rows, before = ppo_run
    model = trainer.unwrapped
    assert is_peft_model(model.policy) and is_peft_model(model.value_model)
    moved = changed(before, model)
    assert moved and all(is_adapter(name) for name in moved), sorted(moved)
    assert any(n.startswith("policy.") and ".lora_B." in n for n in moved)  # lora_B starts at 0: it learned
    assert any(n.startswith("value_model.") and ".lora_B." in n for n in moved)
    assert any(n.startswith("value_model.") and ".score.modules_to_save." in n for n in moved)  # head in full
    # The optimizer holds the trainable parameters only.
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(trainable)
    assert all(is_adapter(n) for n, p in model.named_parameters() if p.requires_grad)
    # The same metrics as a full run, every update finite.
    logged = set().union(*(r.keys() for r in rows)) - {"step"}
    assert logged == {m.name for m in expand_templates(registry.metrics_for("ppo"), [])}
    assert [r["step"] for r in update_rows(rows)] == [1, 2, 3]


def test_ppo_reference_is_the_base_model_without_a_second_copy(ppo_run, tiny_assets):
    trainer, _, _ = ppo_run
    assert trainer.ref_model is None
    base = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").eval()
    # Each base weight lives once in the trainer (the policy's frozen base); a frozen reference copy would be a second.
    assert set(copies_of(dict(base.named_parameters()), trainer).values()) == {1}
    # After three updates the reference log-probs are the base checkpoint's, exactly; the policy has moved away.
    ids, mask = prompts_batch(trainer)
    with torch.no_grad():
        width = 2  # the logits that predict tokens 2.. (all but the first two positions are "response")
        tokens, temperature = ids[:, width:], trainer.args.temperature
        reference = trainer.generation.reference_logprobs(trainer.unwrapped, ids, mask, width, tokens)
        expected = logprobs_from_logits(completion_logits(base, ids, mask, width), tokens, temperature)
        policy = logprobs_from_logits(
            completion_logits(trainer.unwrapped.policy.eval(), ids, mask, width), tokens, temperature
        )
    assert torch.equal(reference, expected)
    assert not torch.allclose(policy, expected)
    assert trainer.unwrapped.policy.training is False  # adapter_disabled restored the mode it found


def test_ppo_value_adapter_sits_on_a_copy_of_the_reward_model(ppo_run, tiny_assets):
    trainer, _, _ = ppo_run
    reward = load_scalar_model(str(tiny_assets / "reward"), torch.float32, "reward_model_path")
    value_base = trainer.unwrapped.value_model.get_base_model()
    for name, weight in reward.model.named_parameters():  # the backbone: frozen, the reward model's
        assert torch.equal(value_base.model.get_parameter(name), weight), name


def test_ppo_output_dir_holds_the_adapters_and_the_merged_policy(ppo_run):
    trainer, _, _ = ppo_run
    out = trainer.args.output_dir
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json",
                 "value_model/adapter_config.json", "value_model/adapter_model.safetensors",
                 "merged/config.json", "merged/model.safetensors", "merged/tokenizer_config.json"):  # fmt: skip
        assert os.path.isfile(os.path.join(out, name)), name
    assert not os.path.exists(os.path.join(out, "model.safetensors"))  # no full copy of the base
    with open(os.path.join(out, "value_model", "adapter_config.json")) as f:
        value_config = json.load(f)
    assert value_config["task_type"] == "SEQ_CLS" and "score" in value_config["modules_to_save"]
    assert any(
        k.endswith("score.weight") for k in load_file(os.path.join(out, "value_model/adapter_model.safetensors"))
    )
    # The last checkpoint holds the adapters (for resume), not the merged model.
    checkpoint = os.path.join(out, "checkpoint-3")
    assert os.path.isfile(os.path.join(checkpoint, "adapter_model.safetensors"))
    assert os.path.isfile(os.path.join(checkpoint, "value_model", "adapter_model.safetensors"))
    assert not os.path.exists(os.path.join(checkpoint, "merged"))
    assert not os.path.exists(os.path.join(checkpoint, "model.safetensors"))


def test_ppo_saved_policy_loads_as_adapter_and_as_merged_model(ppo_run):
    trainer, _, _ = ppo_run
    out = trainer.args.output_dir
    ids, mask = prompts_batch(trainer)
    with torch.no_grad():
        trained = policy_logits(trainer.unwrapped.policy.eval(), ids, mask)
        merged = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"))
        assert not is_peft_model(merged)
        torch.testing.assert_close(policy_logits(merged, ids, mask), trained, rtol=0, atol=1e-5)
        # transformers loads an adapter directory onto its base model when peft is installed; so do rlhfkit's
        # readers (rlhfkit eval / quickstart judge output_dir as a policy through models.load_policy).
        adapter = AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(policy_logits(adapter, ids, mask), trained, rtol=0, atol=1e-6)
    from rlhfkit.evaluation.completions import generate_texts

    texts = generate_texts(out, ["sort 312="], max_new_tokens=4, flag="model", device="cpu").texts
    assert len(texts) == 1


def test_adapter_dropout_is_off_with_the_rest(tiny_assets, tmp_path):
    """--disable_dropout (the default) also turns off the adapters' dropout, so PPO's first ratio stays exactly 1
    with LoRA (tests/trainers/test_ppo.py runs that test with --use_peft too)."""
    trainer = build_ppo_trainer(small_config(tiny_assets, tmp_path, use_peft=True))
    assert trainer.unwrapped.policy.peft_config["default"].lora_dropout == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# GRPO
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpo_run(tiny_assets, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo_lora")
    args = grpo_config(
        tiny_assets, tmp, use_peft=True, beta=0.04, merge_adapter=True, lora_target_modules=["all-linear"]
    )
    trainer = build_grpo_trainer(args, set())
    before = snapshot(trainer.model)
    trainer.train()
    return trainer, read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")), before


def test_grpo_trains_the_adapter_only_on_every_linear_layer(grpo_run):
    trainer, rows, before = grpo_run
    model = trainer.accelerator.unwrap_model(trainer.model)
    moved = changed(before, trainer.model)
    assert moved and all(".lora_" in name for name in moved), sorted(moved)
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if ".lora_A." in n}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # not lm_head
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3] and all(r["kl"] >= 0 for r in train)


def test_grpo_reference_is_the_base_model_without_a_second_copy(grpo_run, tiny_assets):
    trainer, _, _ = grpo_run
    assert trainer.ref_model is None
    base = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").eval()
    assert set(copies_of(dict(base.named_parameters()), trainer).values()) == {1}
    # The reference log-probs of the batch generated at step 3 (after two updates) are the base checkpoint's.
    batch = trainer.generation.batch
    with torch.no_grad():
        expected = trainer.generation.logprobs(
            base, batch.input_ids, batch.attention_mask, batch.prompt_width, batch.completion_ids
        )
    assert torch.equal(batch.ref_logprobs, expected)


def test_grpo_output_dir_holds_the_adapter_and_the_merged_policy(grpo_run):
    trainer, _, _ = grpo_run
    out = trainer.args.output_dir
    for name in ("adapter_config.json", "adapter_model.safetensors", "merged/model.safetensors",
                 "checkpoint-3/adapter_model.safetensors"):  # fmt: skip
        assert os.path.isfile(os.path.join(out, name)), name
    ids, mask = prompts_batch(trainer)
    with torch.no_grad():
        trained = policy_logits(trainer.accelerator.unwrap_model(trainer.model).eval(), ids, mask)
        merged = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"))
        torch.testing.assert_close(policy_logits(merged, ids, mask), trained, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Flags, the command line, quantisation
# ---------------------------------------------------------------------------------------------------------------------


def test_trl_lora_flags_parse_with_trl_defaults():
    args, _ = parse_config(PPOConfig, ["--use_peft", "--lora_target_modules", "q_proj", "v_proj"], "rlhfkit ppo")
    assert args.use_peft and args.lora_target_modules == ["q_proj", "v_proj"]
    assert (args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_task_type) == (16, 32, 0.05, "CAUSAL_LM")
    args, _ = parse_config(GRPOConfig, ["--use_peft", "--lora_r", "8", "--use_rslora", "--use_dora"], "rlhfkit grpo")
    assert args.lora_r == 8 and args.use_rslora and args.use_dora and args.lora_target_modules is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"load_in_4bit": True}, "load_in_4bit=True without use_peft: quantised weights cannot be trained directly"),
        ({"use_peft": True, "load_in_4bit": True, "load_in_8bit": True}, "choose one"),
        ({"merge_adapter": True}, "merge_adapter=True without use_peft"),
        ({"use_peft": True, "load_in_8bit": True, "merge_adapter": True}, "merging into quantised weights"),
        ({"lora_target_modules": ["all-linear", "q_proj"]}, "all-linear stands alone"),
        ({"lora_task_type": "SEQ_CLS"}, "not supported by rlhfkit (the policy is a causal LM"),
        ({"lora_dropout": 1.0}, "lora_dropout=1.0: must be a number in [0, 1)."),
    ],
)
def test_lora_flags_that_do_not_fit_together_are_refused(kwargs, message):
    with pytest.raises(ConfigError) as info:
        PPOArguments(**kwargs)  # every group: merge_adapter is a training flag, use_peft ModelConfig's
    assert message in str(info.value)


def test_a_trainer_checks_merge_adapter_against_its_peft_config(tiny_assets):
    """A TRL script's plain PPOConfig cannot know whether LoRA is on: the trainer checks with the peft_config."""
    from peft import LoraConfig

    from rlhfkit.trainers.api import trl_constructor_arguments

    with pytest.raises(ConfigError, match="merge_adapter=True without use_peft"):
        trl_constructor_arguments(PPOConfig(merge_adapter=True))
    args = trl_constructor_arguments(PPOConfig(merge_adapter=True), peft_config=LoraConfig(r=4))
    assert type(args) is PPOArguments and args.use_peft and args.lora_r == 4 and args.merge_adapter


def test_lora_dropout_is_kept_when_dropout_is_not_disabled(tiny_assets):
    from transformers import AutoModelForCausalLM as Auto

    model = Auto.from_pretrained(tiny_assets / "sft")
    config = PPOConfig(use_peft=True, disable_dropout=False, lora_dropout=0.1)
    lora = {flag: getattr(config, flag) for flag in LORA_FLAGS.values()}
    wrapped = with_lora(model, lora, disable_dropout=config.disable_dropout, revision=config.model_revision)
    assert wrapped.peft_config["default"].lora_dropout == 0.1


@pytest.mark.slow
def test_cli_ppo_with_use_peft(tiny_assets, tmp_path):
    out = tmp_path / "run"
    result = rlhfkit(
        "ppo", *asset_flags(tiny_assets), "--output_dir", str(out), "--report_to", "none", "--use_peft",
        "--lora_r", "8", "--lora_target_modules", "q_proj", "v_proj", "--total_episodes", "16",
        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2", "--num_mini_batches", "2",
        "--local_rollout_forward_batch_size", "8", "--response_length", "8", "--num_sample_generations", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "adapter_config.json") as f:
        config = json.load(f)
    assert config["r"] == 8 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert (out / "value_model" / "adapter_model.safetensors").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA GPU")
@pytest.mark.parametrize("flag", ["--load_in_4bit", "--load_in_8bit"])
def test_quantised_loading_without_a_gpu_exits_2_before_loading(tiny_assets, tmp_path, capsys, flag):
    out = tmp_path / "run"
    code = main(
        ["ppo", *asset_flags(tiny_assets), "--output_dir", str(out), "--use_peft", flag, "--report_to", "none"]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{flag} needs bitsandbytes and a CUDA GPU (pip install bitsandbytes); this machine has no CUDA GPU" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.slow
def test_two_processes_train_lora_and_write_the_merged_policy(tiny_assets, tmp_path):
    """Under accelerate launch (2 CPU processes): the adapters train in DDP, and the merged policy, written after the
    run (and its process group) ended, comes from the main process alone."""
    out = tmp_path / "run"
    command = [
        "ppo",
        *asset_flags(tiny_assets), "--output_dir", str(out), "--report_to", "none", "--use_peft", "--merge_adapter",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--num_mini_batches", "2",
        "--num_ppo_epochs", "1", "--total_episodes", "32", "--response_length", "8",
        "--local_rollout_forward_batch_size", "8", "--num_sample_generations", "0", "--save_steps", "0",
    ]  # fmt: skip
    run_two_processes(command, tmp_path)
    assert [r["episode"] for r in update_rows(read_jsonl(out / "metrics.jsonl"))] == [16, 32]
    for name in ("adapter_model.safetensors", "value_model/adapter_model.safetensors", "merged/model.safetensors"):
        assert (out / name).is_file(), name
    assert not (out / "merged.tmp").exists()


def test_an_adapter_whose_base_is_gone_is_a_clear_error(ppo_run, tmp_path):
    from rlhfkit.errors import ModelLoadError
    from rlhfkit.models import load_policy

    trainer, _, _ = ppo_run
    moved = tmp_path / "adapter"
    moved.mkdir()
    for name in ("adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(trainer.args.output_dir, name), moved)
    with open(os.path.join(trainer.args.output_dir, "adapter_config.json")) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="holds a LoRA adapter, which transformers loads onto its base model"):
        load_policy(str(moved), torch.float32, "model")
