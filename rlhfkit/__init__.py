"""rlhfkit: RLHF for language models with logging that tells you what training is doing."""

from rlhfkit.config import GRPOConfig, PPOConfig

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer", "PPOConfig", "PPOTrainer"]


def __getattr__(name: str):
    # The trainers pull in torch, transformers and accelerate; import them only when asked for.
    if name == "PPOTrainer":
        from rlhfkit.trainers.ppo import PPOTrainer

        return PPOTrainer
    if name == "GRPOTrainer":
        from rlhfkit.trainers.grpo import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")
