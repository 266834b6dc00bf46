"""The real-runs table of docs/health.md: what ``rlhfkit doctor`` says of RL runs other people trained and published
(``../shared/wild-runs``, read in place: third-party files, never copied into the project), beside what each run's
own repository says of it (bench/health/wild_runs.json), the only ground truth there is for such runs.

Unlike the labelled set, nobody injected a failure into these runs: a run whose authors report that it converged or
scored well must get no critical finding; where the authors claim nothing, the findings are shown and not scored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from rlhfkit.health.rules import CRITICAL, INFO


class WildRun(NamedTuple):
    file: str  # relative to the wild-runs directory
    trainer: str
    source: str  # owner/repository on GitHub
    says: str  # what the run's own repository says of it, in our words
    expect_critical: bool | None  # False: the authors report success, so a critical finding contradicts them


class WildVerdict(NamedTuple):
    run: WildRun
    reader: str  # what was read: the Source's description
    rows: int
    findings: list  # the doctor's findings (monitor.Finding), in order

    @property
    def critical(self) -> bool:
        return any(f.severity == CRITICAL for f in self.findings)

    @property
    def agrees(self) -> bool | None:
        """Whether the doctor agrees with the authors; None where they claim nothing."""
        return None if self.run.expect_critical is None else self.critical == self.run.expect_critical


def load_labels(path: str | os.PathLike) -> list[WildRun]:
    """The runs and what their repositories say, from bench/health/wild_runs.json."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [WildRun(**run) for run in data["runs"]]


def judge(run: WildRun, directory: str | os.PathLike) -> WildVerdict:
    """The doctor's diagnosis of one run, read from `directory` as a user would pass it."""
    from rlhfkit.health.doctor import doctor

    diagnosis = doctor(Path(directory) / run.file)
    return WildVerdict(run, diagnosis.source.description, diagnosis.rows, diagnosis.findings)


def _shown(findings: Sequence) -> str:
    """The findings as "step `rule` severity", info ones included (they say what the doctor noticed)."""
    return "; ".join(f"{f.step} `{f.rule}` {f.severity}" for f in findings) or "none"


def render(labels: Sequence[WildRun], directory: str | os.PathLike) -> list[str]:
    """The "Real runs" section of docs/health.md."""
    verdicts = [judge(run, directory) for run in labels]
    claimed = [v for v in verdicts if v.agrees is not None]
    lines = [
        "## Real runs",
        "",
        f"{len(verdicts)} RL runs other people trained and published (TRL `trainer_state.json` files and their bare "
        "`log_history` lists, a verl console log), read by `rlhfkit doctor` as their authors left them, beside what "
        "each run's own repository says of it. They log every 1 to 10 steps, mix evaluation and summary rows in, "
        "carry columns that are `null` throughout, and some run without a KL term or change their environment's "
        "rules on purpose: everything the labelled runs above do not. No threshold was chosen to separate them, "
        "and more runs of this kind, unseen, judge the rules too.",
        "",
        f"- **Against their authors:** {sum(bool(v.agrees) for v in claimed)} of the {len(claimed)} runs whose "
        "repository reports that they converged or scored well get no critical finding; the others' authors claim "
        "nothing the findings could be held to.",
        f"- **Findings:** {sum(f.severity != INFO for v in verdicts for f in v.findings)} warnings or criticals and "
        f"{sum(f.severity == INFO for v in verdicts for f in v.findings)} info findings over the {len(verdicts)} runs.",
        "",
        "| run | trainer | its repository says | read | doctor's findings (step rule severity) | critical | agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        name = Path(v.run.file).name
        agrees = {None: "no claim", True: "yes", False: "**no**"}[v.agrees]
        lines.append(
            f"| {name} ({v.run.source}) | {v.run.trainer} | {v.run.says} | {v.rows} rows | {_shown(v.findings)} | "
            f"{'yes' if v.critical else 'no'} | {agrees} |"
        )
    return lines
