"""The labelled run set: healthy runs of the built-in tasks, and runs with one failure injected each.

Every run is ``rlhfkit ppo`` or ``rlhfkit grpo`` on a built-in task (its built-in settings, then the spec's flags),
optionally with an injection from inject.py, or TRL 1.16's own GRPOTrainer on the sort task (run_trl.py). Each run
belongs to one split (``split``), so the detection table is computed per split:

* "tuning": the sort task, on which every threshold of rlhfkit/health/rules.py was chosen;
* "held-out": the reverse and addition tasks (PPO scored by the task's learned reward model alone, GRPO by its
  rule-based rewards), which the thresholds never saw and must not be tuned on;
* "trl": TRL's GRPOTrainer, read from its TensorBoard files and by HealthCallback inside it.

Its label is ground truth, never the rules' verdict:

* ``mode``: "healthy", or the failure injected (MODES);
* ``onset``: the step the failure starts: the step of the injected change, or for reward hacking the step at which
  true success (rollout/task_success) visibly starts to fall (labels.success_fall), which only the task's checker
  knows.
"""

from __future__ import annotations

from typing import NamedTuple

from bench.health.agents import MODES as AGENT_MODES
from bench.health.agents import RUNS as AGENT_RUNS

# The failure modes, in the order of the detection table, with what was injected.
MODES = {
    "lr_fast": "learning rate far too high (0.5): the policy is destroyed within a few updates",
    "lr_slow": "learning rate raised 10-20x mid-run: the policy drifts, then collapses",
    "reward_hacking": "a reward with an exploitable flaw (pays for a repeated digit, or for digits in order whatever "
    "they are; the learned reward model under a weak KL penalty): the score rises while true success falls",
    "entropy_collapse": "sampling at temperature 0.2, without a learning-rate error",
    "kl_runaway": "PPO with kl_coef 0 against the learned reward model",
    "value_diverges": "PPO's value model takes 1000x the policy's learning rate from step 20",
    "value_frozen": "PPO's value model stops learning from step 20 (its weights are put back after every optimizer "
    "step) while the policy trains on",
    "truncated": "a length limit shorter than the answers (4 tokens): completions are cut off",
    "zero_spread": "GRPO rewards with no spread within a group (every completion earns 1, or none earns anything)",
    "reward_scale": "every reward multiplied by 1000 from step 20",
    "nonfinite_reward": "a reward source returns inf (refused) or 1e308 (the loss overflows) from step 20",
    "eos_missing": "the stop token is one the model never writes: completions run to the length limit",
    "logprob_mismatch": "sampling at temperature 1.0 while the losses score at 0.7",
    "wrong_reference": "a reference model that is not the starting policy (noise of 0.3 of each weight's std)",
    "stale_offpolicy": "asynchronous generation 4 updates behind the trainer (--max_staleness 4) and the learning rate "
    "raised to 5e-4 from step 30: the batches come from a policy far from the trainer's and the run collapses",
    "policy_random": "an entropy bonus far too large from step 30 (TRL: 20), the loss minus 10 x the mean token "
    "entropy (GRPO and TRL with the learning rate raised to 2.5e-4 and 5e-4 at the same step, which alone leaves the "
    "entropy flat): the policy goes random, its entropy rising several-fold while the reward falls to 0",
}
MODES.update(AGENT_MODES)  # the agent task's failures (bench/health/agents.py)

# The shorter length of most failure runs: long enough for a slow failure to show, short enough for the set.
PPO_SHORT = {"total_episodes": 7680}  # 120 updates of 64
GRPO_SHORT = {"max_steps": 100}


# policy_random's injection (inject.entropy_bonus_from), from step 30
POLICY_RANDOM_PPO = {"step": 30, "coef": 10.0}
POLICY_RANDOM_GRPO = {"step": 30, "coef": 10.0, "learning_rate": 2.5e-4}


class Spec(NamedTuple):
    name: str
    algorithm: str  # "ppo" or "grpo"
    mode: str  # "healthy" or a key of MODES
    seed: int
    flags: dict  # flags beyond the built-in settings (values as on the command line, lists for several)
    injection: tuple = ()  # (name in inject.INJECTIONS, {settings}) or ()
    onset: int | str = 1  # the step the failure starts, or "success_fall" (labels.success_fall)
    processes: int = 1
    task: str = "sort"  # the built-in task (rlhfkit/tasks/registry.py)
    split: str = "tuning"  # "tuning", "held-out" or "trl" (the module's docstring)


def _healthy() -> list[Spec]:
    ppo = [
        ("default", {}, (0, 1, 2)),
        ("kl0.1", {"kl_coef": 0.1}, (0,)),
        ("kl0.3", {"kl_coef": 0.3}, (1,)),
        ("lr5e-5", {"learning_rate": 5e-5}, (2,)),
        ("minibatch2", {"gradient_accumulation_steps": 2, "num_mini_batches": 2}, (0,)),
        ("batch32", {"per_device_train_batch_size": 32, "local_rollout_forward_batch_size": 32}, (1,)),
        ("lora", {"use_peft": True, "learning_rate": 3e-4}, (0,)),
        ("async1", {"async_generation": True, "max_staleness": 1}, (0,)),
    ]
    grpo = [
        ("default", {}, (0, 1, 2)),
        ("beta0.04", {"beta": 0.04}, (0,)),
        ("loss-grpo", {"loss_type": "grpo"}, (1,)),
        ("loss-dr_grpo", {"loss_type": "dr_grpo"}, (2,)),
        ("loss-bnpo", {"loss_type": "bnpo"}, (0,)),
        ("lr5e-5", {"learning_rate": 5e-5}, (1,)),
        ("iterations2", {"num_iterations": 2}, (0,)),
        ("temperature1", {"temperature": 1.0}, (2,)),
        ("lora", {"use_peft": True, "learning_rate": 1e-3}, (1,)),
        ("async1", {"async_generation": True, "max_staleness": 1}, (0, 1)),
        ("async4", {"async_generation": True, "max_staleness": 4}, (2,)),
    ]
    specs = [
        Spec(f"healthy-{algorithm}-{variant}-s{seed}", algorithm, "healthy", seed, flags)
        for algorithm, variants in (("ppo", ppo), ("grpo", grpo))
        for variant, flags, seeds in variants
        for seed in seeds
    ]
    specs.append(Spec("healthy-ppo-2proc-s0", "ppo", "healthy", 0, {"per_device_train_batch_size": 32}, processes=2))
    specs.append(Spec("healthy-grpo-2proc-s0", "grpo", "healthy", 0, {"per_device_train_batch_size": 32}, processes=2))
    return specs


def _sick() -> list[Spec]:
    out = []

    def add(mode, algorithm, variant, flags, seeds=(0, 1), injection=(), onset=1):
        for seed in seeds:
            name = f"{mode}-{algorithm}-{variant}-s{seed}"
            out.append(Spec(name, algorithm, mode, seed, flags, injection, onset))

    # The command: 8 updates of 16 at learning rate 0.5.
    fast = {"total_episodes": 128, "per_device_train_batch_size": 16, "local_rollout_forward_batch_size": 16}
    add("lr_fast", "ppo", "lr0.5", {**fast, "learning_rate": 0.5})
    add("lr_fast", "grpo", "lr0.5", {"max_steps": 20, "learning_rate": 0.5})
    add(
        "lr_slow",
        "ppo",
        "lr1e-3@30",
        PPO_SHORT,
        injection=("learning_rate_from", {"step": 30, "learning_rate": 1e-3}),
        onset=30,
    )
    add(
        "lr_slow",
        "grpo",
        "lr2e-3@30",
        GRPO_SHORT,
        injection=("learning_rate_from", {"step": 30, "learning_rate": 2e-3}),
        onset=30,
    )
    hacked = "success_fall"
    add(
        "reward_hacking",
        "ppo",
        "repeats-kl0",
        {**PPO_SHORT, "kl_coef": 0.0, "reward_funcs": ["bench.health.rewards:pays_for_repeats"]},
        onset=hacked,
    )
    # The learned reward model under a weak KL penalty: the policy finds the reward model's blind spots.
    add("reward_hacking", "ppo", "rm-kl0.01", {"kl_coef": 0.01}, onset=hacked)
    add(
        "reward_hacking",
        "grpo",
        "order",
        {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:checks_only_order"]},
        onset=hacked,
    )
    add(
        "reward_hacking",
        "grpo",
        "repeats",
        {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:pays_for_repeats"]},
        onset=hacked,
    )
    add("entropy_collapse", "ppo", "t0.2", {**PPO_SHORT, "temperature": 0.2, "kl_coef": 0.0})
    add("entropy_collapse", "grpo", "t0.2", {**GRPO_SHORT, "temperature": 0.2})
    add("kl_runaway", "ppo", "kl0", {"kl_coef": 0.0})  # the built-in length: the KL needs time to run away
    add(
        "value_diverges",
        "ppo",
        "vlr1000@20",
        PPO_SHORT,
        injection=("value_learning_rate_from", {"step": 20, "factor": 1000.0}),
        onset=20,
    )
    add(
        "value_frozen",
        "ppo",
        "frozen@20",
        PPO_SHORT,
        injection=("value_frozen_from", {"step": 20}),
        onset=20,
    )
    add("truncated", "ppo", "len4", {**PPO_SHORT, "response_length": 4})
    add("truncated", "grpo", "len4", {**GRPO_SHORT, "max_completion_length": 4})
    add(
        "zero_spread",
        "grpo",
        "always1",
        {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:always_one"]},
        seeds=(0,),
    )
    add("zero_spread", "grpo", "never", {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:never"]}, seeds=(1,))
    add(
        "reward_scale",
        "ppo",
        "x1000@20",
        PPO_SHORT,
        injection=("scale_rewards_from", {"step": 20, "factor": 1000.0}),
        onset=20,
    )
    add(
        "reward_scale",
        "grpo",
        "x1000@20",
        {**GRPO_SHORT, "scale_rewards": "none"},
        injection=("scale_rewards_from", {"step": 20, "factor": 1000.0}),
        onset=20,
    )
    add(
        "nonfinite_reward",
        "ppo",
        "inf@20",
        PPO_SHORT,
        seeds=(0,),
        injection=("reward_value_from", {"step": 20, "value": float("inf")}),
        onset=20,
    )
    add(
        "nonfinite_reward",
        "grpo",
        "overflow@20",
        GRPO_SHORT,
        seeds=(0,),
        injection=("reward_value_from", {"step": 20, "value": 1e308}),
        onset=20,
    )
    add(
        "nonfinite_reward",
        "ppo",
        "overflow@20",
        PPO_SHORT,
        seeds=(1,),
        injection=("reward_value_from", {"step": 20, "value": 1e308}),
        onset=20,
    )
    add("eos_missing", "ppo", "unk", PPO_SHORT, injection=("stop_token", {"token_id": 2}))
    add("eos_missing", "grpo", "unk", GRPO_SHORT, injection=("stop_token", {"token_id": 2}))
    add("logprob_mismatch", "ppo", "t1.0", PPO_SHORT, injection=("sample_at_temperature", {"temperature": 1.0}))
    add(
        "logprob_mismatch",
        "grpo",
        "t1.0",
        {**GRPO_SHORT, "temperature": 0.7},
        injection=("sample_at_temperature", {"temperature": 1.0}),
    )
    add("wrong_reference", "ppo", "noise0.3", PPO_SHORT, injection=("noisy_reference", {"std": 0.3}))
    add(
        "wrong_reference",
        "grpo",
        "noise0.3",
        {**GRPO_SHORT, "beta": 0.04},
        injection=("noisy_reference", {"std": 0.3}),
    )
    # Batches sampled up to 4 updates before the weights they train, then a learning rate the synchronous run
    # survives (the same injection without async_generation: greedy success 0.48 -> 0.14 over 70 steps for seed 0,
    # about 0.35 held for seed 1, and no rule fires): here each update moves the policy so far that the sampler's
    # copy is far behind, the correction discards most of each batch, and success falls to 0 within 10 updates.
    add(
        "stale_offpolicy",
        "grpo",
        "s4-lr5e-4@30",
        {**GRPO_SHORT, "async_generation": True, "max_staleness": 4},
        injection=("learning_rate_from", {"step": 30, "learning_rate": 5e-4}),
        onset=30,
    )
    # An entropy bonus far too large (inject.entropy_bonus_from, which says why GRPO's learning rate is raised too).
    add("policy_random", "ppo", "ent10@30", PPO_SHORT, injection=("entropy_bonus_from", POLICY_RANDOM_PPO), onset=30)
    add(
        "policy_random",
        "grpo",
        "ent10-lr2.5e-4@30",
        GRPO_SHORT,
        injection=("entropy_bonus_from", POLICY_RANDOM_GRPO),
        onset=30,
    )
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Held-out: the reverse and addition tasks, never used to choose a threshold
# ---------------------------------------------------------------------------------------------------------------------

# task -> its short name in run names; reverse-chat is reverse asked as a conversation (TRL's conversational format)
HELDOUT_TASKS = {"reverse": "rev", "addition": "add", "reverse-chat": "rchat"}


def _heldout(mode, algorithm, task, variant, flags, seed, injection=(), onset=1, processes=1) -> Spec:
    name = f"heldout-{mode}-{HELDOUT_TASKS[task]}-{algorithm}-{variant}-s{seed}"
    return Spec(name, algorithm, mode, seed, flags, injection, onset, processes, task, "held-out")


def _heldout_healthy() -> list[Spec]:
    """Healthy runs of the held-out tasks across seeds, learning rates, batch sizes, loss types, LoRA and 2 processes.
    Most at the short length of the failure runs (to fit the set's time), PPO's defaults of seed 0 at the built-in
    length."""
    ppo = [
        ("default", {}, "reverse", 0),
        ("default", {}, "addition", 0),
        ("default", PPO_SHORT, "reverse", 1),
        ("default", PPO_SHORT, "addition", 1),
        ("lr5e-5", {**PPO_SHORT, "learning_rate": 5e-5}, "reverse", 2),
        ("kl0.3", {**PPO_SHORT, "kl_coef": 0.3}, "addition", 2),
        (
            "batch32",
            {**PPO_SHORT, "per_device_train_batch_size": 32, "local_rollout_forward_batch_size": 32},
            "reverse",
            1,
        ),
        ("minibatch2", {**PPO_SHORT, "gradient_accumulation_steps": 2, "num_mini_batches": 2}, "addition", 0),
        ("lora", {**PPO_SHORT, "use_peft": True, "learning_rate": 3e-4}, "reverse", 0),
        # Seeds 3-5 (detection.LATE_SEEDS): trained after value_not_learning was rewritten, so that its false alarms
        # are measured on runs nobody had looked at when it was written.
        ("default", PPO_SHORT, "reverse", 3),
        ("default", PPO_SHORT, "addition", 3),
        ("epochs1", {**PPO_SHORT, "num_ppo_epochs": 1}, "reverse", 4),
        ("epochs4", {**PPO_SHORT, "num_ppo_epochs": 4}, "addition", 4),
        ("kl0.05", {**PPO_SHORT, "kl_coef": 0.05}, "reverse", 5),
        ("lora", {**PPO_SHORT, "use_peft": True, "learning_rate": 3e-4}, "addition", 5),
    ]
    grpo = [
        ("default", GRPO_SHORT, "reverse", 0),
        ("default", GRPO_SHORT, "addition", 0),
        ("loss-dr_grpo", {**GRPO_SHORT, "loss_type": "dr_grpo"}, "reverse", 2),
        ("loss-bnpo", {**GRPO_SHORT, "loss_type": "bnpo"}, "addition", 2),
        ("lr5e-5", {**GRPO_SHORT, "learning_rate": 5e-5}, "addition", 1),
        ("beta0.04", {**GRPO_SHORT, "beta": 0.04}, "reverse", 0),
        ("iterations2", {**GRPO_SHORT, "num_iterations": 2}, "addition", 1),
        ("temperature1", {**GRPO_SHORT, "temperature": 1.0}, "reverse", 2),
        ("lora", {**GRPO_SHORT, "use_peft": True, "learning_rate": 1e-3}, "addition", 0),
    ]
    specs = [
        _heldout("healthy", algorithm, task, variant, flags, seed)
        for algorithm, variants in (("ppo", ppo), ("grpo", grpo))
        for variant, flags, task, seed in variants
    ]
    chat = [  # the chat-formatted task, trained after value_not_learning was rewritten too
        ("ppo", "default", PPO_SHORT, 0),
        ("ppo", "default", PPO_SHORT, 1),
        ("ppo", "lr5e-5", {**PPO_SHORT, "learning_rate": 5e-5}, 2),
        ("grpo", "default", GRPO_SHORT, 0),
        ("grpo", "default", GRPO_SHORT, 1),
        ("grpo", "loss-dr_grpo", {**GRPO_SHORT, "loss_type": "dr_grpo"}, 2),
    ]
    specs += [_heldout("healthy", a, "reverse-chat", v, flags, seed) for a, v, flags, seed in chat]
    two = {"per_device_train_batch_size": 32}
    specs.append(_heldout("healthy", "ppo", "addition", "2proc", {**PPO_SHORT, **two}, 0, processes=2))
    specs.append(_heldout("healthy", "grpo", "reverse", "2proc", {**GRPO_SHORT, **two}, 0, processes=2))
    return specs


def _heldout_sick() -> list[Spec]:
    """The failure modes of _sick() that apply, injected the same way into runs of the held-out tasks (one or two runs
    each, to fit the set in about an hour on two shared cores). Reward hacking uses pays_for_repeats (exploitable on
    any text); checks_only_order is the sort task's own flaw, and the learned reward model's hack under kl_coef 0.01
    needs the built-in length (320 updates, 9 minutes here), left out for time. Truncation cuts below the task's
    answers (reverse: 3-6 letters, 4 tokens; addition: 2-3 digits, 2 tokens)."""
    fast = {"total_episodes": 128, "per_device_train_batch_size": 16, "local_rollout_forward_batch_size": 16}
    runs = [
        ("lr_fast", "ppo", "reverse", "lr0.5", {**fast, "learning_rate": 0.5}, 0, (), 1),
        ("lr_fast", "ppo", "addition", "lr0.5", {**fast, "learning_rate": 0.5}, 1, (), 1),
        ("lr_fast", "grpo", "reverse", "lr0.5", {"max_steps": 20, "learning_rate": 0.5}, 1, (), 1),
        ("lr_fast", "grpo", "addition", "lr0.5", {"max_steps": 20, "learning_rate": 0.5}, 0, (), 1),
        (
            "lr_slow", "ppo", "addition", "lr1e-3@30", PPO_SHORT, 0,
            ("learning_rate_from", {"step": 30, "learning_rate": 1e-3}), 30,
        ),
        (
            "lr_slow", "grpo", "reverse", "lr2e-3@30", GRPO_SHORT, 0,
            ("learning_rate_from", {"step": 30, "learning_rate": 2e-3}), 30,
        ),
        (
            "reward_hacking", "ppo", "addition", "repeats-kl0",
            {**PPO_SHORT, "kl_coef": 0.0, "reward_funcs": ["bench.health.rewards:pays_for_repeats"]}, 0, (),
            "success_fall",
        ),
        (
            "reward_hacking", "grpo", "reverse", "repeats",
            {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:pays_for_repeats"]}, 0, (), "success_fall",
        ),
        (
            "reward_hacking", "grpo", "addition", "repeats",
            {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:pays_for_repeats"]}, 1, (), "success_fall",
        ),
        ("entropy_collapse", "ppo", "addition", "t0.2", {**PPO_SHORT, "temperature": 0.2, "kl_coef": 0.0}, 0, (), 1),
        ("entropy_collapse", "grpo", "reverse", "t0.2", {**GRPO_SHORT, "temperature": 0.2}, 0, (), 1),
        ("kl_runaway", "ppo", "addition", "kl0", {"total_episodes": 12800, "kl_coef": 0.0}, 1, (), 1),
        (
            "value_diverges", "ppo", "reverse", "vlr1000@20", PPO_SHORT, 0,
            ("value_learning_rate_from", {"step": 20, "factor": 1000.0}), 20,
        ),
        ("value_frozen", "ppo", "reverse", "frozen@20", PPO_SHORT, 1, ("value_frozen_from", {"step": 20}), 20),
        ("value_frozen", "ppo", "addition", "frozen@20", PPO_SHORT, 0, ("value_frozen_from", {"step": 20}), 20),
        ("truncated", "ppo", "reverse", "len4", {**PPO_SHORT, "response_length": 4}, 0, (), 1),
        ("truncated", "grpo", "addition", "len2", {**GRPO_SHORT, "max_completion_length": 2}, 0, (), 1),
        (
            "zero_spread", "grpo", "addition", "always1",
            {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:always_one"]}, 0, (), 1,
        ),
        (
            "zero_spread", "grpo", "reverse", "never", {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:never"]},
            1, (), 1,
        ),
        (
            "reward_scale", "ppo", "addition", "x1000@20", PPO_SHORT, 0,
            ("scale_rewards_from", {"step": 20, "factor": 1000.0}), 20,
        ),
        (
            "reward_scale", "grpo", "reverse", "x1000@20", {**GRPO_SHORT, "scale_rewards": "none"}, 0,
            ("scale_rewards_from", {"step": 20, "factor": 1000.0}), 20,
        ),
        (
            "nonfinite_reward", "ppo", "reverse", "inf@20", PPO_SHORT, 0,
            ("reward_value_from", {"step": 20, "value": float("inf")}), 20,
        ),
        (
            "nonfinite_reward", "grpo", "addition", "overflow@20", GRPO_SHORT, 0,
            ("reward_value_from", {"step": 20, "value": 1e308}), 20,
        ),
        ("eos_missing", "ppo", "addition", "unk", PPO_SHORT, 0, ("stop_token", {"token_id": 2}), 1),
        ("eos_missing", "grpo", "reverse", "unk", GRPO_SHORT, 0, ("stop_token", {"token_id": 2}), 1),
        (
            "logprob_mismatch", "ppo", "reverse", "t1.0", PPO_SHORT, 0,
            ("sample_at_temperature", {"temperature": 1.0}), 1,
        ),
        (
            "logprob_mismatch", "grpo", "addition", "t1.0", {**GRPO_SHORT, "temperature": 0.7}, 0,
            ("sample_at_temperature", {"temperature": 1.0}), 1,
        ),
        ("wrong_reference", "ppo", "addition", "noise0.3", PPO_SHORT, 0, ("noisy_reference", {"std": 0.3}), 1),
        (
            "wrong_reference", "grpo", "reverse", "noise0.3", {**GRPO_SHORT, "beta": 0.04}, 0,
            ("noisy_reference", {"std": 0.3}), 1,
        ),
        (
            "stale_offpolicy", "grpo", "addition", "s4-lr5e-4@30",
            {**GRPO_SHORT, "async_generation": True, "max_staleness": 4}, 0,
            ("learning_rate_from", {"step": 30, "learning_rate": 5e-4}), 30,
        ),
        (
            "policy_random", "ppo", "addition", "ent10@30", PPO_SHORT, 0,
            ("entropy_bonus_from", POLICY_RANDOM_PPO), 30,
        ),
        (
            "policy_random", "grpo", "reverse", "ent10-lr2.5e-4@30", GRPO_SHORT, 0,
            ("entropy_bonus_from", POLICY_RANDOM_GRPO), 30,
        ),
        # The chat-formatted task. Its EOS is <|im_end|> (id 2), so the missing EOS is <tool_call> (id 3), a token
        # its model never writes; truncation at 2 tokens cuts every answer (3-6 letters).
        ("lr_fast", "ppo", "reverse-chat", "lr0.5", {**fast, "learning_rate": 0.5}, 0, (), 1),
        ("lr_fast", "grpo", "reverse-chat", "lr0.5", {"max_steps": 20, "learning_rate": 0.5}, 1, (), 1),
        (
            "reward_hacking", "grpo", "reverse-chat", "repeats",
            {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:pays_for_repeats"]}, 0, (), "success_fall",
        ),
        ("entropy_collapse", "grpo", "reverse-chat", "t0.2", {**GRPO_SHORT, "temperature": 0.2}, 0, (), 1),
        ("value_frozen", "ppo", "reverse-chat", "frozen@20", PPO_SHORT, 0, ("value_frozen_from", {"step": 20}), 20),
        ("truncated", "grpo", "reverse-chat", "len2", {**GRPO_SHORT, "max_completion_length": 2}, 0, (), 1),
        (
            "zero_spread", "grpo", "reverse-chat", "never",
            {**GRPO_SHORT, "reward_funcs": ["bench.health.rewards:never"]}, 0, (), 1,
        ),
        (
            "reward_scale", "ppo", "reverse-chat", "x1000@20", PPO_SHORT, 0,
            ("scale_rewards_from", {"step": 20, "factor": 1000.0}), 20,
        ),
        ("eos_missing", "ppo", "reverse-chat", "tool_call", PPO_SHORT, 0, ("stop_token", {"token_id": 3}), 1),
        (
            "wrong_reference", "grpo", "reverse-chat", "noise0.3", {**GRPO_SHORT, "beta": 0.04}, 0,
            ("noisy_reference", {"std": 0.3}), 1,
        ),
    ]  # fmt: skip
    return [
        _heldout(mode, algorithm, task, variant, flags, seed, injection, onset)
        for mode, algorithm, task, variant, flags, seed, injection, onset in runs
    ]


# ---------------------------------------------------------------------------------------------------------------------
# TRL 1.16's GRPOTrainer on the sort task (run_trl.py): read from its TensorBoard files and by HealthCallback
# ---------------------------------------------------------------------------------------------------------------------

# TRL's settings beside the built-in task's GRPO (run_trl.py): 8 prompts x 8 completions per step, 60 steps.
TRL_STEPS = 60
# policy_random's injection in TRL (run_trl.entropy_bonus_from): TRL's own entropy term with coef 10 from step 20, and
# the learning rate raised to 5e-4 (seed 0: entropy 0.29 -> 1.3 nats/token in 10 steps; at 2.5e-4 it took 21 steps to
# rise 6-fold; 5e-4 without the bonus leaves the entropy at 0.3-0.5 while the reward falls from 0.9 to about 0.4)
POLICY_RANDOM_TRL = {"step": 20, "coef": 10.0, "learning_rate": 5e-4}


def _trl() -> list[Spec]:
    """TRL runs, healthy and with the failures TRL's own flags (or a reward function) can carry. Flags are TRL
    GRPOConfig fields; injections are run_trl.py's."""
    runs = [
        ("healthy", "default", {}, 0, (), 1),
        ("healthy", "default", {}, 1, (), 1),
        ("healthy", "beta0.04", {"beta": 0.04}, 2, (), 1),
        ("healthy", "lr5e-5", {"learning_rate": 5e-5}, 0, (), 1),
        ("healthy", "loss-grpo", {"loss_type": "grpo"}, 1, (), 1),
        ("lr_fast", "lr0.5", {"learning_rate": 0.5, "max_steps": 20}, 0, (), 1),
        ("lr_fast", "lr0.5", {"learning_rate": 0.5, "max_steps": 20}, 1, (), 1),
        ("entropy_collapse", "t0.2", {"temperature": 0.2}, 0, (), 1),
        ("zero_spread", "always1", {"reward_funcs": ["bench.health.rewards:always_one"]}, 0, (), 1),
        ("truncated", "len4", {"max_completion_length": 4}, 0, (), 1),
        ("reward_scale", "x1000@20", {"scale_rewards": "none"}, 0, ("scale_rewards_from", {"step": 20}), 20),
        ("wrong_reference", "noise0.3", {"beta": 0.04}, 0, ("noisy_reference", {"std": 0.3}), 1),
        ("lr_slow", "lr2e-3@20", {}, 0, ("learning_rate_from", {"step": 20, "learning_rate": 2e-3}), 20),
        ("nonfinite_reward", "overflow@20", {}, 0, ("reward_value_from", {"step": 20, "value": 1e308}), 20),
        ("policy_random", "ent10-lr5e-4@20", {}, 0, ("entropy_bonus_from", POLICY_RANDOM_TRL), 20),
        ("policy_random", "ent10-lr5e-4@20", {}, 1, ("entropy_bonus_from", POLICY_RANDOM_TRL), 20),
    ]
    return [
        Spec(f"trl-{mode}-grpo-{variant}-s{seed}", "trl-grpo", mode, seed, flags, injection, onset, split="trl")
        for mode, variant, flags, seed, injection, onset in runs
    ]


def _agents() -> list[Spec]:
    """The agent task's runs (bench/health/agents.py: its failures and their rules), its own split: healthy GRPO and
    PPO at the built-in settings, and each way an agent run goes wrong."""
    return [
        Spec(f"{base}-s{seed}", algorithm, mode, seed, flags, injection, 1, task="agent", split="agents")
        for base, (mode, algorithm, flags, injection, seeds) in AGENT_RUNS.items()
        for seed in seeds
    ]


SPLITS = ("tuning", "held-out", "trl", "agents")
SPECS: dict[str, Spec] = {
    spec.name: spec for spec in (*_healthy(), *_sick(), *_heldout_healthy(), *_heldout_sick(), *_trl(), *_agents())
}
