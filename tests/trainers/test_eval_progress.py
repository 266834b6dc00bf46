"""In-training evaluations show their progress beneath training's bar on a terminal (off a terminal nothing: every
other trainer test reads that output)."""

from rlhfkit.trainers.build import build_ppo_trainer
from tests.trainers.test_ppo import small_config


def test_evaluation_completions_show_on_a_terminal_with_the_training_bar(tiny_assets, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes the captured stdout for a terminal
    build_ppo_trainer(small_config(tiny_assets, tmp_path, total_episodes=32, num_sample_generations=2)).train()
    out = capsys.readouterr().out
    assert "evaluation completions" in out and "updates" in out
