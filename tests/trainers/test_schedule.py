"""When a run evaluates, and where its epochs end (rlhfkit/trainers/schedule.py)."""

from rlhfkit.trainers.schedule import epoch_end_steps, is_sample_step, sample_every


def test_epoch_ends():
    # 40 prompts, 16 per update: passes end during updates 3 (48 >= 40) and 5 (80 >= 80); the last step always counts.
    assert epoch_end_steps(6, 40, 16) == {3, 5, 6}
    # GRPO: 4 prompts per generation of 6 prompts, 2 steps per generation: passes end with generations 2 and 3.
    assert epoch_end_steps(6, 6, 4, steps_per_draw=2) == {4, 6}
    assert epoch_end_steps(5, 6, 4, steps_per_draw=2) == {4, 5}  # the last generation serves one step
    assert epoch_end_steps(3, 100, 8) == {3}  # no pass ends before the last step


def test_sample_schedule():
    every = sample_every(25, 10)
    assert every == 2 and [s for s in range(1, 26) if is_sample_step(s, 25, every)][-2:] == [24, 25]
    assert sample_every(25, 0) == 0 and not is_sample_step(5, 25, 0)
