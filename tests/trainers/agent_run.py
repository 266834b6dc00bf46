"""An agent run as a script, for the SIGKILL test (test_sigkill.py): GRPO with a stateful environment (CurriculumEnv:
its own random targets and an episode count, saved with each checkpoint) and scripted tool calls, one checkpoint per
step. `python tests/trainers/agent_run.py OUTPUT_DIR [--async] [--resume_from_checkpoint latest]`."""

import os
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str]) -> None:
    sys.path.insert(0, ROOT)
    import torch

    from rlhfkit import GRPOTrainer
    from tests.tool_chat import tool_chat_model, tool_chat_tokenizer, use_script
    from tests.trainers.test_grpo_environments import CurriculumEnv
    from tests.trainers.test_grpo_environments import config as environment_config

    out = argv[0]
    overrides = dict(output_dir=out, max_steps=6, save_steps=1, save_total_limit=2, learning_rate=1e-2)
    overrides.update(max_completion_length=200, seed=5)
    if "--async" in argv:
        overrides.update(async_generation=True, max_staleness=0, generation_threads=torch.get_num_threads())
    tok = tool_chat_tokenizer()
    args = environment_config(Path(out).parent, **overrides)
    trainer = GRPOTrainer(tool_chat_model(tok), args=args, processing_class=tok, environment_factory=CurriculumEnv)
    resume = "latest" if "--resume_from_checkpoint" in argv else None
    use_script(trainer).train(resume_from_checkpoint=resume)


if __name__ == "__main__":  # the generation worker (spawned) imports this file again: build nothing then
    main(sys.argv[1:])
