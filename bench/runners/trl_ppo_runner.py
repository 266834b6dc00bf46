"""Run TRL 1.12's PPO (``trl.experimental.ppo``) from a benchmark spec, timed (runs in the trl-1.12.0 venv).

Set up as TRL's own example script (examples/scripts/ppo/ppo.py) does: policy and reference loaded from the SFT
checkpoint, reward and value models from the reward checkpoint, prompts tokenized into an ``input_ids`` column.
Only ``trainer.train()`` is timed; the policy is then saved with ``trainer.save_model`` for the success check.
"""

from __future__ import annotations

import os
import sys

from common import PROCESS_START, finish, install_probe, load_spec, run_timed


def main() -> None:
    import time

    spec = load_spec()
    probe = install_probe()
    import torch
    import trl
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    paths = spec["paths"]
    settings = dict(spec["settings"], **spec["trl_settings"])
    config = PPOConfig(output_dir=spec["output_dir"], **settings)
    print("trl", trl.__version__, "ppo", config.to_json_string(), flush=True)

    tokenizer = AutoTokenizer.from_pretrained(paths["tokenizer"], padding_side="left")
    fp32 = {"dtype": torch.float32}
    policy = AutoModelForCausalLM.from_pretrained(paths["sft"], **fp32)
    ref_policy = AutoModelForCausalLM.from_pretrained(paths["sft"], **fp32)
    reward_model = AutoModelForSequenceClassification.from_pretrained(paths["reward"], num_labels=1, **fp32)
    value_model = AutoModelForSequenceClassification.from_pretrained(paths["reward"], num_labels=1, **fp32)

    splits = load_from_disk(paths["prompts"])

    def tokenize(split):
        ds = splits[split]
        return ds.map(
            lambda row: {"input_ids": tokenizer(row["prompt"], padding=False)["input_ids"]},
            remove_columns=ds.column_names,
        )

    trainer = PPOTrainer(
        args=config,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=tokenize("train"),
        eval_dataset=tokenize("test"),
    )
    setup = time.time() - PROCESS_START
    seconds = run_timed(probe, trainer.train)
    model_dir = os.path.join(spec["output_dir"], "policy")
    trainer.save_model(model_dir)
    assert "rlhfkit" not in sys.modules
    finish(spec, probe, "trl", trl.__version__, seconds, model_dir, setup)


if __name__ == "__main__":
    main()
