"""The progress bar of evaluations: drawn on a terminal with its counts, beneath training's bar when that one shows;
nothing off a terminal or on a process other than the main one."""

import io

import pytest
from rich.console import Console
from rich.progress import Progress, TextColumn

from rlhfkit.tracking.progress import progress_bar


def console(terminal: bool = True) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=100)


def test_a_terminal_shows_the_label_and_the_count():
    screen = console()
    with progress_bar(5, "completions of the model", screen) as advance:
        advance(2)
        advance(3)
    out = screen.file.getvalue()
    assert "completions of the model" in out and "5/5" in out


@pytest.mark.parametrize("case", ["log file", "another process", "RANK 1", "nothing to count"])
def test_nothing_is_drawn_off_a_terminal_or_off_the_main_process(case, monkeypatch):
    screen = console(terminal=case != "log file")
    if case == "RANK 1":
        monkeypatch.setenv("RANK", "1")
    total = 0 if case == "nothing to count" else 5
    with progress_bar(
        total, "completions of the model", screen, show=False if case == "another process" else None
    ) as a:
        a(5)
    assert screen.file.getvalue() == ""


@pytest.mark.skipif(not hasattr(Console(), "_live_stack"), reason="this rich shows one live display at a time")
def test_beneath_a_live_training_bar_both_show_and_training_goes_on():
    screen = console()
    training = Progress(TextColumn("{task.description}"), console=screen)
    training.start()
    step = training.add_task("updates", total=3)
    with progress_bar(4, "evaluation completions", screen) as advance:
        advance(4)
        training.refresh()
        both = screen.file.getvalue()
    training.advance(step)
    training.stop()
    assert "evaluation completions" in both and "4/4" in both and "updates" in both


def test_a_rich_that_cannot_nest_shows_no_second_bar_and_no_error(monkeypatch):
    from rich.errors import LiveError

    def one_at_a_time(live):
        raise LiveError("Only one live display may be active at once")

    screen = console()
    monkeypatch.setattr(screen, "set_live", one_at_a_time)
    with progress_bar(4, "evaluation completions", screen) as advance:
        advance(4)
    assert "evaluation completions" not in screen.file.getvalue()
