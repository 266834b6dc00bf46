"""rlhfkit: RLHF for language models with logging that tells you what training is doing."""
