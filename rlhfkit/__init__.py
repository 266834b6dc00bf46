"""rlhfkit: RLHF for language models with logging that tells you what training is doing."""

from rlhfkit.config import PPOConfig

__version__ = "0.1.0"
__all__ = ["PPOConfig", "PPOTrainer"]


def __getattr__(name: str):
    # The trainer pulls in torch, transformers and accelerate; import it only when asked for.
    if name == "PPOTrainer":
        from rlhfkit.trainers.ppo import PPOTrainer

        return PPOTrainer
    raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")
