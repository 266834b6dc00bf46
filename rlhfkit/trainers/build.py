"""From a config to a ready trainer, as ``rlhfkit ppo|grpo|quickstart`` build it: the built-in task when no model is
given, then the data and the task (a bad dataset fails before any model loads), then the models.

PPO's models load here and GRPO's in its trainer because the two trainers take what TRL's take: TRL 1.12's PPOTrainer
gets model objects (policy, reference, reward and value models), so a command loads them by name first; TRL 1.16's
GRPOTrainer gets the policy's hub id or path (and reward models' names) and loads them itself, as rlhfkit's does."""

from __future__ import annotations

from rlhfkit.config import GRPOConfig, PPOConfig, TrainConfig
from rlhfkit.data import load_prompt_splits
from rlhfkit.errors import ConfigError
from rlhfkit.models import (
    Hub,
    check_lora_setup,
    check_same_vocabulary,
    load_reward_model,
    load_scalar_model,
    load_tokenizer,
    load_trained_policy,
    weight_dtype,
)
from rlhfkit.rewards import resolve_reward_funcs
from rlhfkit.tasks import DEFAULT_TASK, Assets, builtin_assets, load_task
from rlhfkit.tasks.agent import AgentTask
from rlhfkit.trainers.grpo import GRPOTrainer
from rlhfkit.trainers.ppo import PPOTrainer
from rlhfkit.trainers.resume import refuse_other_run, resolve_output_dir

MODEL_FLAGS = ("model_name_or_path", "sft_model_path", "reward_model_path", "value_model_path", "model_name")

# The settings of the built-in task: they apply only to flags the user did not set, and only when no model flag is
# given. docs/builtin_task.md has what each was measured to do ("What moves PPO on it", "GRPO: more steps").
# PPO: a strong KL penalty keeps the policy where the reward model ranks well; two gentle PPO epochs over many fresh
# completions; lam 1 takes the returns from the score while the value model is still poor.
BUILTIN_PPO_DEFAULTS = {
    "learning_rate": 1e-4,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 1,
    "num_mini_batches": 1,
    "num_ppo_epochs": 2,
    "total_episodes": 20480,
    "local_rollout_forward_batch_size": 64,
    "per_device_eval_batch_size": 128,
    "stop_token": "eos",
    "kl_coef": 0.15,
    "lam": 1.0,
    "temperature": 0.7,
    "num_sample_generations": 10,
    "save_steps": 0,
}


# GRPO: 32 prompts x 8 completions per step, the task's rule-based rewards (correctness and positional partial
# credit), sampling at 0.7 like PPO; a short warm-up spares the policy Adam's first full-size steps.
BUILTIN_GRPO_DEFAULTS = {
    "learning_rate": 1e-4,
    "warmup_ratio": 0.1,
    "num_generations": 8,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 4,
    "max_steps": 250,
    "per_device_eval_batch_size": 128,
    "temperature": 0.7,
    "logging_steps": 1,
    "num_sample_generations": 10,
    "save_steps": 0,
}


# The agent task (tasks/agent.py): episodes that may call the calculator, scored by the task's correctness rule (no
# reward model, so no reward hacking to hold back: PPO's KL penalty is lighter). GRPO: 16 prompts x 8 episodes per
# step; its reward saturates within ~15 steps, so 40. PPO: 1536 episodes (24 updates; task success passed 90% by
# update 6). docs/agent-task.md has what they were measured to do.
BUILTIN_AGENT_GRPO_DEFAULTS = {
    **BUILTIN_GRPO_DEFAULTS,
    "per_device_train_batch_size": 32,
    "max_steps": 40,
    "num_sample_generations": 2,
}
BUILTIN_AGENT_PPO_DEFAULTS = {
    **BUILTIN_PPO_DEFAULTS,
    "total_episodes": 1536,
    "num_sample_generations": 2,
    "kl_coef": 0.05,
}


def uses_builtin_task(args: TrainConfig) -> bool:
    return not any(getattr(args, flag, None) for flag in MODEL_FLAGS)


def apply_builtin_task(
    args: TrainConfig,
    explicit: set[str] | frozenset[str] = frozenset(),
    preset: str = "default",
    task_name: str = DEFAULT_TASK,
) -> None:
    """Point the model/data paths at the built-in task `task_name`'s assets (built on first use) and apply its
    defaults. The agent task also gets its tool-calling rounds and, for PPO, its rule-based rewards (it has no reward
    model)."""
    assets = Assets(builtin_assets(preset, task=task_name))
    task = load_task(assets.root)
    agent = isinstance(task, AgentTask)
    if isinstance(args, PPOConfig):
        args.model_name_or_path = assets.tokenizer
        args.sft_model_path = assets.sft
        if agent and not args.reward_funcs:
            args.reward_funcs = list(task.reward_funcs)
        if not args.reward_funcs:  # with reward functions, PPO scores with them alone (docs/builtin_task.md)
            args.reward_model_path = assets.reward
        ppo = BUILTIN_AGENT_PPO_DEFAULTS if agent else BUILTIN_PPO_DEFAULTS
        defaults = dict(ppo, response_length=task.max_new_tokens)
    else:
        args.model_name_or_path = assets.sft
        grpo = BUILTIN_AGENT_GRPO_DEFAULTS if agent else BUILTIN_GRPO_DEFAULTS
        defaults = dict(grpo, max_completion_length=task.max_new_tokens)
    if agent:
        defaults["max_tool_calling_iterations"] = task.max_tool_calling_iterations
    if not args.dataset_name:
        args.dataset_name = assets.prompts
    if not args.task:
        args.task = str(assets.root)
    if "max_steps" in explicit:  # PPO: --max_steps counts the updates; the task's episode count would contradict it
        defaults.pop("total_episodes", None)
    for name, value in defaults.items():
        if name not in explicit:
            setattr(args, name, value)


def asked_evaluation(args: TrainConfig, explicit: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The flags by which the user asked for evaluation on the test split, as they would read them (None: nothing
    asked). The default schedule (num_sample_generations, TRL PPO's) evaluates when the dataset has a test split and
    is quietly skipped when it has none; an evaluation asked for in so many words must not be: --eval_strategy
    steps|epoch, --eval_on_start, an explicit --num_sample_generations N > 0, or an explicit --dataset_test_split
    with any schedule that evaluates."""
    asked = []
    if args.eval_strategy != "no":
        asked.append(f"--eval_strategy {args.eval_strategy}")
    if args.eval_on_start:
        asked.append("--eval_on_start")
    if "num_sample_generations" in explicit and args.num_sample_generations and args.eval_strategy == "no":
        asked.append(f"--num_sample_generations {args.num_sample_generations}")
    evaluates = args.eval_strategy != "no" or args.eval_on_start or bool(args.num_sample_generations)
    if "dataset_test_split" in explicit and evaluates:
        asked.append(f"--dataset_test_split {args.dataset_test_split}")
    return " and ".join(asked) or None


def _load_data_and_task(args: TrainConfig, explicit: set[str] | frozenset[str] = frozenset()):
    """The prompt dataset's splits and the task, loaded before any model (a bad dataset fails fast). An evaluation
    the user asked for (asked_evaluation) with no test split to run on is a ConfigError, not a silent skip."""
    if args.dataset_name is None:
        raise ConfigError(
            "Model flags were given but no --dataset_name: pass the prompt dataset to train on (a hub id, a local "
            "directory or a .json/.jsonl/.csv/.parquet file). Without model flags, rlhfkit runs its built-in task."
        )
    train, test = load_prompt_splits(
        args.dataset_name,
        args.dataset_train_split,
        args.dataset_test_split,
        args.dataset_config,
        required_by=asked_evaluation(args, explicit),
    )
    return train, test, load_task(args.task) if args.task else None


def grpo_reward_sources(args: GRPOConfig, task) -> list:
    """GRPOTrainer's reward_funcs from the command line, in `trl grpo`'s order (trl/scripts/grpo.py): the reward
    models (--reward_model_path, then --reward_model_name_or_path) first, then the --reward_funcs, so --reward_weights
    weigh them in that order. Without --reward_funcs and without a reward model, the task's rule-based rewards."""
    models = list(args.reward_model_path or [])
    if args.reward_funcs or not models:
        return models + resolve_reward_funcs(args.reward_funcs, task)
    return models


def build_grpo_trainer(
    args: GRPOConfig,
    explicit: set[str] | frozenset[str] = frozenset(),
    builtin: str = DEFAULT_TASK,
    preset: str = "default",
):
    """A GRPOTrainer from the names in ``args`` (hub ids or local paths). Without model flags, the built-in task
    `builtin` (its `preset` build) and its rewards; the agent task with its tools."""
    if uses_builtin_task(args):
        apply_builtin_task(args, explicit, preset, builtin)
        if "reward_funcs" not in explicit:
            args.reward_funcs = list(load_task(args.task).reward_funcs)
    quantization = args.quantization()
    check_lora_setup(args.use_peft, quantization)  # --use_peft without peft, --load_in_4bit without a GPU: exit 2 now
    train, test, task = _load_data_and_task(args, explicit)
    return GRPOTrainer(
        model=args.model_name_or_path,
        reward_funcs=grpo_reward_sources(args, task),
        args=args,
        train_dataset=train,
        eval_dataset=test,
        task=task,
        tools=list(task.tools) if isinstance(task, AgentTask) else None,
    )


def build_ppo_trainer(
    args: PPOConfig,
    explicit: set[str] | frozenset[str] = frozenset(),
    builtin: str = DEFAULT_TASK,
    preset: str = "default",
):
    """A PPOTrainer from the names in ``args`` (hub ids or local paths). Without model flags, the built-in task
    `builtin` (its `preset` build)."""
    if uses_builtin_task(args):
        apply_builtin_task(args, explicit, preset, builtin)
    quantization = args.quantization()
    check_lora_setup(args.use_peft, quantization)  # --use_peft without peft, --load_in_4bit without a GPU: exit 2 now
    if args.reward_model_path is None and not args.reward_funcs:
        # TRL 1.12's ppo.py defaulted the reward model to EleutherAI/pythia-160m, a causal LM with a fresh score head:
        # a random reward. rlhfkit does not train against one without being told which reward to use.
        raise ConfigError(
            "PPO needs a reward: pass --reward_model_path PATH (a sequence-classification reward model with the "
            "policy's vocabulary) and/or --reward_funcs NAME (a built-in reward with --task, one of TRL's, or "
            "'module:function'). Without model flags, rlhfkit runs its built-in task with its reward model."
        )
    train, test, task = _load_data_and_task(args, explicit)
    hub = Hub(
        revision=args.model_revision,
        trust_remote_code=args.trust_remote_code,
        attn_implementation=args.attn_implementation,
    )
    sft_path = args.sft_model_path or args.model_name_or_path
    sft_flag = "sft_model_path" if args.sft_model_path else "model_name_or_path"
    tokenizer_flag = "model_name_or_path" if args.model_name_or_path else sft_flag
    tokenizer = load_tokenizer(args.model_name_or_path or sft_path, tokenizer_flag, hub)
    dtype = weight_dtype(args.dtype)
    policy = load_trained_policy(sft_path, sft_flag, hub, dtype=args.dtype, quantization=quantization)
    # PPOTrainer scores the reward functions, then the reward model: --reward_weights weigh them in that order (TRL
    # 1.12's PPO had a reward model alone; `trl grpo` puts its reward models first).
    reward_funcs = resolve_reward_funcs(args.reward_funcs, task) if args.reward_funcs else None
    reward_model = None
    if args.reward_model_path is not None:
        # Scored with the policy's token ids: the reward model reads the policy's tokenizer (checked just below).
        reward_model, _ = load_reward_model(args.reward_model_path, tokenizer, dtype, hub, "reward_model_path")
        check_same_vocabulary(tokenizer, args.reward_model_path, reward_model, "reward_model_path", hub)
    value_model = None
    if args.value_model_path:
        value_model = load_scalar_model(args.value_model_path, dtype, "value_model_path", hub)
        check_same_vocabulary(tokenizer, args.value_model_path, value_model, "value_model_path", hub)
    return PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        ref_model=None,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=train,
        eval_dataset=test,
        task=task,
        reward_funcs=reward_funcs,
        tools=list(task.tools) if isinstance(task, AgentTask) else None,
    )


def build_trainer(
    args: TrainConfig,
    explicit: set[str] | frozenset[str] = frozenset(),
    builtin: str = DEFAULT_TASK,
    preset: str = "default",
):
    """The trainer of the algorithm `args` configures: a GRPOTrainer for a GRPOConfig, else a PPOTrainer. An
    output_dir that another run holds is refused first (the trainer would refuse a finished one only when training
    begins, after the models load). builtin, preset: the built-in task (and its build) used without model flags."""
    resolve_output_dir(args)
    refuse_other_run(args)
    if isinstance(args, GRPOConfig):
        return build_grpo_trainer(args, explicit, builtin, preset)
    return build_ppo_trainer(args, explicit, builtin, preset)
