"""Small helpers shared by the tests."""


def asset_flags(assets, task: bool = True) -> list[str]:
    """CLI flags pointing `rlhfkit ppo` at the built-in task's assets in `assets` (a path)."""
    flags = [
        "--model_name_or_path", str(assets / "tokenizer"),
        "--sft_model_path", str(assets / "sft"),
        "--reward_model_path", str(assets / "reward"),
        "--dataset_name", str(assets / "prompts"),
    ]  # fmt: skip
    return flags + (["--task", str(assets)] if task else [])
