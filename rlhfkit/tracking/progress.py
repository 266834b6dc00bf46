"""Progress of the waits besides training's steps (an evaluation's completions and verdicts, in-training evaluations),
in the style of training's bar (RunLogger.progress): on a terminal, a live rich bar that goes when its count is done;
elsewhere (a log file, a pipe, output a test captures) nothing, since what follows the wait (a report, a logged row)
is the record."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _hidden(n: int = 1) -> None:
    """What a bar that is not shown does with progress: nothing."""


@contextmanager
def progress_bar(
    total: int, description: str, console: Any = None, show: bool | None = None
) -> Iterator[Callable[[int], None]]:
    """A bar counting to `total` things (completions, verdicts), labelled `description`: yields advance(n=1).

    console: the rich Console to draw on; None: one on stderr, so that what a command prints on stdout stays clean.
    On a console that already shows a live display (training's bar), the bar appears beneath it where rich nests live
    displays (rich >= 14.1; an older one shows no second bar). show: whether this process shows it; None: when it is
    the main process of a launch ($RANK unset or 0).
    """
    if show is None:
        show = os.environ.get("RANK", "0") == "0"
    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    if not show or total <= 0 or not console.is_terminal:
        yield _hidden
        return
    from rich.errors import LiveError
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        redirect_stdout=not console.stderr,  # a command's output on stdout stays there
    )
    task = bar.add_task(description, total=total)
    try:
        bar.start()
    except LiveError:
        yield _hidden
        return
    try:
        yield lambda n=1: bar.advance(task, n)
    finally:
        bar.stop()
