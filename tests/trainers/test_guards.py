"""Skipped non-finite steps (rlhfkit/trainers/guards.py)."""

from rlhfkit.trainers.guards import StepGuard


def test_a_step_an_engine_took_itself_is_counted_as_the_run_counts_its_own():
    """StepGuard.record (DeepSpeed steps inside accelerator.backward): a step that did not change the weights is a
    skipped step; it moves the streak that stops training unless fp16 loss scaling is still settling (scale >= 1)."""
    guard = StepGuard(max_streak=2)
    assert guard.record(1.5, applied=True) == 1.5 and guard.streak == 0
    guard.record(float("nan"), applied=False)
    assert guard.streak == 1
    guard.record(float("inf"), applied=False, loss_scale=65536.0)  # an fp16 overflow while the scale settles
    assert (guard.take_skipped(), guard.streak) == (2, 0)
    guard.record(float("nan"), applied=False, loss_scale=0.5)
    guard.record(float("nan"), applied=False, loss_scale=0.5)
    assert guard.streak == 2 and guard.exhausted
    guard.record(0.3, applied=True)
    assert guard.streak == 0 and guard.take_skipped() == 2
