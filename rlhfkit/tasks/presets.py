"""What one build of a built-in task's assets takes: model sizes and step budgets (build.py's PRESETS; the agent task's
AgentPreset extends it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuildPreset:
    """Sizes and step budgets of one build (budgets are steps, not seconds: machine speed varies)."""

    hidden_size: int = 128
    intermediate_size: int = 512
    num_layers: int = 3
    num_heads: int = 4
    n_train_prompts: int = 4000
    n_test_prompts: int = 256
    sft_steps: int = 70
    sft_batch: int = 64
    sft_lr: float = 1e-3
    rm_sample_prompts: int = 512  # train prompts whose SFT samples become reward-model negatives
    rm_sample_temperatures: tuple[float, ...] = (0.7, 1.0, 1.4)
    rm_samples_per_prompt: int = 4  # per temperature
    rm_synthetic_pairs: int = 8000
    rm_steps: int = 300
    rm_batch: int = 64  # pairs
    rm_lr: float = 3e-4
    rm_margin: float = 1.0  # m in the calibration term
    rm_calib_coef: float = 1.0
    eval_prompts: int = 256
    best_of: int = 8
    temperature: float = 0.7  # rollout temperature the success numbers are measured at
    # torch intra-op threads during the build (None = leave torch's setting). These models are so small that
    # thread synchronisation dominates: on a busy 2-core machine the test preset took 22 s with 2 threads, 4 s with 1.
    num_threads: int | None = None
