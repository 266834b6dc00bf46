"""PPO with a value model (trainer.py: the loop, as numbered phases; generation.py: completing and scoring a batch of
prompts; model.py: the policy and the value model behind one forward)."""

from rlhfkit.trainers.ppo.trainer import PPOTrainer

__all__ = ["PPOTrainer"]
