"""GRPO with reward functions (trainer.py: the loop, as numbered phases; generation.py: from prompt indices to the batch
the loss trains on; loss.py: the loss's settings, bound once; async_trainer.py: TRL's AsyncGRPOTrainer)."""

from rlhfkit.trainers.grpo.trainer import GRPOTrainer

__all__ = ["GRPOTrainer"]
