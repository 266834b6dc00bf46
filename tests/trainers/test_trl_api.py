"""TRL's trainer surface (trainers/api.py, trainers/callbacks.py): transformers callbacks with a real TrainerState and
TrainerControl, log_history equal to metrics.jsonl, and TRL's constructor arguments and methods."""

import json
import os

import pytest
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
from transformers.trainer_callback import ExportableState

from rlhfkit import GRPOTrainer, PPOConfig, PPOTrainer
from rlhfkit.errors import ConfigError
from rlhfkit.models import load_reward_model
from tests.trainers import grpo_rewards
from tests.trainers.test_grpo import grpo_config


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class Recorder(TrainerCallback):
    """Every event with the step it saw; stops training after `stop_at` (if given)."""

    def __init__(self, stop_at=None):
        self.events, self.logs, self.evaluations, self.stop_at = [], [], [], stop_at

    def on_init_end(self, args, state, control, **kwargs):
        self.events.append(("init_end", state.global_step))

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append(("train_begin", state.global_step))

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append(("step_begin", state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("step_end", state.global_step))
        assert kwargs["model"] is not None and kwargs["optimizer"] is not None
        if state.global_step == self.stop_at:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append((state.global_step, dict(logs)))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evaluations.append((state.global_step, dict(metrics)))

    def on_save(self, args, state, control, **kwargs):
        self.events.append(("save", state.global_step))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append(("train_end", state.global_step))


def grpo_trainer(tiny_assets, tmp_path, callbacks, **overrides):
    args = grpo_config(tiny_assets, tmp_path, **overrides)
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    return GRPOTrainer(
        model=str(tiny_assets / "sft"),
        reward_funcs=grpo_rewards.recorded_length,
        args=args,
        train_dataset=dataset["train"],
        eval_dataset=dataset["test"],
        callbacks=callbacks,
    )


def test_a_callback_stops_training_at_step_3_and_sees_every_row(tiny_assets, tmp_path):
    recorder = Recorder(stop_at=3)
    trainer = grpo_trainer(tiny_assets, tmp_path, [recorder, PrinterCallback], max_steps=6, logging_steps=2)
    trainer.train()
    rows = read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    assert trainer.state.global_step == 3 and max(row["step"] for row in rows) == 3
    assert trainer.state.log_history == rows  # every row, eval rows included, in order, each with its step
    assert [step for step, _ in recorder.logs] == [row["step"] for row in rows]
    assert [logs for _, logs in recorder.logs] == [{k: v for k, v in row.items() if k != "step"} for row in rows]
    # Rows at the schedule's step 2 and at the stop (3, off the schedule: the stop logs its window).
    assert [row["step"] for row in rows if "loss" in row] == [2, 3]
    names = [name for name, _ in recorder.events]
    assert names[:2] == ["init_end", "train_begin"]
    assert names.count("step_begin") == 3 and names.count("step_end") == 3
    assert names[-2:] == ["save", "train_end"] and recorder.events[-1] == ("train_end", 3)
    # The final checkpoint is the stop's, and the models are saved in output_dir.
    assert os.path.isdir(os.path.join(trainer.args.output_dir, "checkpoint-3"))
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "model.safetensors"))
    assert trainer.state.epoch > 0


def test_control_asks_for_a_row_an_evaluation_and_a_checkpoint(tiny_assets, tmp_path):
    class AtStep2(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                control.should_log = control.should_evaluate = control.should_save = True

    recorder = Recorder()
    trainer = grpo_trainer(tiny_assets, tmp_path, [AtStep2(), recorder], max_steps=3, logging_steps=10)
    trainer.train()
    rows = read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    assert [row["step"] for row in rows if "loss" in row] == [2, 3]  # the callback's row, then the last step's
    assert [step for step, _ in recorder.evaluations] == [2]
    (metrics,) = [metrics for _, metrics in recorder.evaluations]
    assert set(metrics) == {"eval_reward", "eval_loss"}  # eval/reward and eval/loss under transformers' names
    assert [row["eval/reward"] for row in rows if "eval/reward" in row] == [metrics["eval_reward"]]
    assert os.path.isdir(os.path.join(trainer.args.output_dir, "checkpoint-2"))
    assert ("save", 2) in recorder.events


def test_methods_a_trl_script_calls(tiny_assets, tmp_path):
    trainer = grpo_trainer(tiny_assets, tmp_path, None, max_steps=2)
    recorder = Recorder()
    trainer.add_callback(recorder)
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()
    trainer.train(resume_from_checkpoint=None)
    metrics = trainer.evaluate()
    assert set(metrics) == {"eval_reward", "eval_loss"} and recorder.evaluations[-1] == (2, metrics)
    trainer.log({"custom/value": 1.5})
    rows = read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    assert rows[-1] == {"step": 2, "custom/value": 1.5} and trainer.state.log_history == rows
    elsewhere = tmp_path / "saved"
    trainer.save_model(str(elsewhere))
    assert AutoModelForCausalLM.from_pretrained(elsewhere).config.vocab_size > 0
    assert AutoTokenizer.from_pretrained(elsewhere) is not None
    trainer.remove_callback(recorder)
    assert recorder not in trainer.callback_handler.callbacks
    trainer.end()


def test_train_cannot_resume_a_checkpoint_once_the_run_has_begun(tiny_assets, tmp_path):
    trainer = grpo_trainer(tiny_assets, tmp_path, None, max_steps=1)
    trainer.log({"custom/value": 1.0})  # the run begins: its first row
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint=True\) after the run began"):
        trainer.train(resume_from_checkpoint=True)
    trainer.end()


class Counter(TrainerCallback, ExportableState):
    """Counts the steps it has seen; its count is part of a checkpoint (ExportableState)."""

    def __init__(self):
        self.count = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1

    def state(self):
        return {"args": {}, "attributes": {"count": self.count}}


def test_resumed_run_continues_log_history_and_callback_state(tiny_assets, tmp_path):
    first = grpo_trainer(tiny_assets, tmp_path, [Counter(), Recorder(stop_at=2)], max_steps=4, save_steps=1)
    assert first.train().global_step == 2  # a callback's stop ends train() as the last step would
    args = grpo_config(tiny_assets, tmp_path, max_steps=4, save_steps=1, resume_from_checkpoint="latest")
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    counter = Counter()
    second = GRPOTrainer(
        str(tiny_assets / "sft"),
        grpo_rewards.recorded_length,
        args,
        train_dataset=dataset["train"],
        callbacks=[counter],
    )
    output = second.train(resume_from_checkpoint=args.resume_from_checkpoint)
    assert second.state.global_step == 4 and counter.count == 4
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    assert second.state.log_history == rows
    # The second call's summary row: its own steps' loss (as transformers counts a resumed call), its own speed.
    losses = [row["loss"] for row in rows if "loss" in row]  # steps 1-4, a row each
    assert output.global_step == 4 and len(losses) == 4
    assert output.training_loss == pytest.approx(sum(losses[2:]) / 2, rel=1e-9, abs=1e-12)
    assert rows[-1] == {"step": 4, **output.metrics}
    assert output.metrics["train_steps_per_second"] == pytest.approx(2 / output.metrics["train_runtime"], rel=1e-2)


def test_constructor_arguments_rlhfkit_takes_otherwise(tiny_assets, tmp_path):
    import torch
    from peft import LoraConfig, PrefixTuningConfig

    dataset = load_from_disk(str(tiny_assets / "prompts"))["train"]
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    args = grpo_config(tiny_assets, tmp_path, max_steps=1)
    trainer = GRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, args, dataset, peft_config=lora)
    assert args.use_peft and args.lora_r == 4 and args.lora_alpha == 8
    assert args.lora_target_modules == ["q_proj", "v_proj"]
    assert sum(p.numel() for n, p in trainer.policy.named_parameters() if "lora_" in n) > 0
    with pytest.raises(ConfigError, match="LoRA adapters only"):
        GRPOTrainer(
            str(tiny_assets / "sft"),
            grpo_rewards.recorded_length,
            grpo_config(tiny_assets, tmp_path / "b"),
            dataset,
            peft_config=PrefixTuningConfig(num_virtual_tokens=2),
        )
    with pytest.raises(ConfigError, match="bias.*which rlhfkit's LoRA does not take"):
        GRPOTrainer(
            str(tiny_assets / "sft"),
            grpo_rewards.recorded_length,
            grpo_config(tiny_assets, tmp_path / "c"),
            dataset,
            peft_config=LoraConfig(r=4, bias="all"),
        )
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="--optim"):
        GRPOTrainer(
            str(tiny_assets / "sft"),
            grpo_rewards.recorded_length,
            grpo_config(tiny_assets, tmp_path / "d"),
            dataset,
            optimizers=(torch.optim.SGD(model.parameters(), lr=0.1), None),
        )


def test_ppo_generate_completions_and_save_model(tiny_assets, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "tokenizer")
    policy = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft")
    reward_model, _ = load_reward_model(str(tiny_assets / "reward"), tokenizer, torch_dtype(), flag="reward")
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    args = PPOConfig(
        output_dir=str(tmp_path / "ppo"),
        report_to=["none"],
        total_episodes=16,
        per_device_train_batch_size=8,
        num_mini_batches=1,
        response_length=8,
        num_sample_generations=0,
        save_steps=0,
        logging_steps=1,
        per_device_eval_batch_size=16,
    )
    recorder = Recorder()
    trainer = PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        ref_model=None,
        reward_model=reward_model,
        train_dataset=dataset["train"],
        value_model=None,
        eval_dataset=dataset["test"].select(range(16)),
        callbacks=[recorder],
        peft_config=None,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    trainer.generate_completions()
    assert recorder.evaluations[-1][0] == 2 and "eval_scores" in recorder.evaluations[-1][1]
    samples = read_jsonl(os.path.join(args.output_dir, "samples.jsonl"))
    assert any(row["step"] == 2 and row["key"] == "completions" for row in samples)
    trainer.save_model(str(tmp_path / "saved"))
    assert os.path.isfile(tmp_path / "saved" / "value_model" / "model.safetensors")
    assert trainer.state.log_history == read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))


def torch_dtype():
    import torch

    return torch.float32


def judged(prompts, completions, trainer_state, log_extra, log_metric, **kwargs):
    """A reward function using TRL 1.16's keyword arguments: the step it is called at, a column, a metric."""
    lengths = [float(len(c)) for c in completions]
    log_extra("judge_step", [trainer_state.global_step] * len(completions))
    log_metric("judge/mean_len", sum(lengths) / len(lengths))
    return [n / 10 for n in lengths]


def test_reward_functions_get_trainer_state_log_extra_and_log_metric(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2)
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    trainer = GRPOTrainer(
        str(tiny_assets / "sft"), judged, args, train_dataset=dataset["train"], eval_dataset=dataset["test"]
    )
    trainer.train()
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    train = [row for row in rows if "loss" in row]
    samples = read_jsonl(os.path.join(args.output_dir, "samples.jsonl"))
    for row in train:  # the mean of the generation's completion lengths, as the reward (x10) says
        assert row["judge/mean_len"] == pytest.approx(10 * row["rewards/judged/mean"])
    (evaluated,) = [row for row in rows if "eval/reward" in row]
    assert evaluated["eval/judge/mean_len"] == pytest.approx(10 * evaluated["eval/reward"])
    steps_seen = {row["step"]: row["judge_step"] for row in samples if row["key"] == "completions"}
    assert steps_seen and all(seen == step - 1 for step, seen in steps_seen.items())  # scored before the step's update


def test_an_evaluation_schedule_without_an_eval_dataset_is_refused(tiny_assets, tmp_path):
    dataset = load_from_disk(str(tiny_assets / "prompts"))
    args = grpo_config(tiny_assets, tmp_path, eval_strategy="steps", eval_steps=1)
    with pytest.raises(ConfigError, match="eval_strategy='steps' but the trainer got no eval_dataset"):
        GRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, args, train_dataset=dataset["train"])


def test_early_stopping_callback_stops_on_the_eval_metric(tiny_assets, tmp_path):
    from transformers import EarlyStoppingCallback

    # A threshold no change can pass: the second evaluation is "no improvement", patience 1 stops training there.
    early = EarlyStoppingCallback(early_stopping_patience=1, early_stopping_threshold=1e9)
    trainer = grpo_trainer(
        tiny_assets,
        tmp_path,
        [early],
        max_steps=5,
        eval_strategy="steps",
        eval_steps=1,
        metric_for_best_model="reward",
    )
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.state.best_global_step == 1
    rows = read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl"))
    assert trainer.state.best_metric == [row["eval/reward"] for row in rows if "eval/reward" in row][0]
    assert trainer.args.greater_is_better is True and trainer.args.load_best_model_at_end is False


def test_metric_for_best_model_must_be_an_evaluation_metric(tiny_assets, tmp_path):
    trainer = grpo_trainer(
        tiny_assets, tmp_path, None, max_steps=1, eval_strategy="steps", eval_steps=1, metric_for_best_model="kl"
    )
    with pytest.raises(ConfigError, match="the evaluation has no eval_kl \\(it has eval_loss, eval_reward\\)"):
        trainer.train()
    # transformers' default, "loss", is GRPO's eval_loss
    trainer = grpo_trainer(tiny_assets, tmp_path / "loss", None, max_steps=1, eval_strategy="steps", eval_steps=1,
                           metric_for_best_model="loss")  # fmt: skip
    trainer.train()
    assert trainer.state.best_metric is not None and trainer.state.best_global_step == 1


def test_model_init_kwargs_as_trl_s_script_sets_them(tiny_assets, tmp_path):
    args = grpo_config(tiny_assets, tmp_path, max_steps=1)
    args.model_init_kwargs = {"revision": "main", "trust_remote_code": False, "attn_implementation": "eager",
                              "dtype": "float32"}  # fmt: skip
    dataset = load_from_disk(str(tiny_assets / "prompts"))["train"]
    trainer = GRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, args, dataset)
    assert args.attn_implementation == "eager" and args.dtype == "float32" and args.model_init_kwargs is None
    assert trainer.policy.config._attn_implementation == "eager"
    bad = grpo_config(tiny_assets, tmp_path / "b", max_steps=1)
    bad.model_init_kwargs = {"device_map": "auto"}
    with pytest.raises(ConfigError, match="not device_map"):
        GRPOTrainer(str(tiny_assets / "sft"), grpo_rewards.recorded_length, bad, dataset)


def test_push_to_hub_without_a_reachable_hub_says_what_to_do(tiny_assets, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    trainer = grpo_trainer(tiny_assets, tmp_path, None, max_steps=1, hub_model_id="someone/tiny-grpo")
    trainer.train()
    with pytest.raises(ConfigError, match="could not upload .* to the hub repository someone/tiny-grpo.*hf upload"):
        trainer.push_to_hub()


def test_sigterm_during_the_step_0_evaluation_saves_and_says_how_to_resume(tiny_assets, tmp_path, capsys):
    import signal

    from rlhfkit.errors import Interrupted

    trainer = grpo_trainer(tiny_assets, tmp_path, None, max_steps=2, eval_on_start=True, eval_strategy="steps",
                           eval_steps=1)  # fmt: skip
    evaluation = trainer.evaluation

    def signalled(step, dataset):
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` would, while the evaluation runs
        return evaluation(step, dataset)

    trainer.evaluation = signalled
    with pytest.raises(Interrupted) as info:
        trainer.train()
    assert info.value.exit_status == 143
    assert "Interrupted by SIGTERM after step 0" in str(info.value) and "--resume_from_checkpoint latest" in str(
        info.value
    )
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "checkpoint-0", "trainer_state.json"))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is given back
