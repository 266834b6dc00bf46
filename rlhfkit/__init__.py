"""rlhfkit: RLHF for language models with logging that tells you what training is doing."""

__version__ = "0.1.0"
__all__ = ["AsyncGRPOConfig", "AsyncGRPOTrainer", "GRPOConfig", "GRPOTrainer", "PPOConfig", "PPOTrainer"]


def __getattr__(name: str):
    # The public API pulls in torch (configs check values against the ops they name; trainers need transformers
    # and accelerate). Import it only when asked for, so `rlhfkit --help`, `doctor` and `report` start at once.
    if name in ("PPOConfig", "GRPOConfig", "AsyncGRPOConfig"):
        from rlhfkit import config

        return getattr(config, name)
    if name == "PPOTrainer":
        from rlhfkit.trainers.ppo import PPOTrainer

        return PPOTrainer
    if name == "GRPOTrainer":
        from rlhfkit.trainers.grpo import GRPOTrainer

        return GRPOTrainer
    if name == "AsyncGRPOTrainer":  # TRL 1.16's trl.experimental.async_grpo trainer
        from rlhfkit.trainers.grpo.async_trainer import AsyncGRPOTrainer

        return AsyncGRPOTrainer
    raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")
