"""One run of TRL's own GRPOTrainer (TRL 1.16) with rlhfkit's HealthCallback, in a process of its own (W&B keeps one
run per process): ``python tests/health/trl_grpo_run.py OUT RUN_NAME LEARNING_RATE MODE``.

Eight steps on the built-in task (its SFT model and prompts from $RLHFKIT_CACHE), logged to TensorBoard, W&B
(offline, under OUT/wandb, run id RUN_NAME) and Trackio (project trl-health); writes OUT/live.json: the callback's
findings and the steps trained."""

import json
import os
import sys
from pathlib import Path

from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rlhfkit.health import HealthCallback
from rlhfkit.tasks import Assets, builtin_assets
from rlhfkit.tasks.sort import correctness, partial_credit

STEPS = 8


def main(out: str, run_name: str, learning_rate: float, mode: str) -> None:
    os.environ.update(WANDB_MODE="offline", WANDB_RUN_ID=run_name, WANDB_DIR=out)
    assets = Assets(builtin_assets())
    args = GRPOConfig(
        output_dir=str(Path(out) / "trl"), per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, max_steps=STEPS, logging_steps=1, learning_rate=learning_rate,
        report_to=["tensorboard", "wandb", "trackio"], project="trl-health", run_name=run_name, bf16=False,
        use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    callback = HealthCallback(mode=mode)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(assets.sft),
        reward_funcs=[correctness, partial_credit],
        args=args,
        train_dataset=load_from_disk(assets.prompts)["train"].select(range(256)),
        processing_class=AutoTokenizer.from_pretrained(assets.sft, padding_side="left"),
        callbacks=[callback],
    )
    trainer.train()
    live = {"steps": trainer.state.global_step, "findings": [f.to_dict() for f in callback.findings]}
    Path(out, "live.json").write_text(json.dumps(live))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
