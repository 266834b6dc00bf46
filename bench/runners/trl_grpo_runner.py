"""Run TRL 1.16's GRPO (``trl.GRPOTrainer``) from a benchmark spec, timed (runs in the trl-1.16.0 venv).

The reward is runners/reward.py's ``correctness``, the same file rlhfkit is given. Only ``trainer.train()`` is
timed; the policy is then saved with ``trainer.save_model`` for the success check.
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
    from reward import correctness
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    paths = spec["paths"]
    settings = dict(spec["settings"], **spec["trl_settings"])
    config = GRPOConfig(output_dir=spec["output_dir"], **settings)
    print("trl", trl.__version__, "grpo", config.to_json_string(), flush=True)

    tokenizer = AutoTokenizer.from_pretrained(paths["sft"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(paths["sft"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[correctness],
        args=config,
        train_dataset=load_from_disk(paths["prompts"])["train"],
        processing_class=tokenizer,
    )
    setup = time.time() - PROCESS_START
    seconds = run_timed(probe, trainer.train)
    model_dir = os.path.join(spec["output_dir"], "policy")
    trainer.save_model(model_dir)
    assert "rlhfkit" not in sys.modules
    finish(spec, probe, "trl", trl.__version__, seconds, model_dir, setup)


if __name__ == "__main__":
    main()
