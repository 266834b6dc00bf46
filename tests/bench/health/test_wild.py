"""The real runs other people published (../shared/wild-runs, read in place): the doctor judges them as their authors
did, and the real-runs table of docs/health.md says what it found."""

import pytest

from bench.health import wild
from docs import generate
from rlhfkit.health.rules import CRITICAL

pytestmark = pytest.mark.skipif(
    not generate.WILD_RUNS.is_dir(), reason=f"the real runs are read in place from {generate.WILD_RUNS}, absent here"
)


def verdicts():
    return [wild.judge(run, generate.WILD_RUNS) for run in wild.load_labels(generate.WILD_LABELS)]


def test_every_real_run_is_labelled_and_read():
    labelled = {run.file for run in wild.load_labels(generate.WILD_LABELS)}
    present = {str(p.relative_to(generate.WILD_RUNS)) for p in generate.WILD_RUNS.glob("*/*") if p.is_file()}
    assert labelled == present
    assert all(v.rows >= 25 for v in verdicts())


def test_runs_whose_authors_report_success_get_no_critical_finding():
    """The three Sunshine535 runs (converged, by their authors) and verl's gemma run (test score 0.64)."""
    converged = [v for v in verdicts() if v.run.expect_critical is False]
    assert len(converged) == 4 and {v.run.source for v in converged} == {
        "Sunshine535/nips-grpo-dynamics",
        "eric-haibin-lin/verl-data",
    }
    assert {v.run.file: [(f.step, f.rule) for f in v.findings if f.severity == CRITICAL] for v in converged} == {
        v.run.file: [] for v in converged
    }


def test_a_flat_noisy_reward_is_at_most_one_finding_per_rule():
    """The Wordle run's reward only wobbles around -0.26 for 400 steps: no rule reports it twice (it used to get nine
    reward_collapse warnings)."""
    (wordle,) = [v for v in verdicts() if "wordle" in v.run.file]
    rules = [f.rule for f in wordle.findings]
    assert len(rules) == len(set(rules))


def test_the_real_runs_table_is_what_the_doctor_finds():
    lines = wild.render(wild.load_labels(generate.WILD_LABELS), generate.WILD_RUNS)
    text = "\n".join(lines)
    for v in verdicts():
        row = next(line for line in lines if line.startswith(f"| {v.run.file.split('/')[-1]} "))
        agrees = {None: "| no claim |", True: "| yes |", False: "| **no** |"}[v.agrees]
        assert f"| {v.rows} rows |" in row and row.endswith(f"| {'yes' if v.critical else 'no'} {agrees}")
    assert "4 of the 4 runs whose repository reports that they converged" in text
