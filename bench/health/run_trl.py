"""One TRL run of the labelled set (split "trl", algorithm "trl-grpo"): TRL 1.16's own GRPOTrainer on the built-in
sort task (its SFT model, prompts and rule-based rewards), logging to TensorBoard under OUTPUT_DIR/runs, with
rlhfkit's HealthCallback attached. Called by run_one.py for such a spec.

The run's record holds the rows ``rlhfkit doctor`` reads from the TensorBoard files (build.py), and outcome.json
keeps what the callback found live (``live``: [step, rule, severity]), so the table can say whether both agree.
Failures are TRL's own flags (a learning rate, a temperature, a length limit, a reward function) or one of the
injections below, applied to the built TRL trainer.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

# TRL's GRPO settings for these runs, close to the built-in task's (rlhfkit/trainers/build.py): 8 prompts x 8
# completions per step (TRL's per_device_train_batch_size counts completions), sampling at 0.7, a short warm-up,
# fp32 on the CPU. TRL's own defaults otherwise (loss_type dapo, beta 0, scale_rewards group).
TRL_SETTINGS = {
    "per_device_train_batch_size": 64,
    "num_generations": 8,
    "max_completion_length": 8,
    "temperature": 0.7,
    "learning_rate": 1e-4,
    "warmup_steps": 6,  # a tenth of the 60 steps (transformers 5 has no warmup_ratio)
    "logging_steps": 1,
    "bf16": False,
    "use_cpu": True,
    "save_strategy": "no",
    "disable_tqdm": True,
    "report_to": ["tensorboard"],
}


def _changed_from(rewards: list, step: int, change) -> list:
    """`rewards` whose values pass through change(values) from optimizer step `step` on (TRL passes its TrainerState
    to reward functions; during step k its global_step is k - 1)."""

    def wrap(source):
        @functools.wraps(source)
        def changed(prompts, completions, trainer_state=None, **kwargs):
            values = source(prompts, completions, **kwargs)
            if trainer_state is None or trainer_state.global_step + 1 < step:
                return values
            return change(values)

        return changed

    return [wrap(source) for source in rewards]


def scale_rewards_from(trainer, rewards: list, step: int, factor: float = 1000.0) -> list:
    """Every reward multiplied by `factor` from optimizer step `step` on."""
    return _changed_from(rewards, step, lambda values: [v * factor for v in values])


def reward_value_from(trainer, rewards: list, step: int, value: float) -> list:
    """Every reward function returns `value` from optimizer step `step` on (1e308: an overflow in a grader)."""
    return _changed_from(rewards, step, lambda values: [value] * len(values))


def learning_rate_from(trainer, rewards: list, step: int, learning_rate: float) -> list:
    """The optimizer's learning rate becomes `learning_rate` from optimizer step `step` on, set just before each
    optimizer step, after TRL's scheduler has set its own (TRL still logs the scheduled one)."""
    from transformers import TrainerCallback

    class Raise(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step + 1 >= step:
                for group in trainer.optimizer.param_groups:
                    group["lr"] = learning_rate

    trainer.add_callback(Raise())
    return rewards


def noisy_reference(trainer, rewards: list, std: float) -> list:
    """TRL's reference model (beta > 0) is not the starting policy: inject.noisy_reference on trainer.ref_model."""
    from bench.health.inject import noisy_reference as noisy

    noisy(trainer, std)
    return rewards


def entropy_bonus_from(trainer, rewards: list, step: int, coef: float, learning_rate: float | None = None) -> list:
    """An entropy bonus far too large from optimizer step `step` on: TRL's own entropy term (the loss minus
    entropy_coef x the mean entropy of the completion tokens, GRPOTrainer._compute_loss) switched on with `coef`
    just before the step's first micro-batch (TRL then logs entropy_coef and policy_loss, as such a run does); with
    `learning_rate`, also learning_rate_from at the same step (inject.entropy_bonus_from says why)."""
    from transformers import TrainerCallback

    if learning_rate is not None:
        learning_rate_from(trainer, rewards, step, learning_rate)

    class SwitchOn(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 >= step:
                trainer.entropy_coef = coef
                trainer._entropy_bonus_enabled = True  # TRL fixes it at construction from args.entropy_coef

    trainer.add_callback(SwitchOn())
    return rewards


# Injections that change the rewards act before the trainer is built (trainer None); the others after.
BEFORE = {"scale_rewards_from": scale_rewards_from, "reward_value_from": reward_value_from}
AFTER = {
    "noisy_reference": noisy_reference,
    "learning_rate_from": learning_rate_from,
    "entropy_bonus_from": entropy_bonus_from,
}


def run(spec, output_dir: str) -> int:
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from bench.health.specs import TRL_STEPS
    from rlhfkit.health import HealthCallback
    from rlhfkit.tasks import Assets, builtin_assets
    from rlhfkit.tasks.base import import_ref
    from rlhfkit.tasks.sort import correctness, partial_credit

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    assets = Assets(builtin_assets())
    flags = dict(spec.flags)
    refs = flags.pop("reward_funcs", None)
    rewards = [import_ref(ref) for ref in refs] if refs else [correctness, partial_credit]
    injection, settings = spec.injection or (None, {})
    if injection in BEFORE:
        rewards = BEFORE[injection](None, rewards, **settings)
    args = GRPOConfig(output_dir=output_dir, seed=spec.seed, **{"max_steps": TRL_STEPS, **TRL_SETTINGS, **flags})
    callback = HealthCallback(mode="warn")
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(assets.sft),
        reward_funcs=rewards,
        args=args,
        train_dataset=load_from_disk(assets.prompts)["train"],
        processing_class=AutoTokenizer.from_pretrained(assets.sft, padding_side="left"),
        callbacks=[callback],
    )
    if injection in AFTER:
        AFTER[injection](trainer, rewards, **settings)
    outcome = {"ended": "finished"}
    try:
        trainer.train()
    except Exception as e:  # a policy destroyed by its learning rate can crash TRL's sampler: the run ends there
        outcome = {"ended": type(e).__name__, "step": trainer.state.global_step, "message": str(e)[:300]}
    outcome["live"] = [[f.step, f.rule, f.severity] for f in callback.findings]
    Path(output_dir, "outcome.json").write_text(json.dumps(outcome, indent=1) + "\n")
    return 0
