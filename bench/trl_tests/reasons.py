"""Why rlhfkit fails a test of TRL's file that TRL passes: test id (or the id before its parameters) -> reason.

Kept by hand after each run of bench/trl_tests/run.py; a failing test without an entry shows its error message.
"""

_SENTENCE = (
    "matches TRL's own warning sentence; rlhfkit warns through Python's logging on the `rlhfkit` logger (the test's "
    "caplog sees it) in its own words, which the issue allows to differ"
)

REASONS: dict[str, str] = {
    "TestGRPORolloutDispatch::test_generate_rollout_func_raises_when_required_keys_are_missing": (
        "calls TRL's private `GRPOTrainer._generate` on an object assembled from TRL's private attributes "
        "(`_tokenizer`, `_metrics`, `vllm_generation`); rlhfkit checks a rollout_func's returned keys in "
        "`agents.episodes.CustomRollout`, which its own tests cover"
    ),
    "TestGRPOTrainer::test_iterable_dataset_requires_dispatch_batches_false": (
        "`accelerator_config={'dispatch_batches': True}` is refused when the config is built, whatever the dataset "
        "(rlhfkit has no dispatching data loader), with rlhfkit's own message; TRL takes it and raises only with a "
        "streamed set, in a sentence the test matches"
    ),
    "TestGRPOTrainer::test_iterable_eval_keeps_map_style_train_workers": (
        "reads `get_train_dataloader()` / `get_eval_dataloader()`: rlhfkit draws prompts without torch DataLoaders, "
        "so it has no loaders and no worker processes to count"
    ),
    "TestGRPOTrainer::test_liger_kernel_with_peft_lm_head_raises": (
        "`use_liger_kernel=True` is refused when the config is built (rlhfkit has no Liger kernels; docs/trl-flags.md), "
        "before the trainer's check on a LoRA `lm_head` that the test expects"
    ),
    "TestGRPOTrainer::test_warning_raised_all_rewards_none": _SENTENCE,
    "TestGRPOTrainer::test_warning_raised_sequence_level_with_token_summed_loss": _SENTENCE,
    "TestGRPOTrainer::test_train_reward_func_with_log_extra": (
        "reads TRL's private `trainer._logs`; rlhfkit logs a reward function's `log_extra` columns in the "
        "completions table (its tests read them there)"
    ),
    "TestGRPOTrainer::test_train_with_multiple_environments": (
        "reads TRL's private `trainer._env_tools`; rlhfkit keeps each instance's tools in `Environments.box`"
    ),
    "TestGRPOTrainer::test_train_with_unknown_environment_raises": (
        "rlhfkit raises the ValueError (a `DataError` whose message the test matches) when the trainer is built, "
        "before any model loads; the test expects it from `train()`"
    ),
}
