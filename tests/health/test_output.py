"""health.jsonl (append, read back), the console panel, and the evidence shown with a finding: the metric's
observations around its step and the threshold it crossed."""

import math

from rich.console import Console

from rlhfkit.health import CRITICAL, WARNING, Finding, append_findings, print_finding
from rlhfkit.health.output import evidence, evidence_text
from rlhfkit.tracking.rundir import HEALTH_FILE, read_jsonl

RATIO = Finding(
    3, "ratio_far_from_one", WARNING, {"val/ratio": 2.5}, "val/ratio = 2.5, outside [0.5, 2].", "Lower lr."
)
NAN = Finding(9, "nonfinite_metric", CRITICAL, {"loss/value_avg": math.nan}, "1 non-finite metric(s).", "Resume.")
# Steps 1..12, with kl at every step but 6 (an eval row) and entropy only at even steps.
ROWS = [
    {
        "step": s,
        **({"kl": s / 1000} if s != 6 else {"eval/task_success": 0.5}),
        **({"entropy": 0.3} if s % 2 == 0 else {}),
    }
    for s in range(1, 13)
]


def steps(points) -> list[int]:
    return [step for step, _ in points]


def test_append_writes_one_object_per_line_and_reads_back(tmp_path):
    append_findings(tmp_path, [RATIO])
    append_findings(tmp_path, [NAN])
    lines = (tmp_path / HEALTH_FILE).read_text().splitlines()
    assert len(lines) == 2
    assert '"loss/value_avg": NaN' in lines[1]
    back, unreadable = read_jsonl(tmp_path / HEALTH_FILE)
    assert unreadable == [] and back[0] == RATIO.to_dict()
    assert list(back[0]) == ["step", "rule", "severity", "metrics", "message", "advice", "thresholds"]
    assert back[1]["rule"] == "nonfinite_metric" and math.isnan(back[1]["metrics"]["loss/value_avg"])


def test_nothing_to_append_creates_no_file(tmp_path):
    append_findings(tmp_path, [])
    assert not (tmp_path / HEALTH_FILE).exists()


def test_print_finding_shows_severity_rule_step_message_and_advice_verbatim():
    console = Console(record=True, width=100, color_system=None)
    print_finding(RATIO, console)
    text = console.export_text()
    assert "health WARNING ratio_far_from_one at step 3" in text
    assert "outside [0.5, 2]." in text  # brackets printed, not parsed as rich markup
    assert "Try: Lower lr." in text
    assert len(text.splitlines()) == 4  # compact: border, message, advice, border


def test_evidence_is_four_observations_before_the_step_and_two_after():
    # Observations, not rows: step 6 has no kl, so the window reaches back to step 3.
    around = evidence(ROWS, 8, ["kl"])
    assert around == {"kl": [(3, 0.003), (4, 0.004), (5, 0.005), (7, 0.007), (8, 0.008), (9, 0.009), (10, 0.01)]}
    assert steps(evidence(ROWS, 8, ["entropy"])["entropy"]) == [2, 4, 6, 8, 10, 12]  # only 3 before step 8
    assert steps(evidence(ROWS, 8, ["kl"], before=1, after=0)["kl"]) == [7, 8]
    assert steps(evidence(ROWS, 8, ["kl"], before=0, after=5)["kl"]) == [8, 9, 10, 11, 12]


def test_evidence_is_cut_at_the_ends_of_the_run():
    assert steps(evidence(ROWS, 1, ["kl"])["kl"]) == [1, 2, 3]
    assert steps(evidence(ROWS, 2, ["kl"])["kl"]) == [1, 2, 3, 4]
    assert steps(evidence(ROWS, 12, ["kl"])["kl"]) == [8, 9, 10, 11, 12]
    assert steps(evidence(ROWS, 40, ["kl"])["kl"]) == [8, 9, 10, 11, 12]  # past the last: the last five


def test_evidence_at_a_step_without_the_metric_centres_on_its_next_observation():
    assert steps(evidence(ROWS, 6, ["kl"])["kl"]) == [2, 3, 4, 5, 7, 8, 9]
    assert steps(evidence(ROWS, 0, ["kl"])["kl"]) == [1, 2, 3]


def test_evidence_skips_rows_without_the_metric_keeps_non_finite_values_and_every_name():
    rows = [{"step": 1, "loss": 0.5}, {"step": 2}, {"step": 3, "loss": math.nan}, {"step": 4, "loss": "n/a"}]
    around = evidence(rows, 3, ["loss", "eval/task_success", "kl"])
    assert list(around) == ["loss", "eval/task_success", "kl"]
    assert around["loss"][0] == (1, 0.5) and around["loss"][1][0] == 3 and math.isnan(around["loss"][1][1])
    assert len(around["loss"]) == 2 and around["eval/task_success"] == [] and around["kl"] == []
    assert evidence([], 3, ["loss"]) == {"loss": []}


def test_evidence_text_brackets_the_finding_step_and_shows_the_threshold():
    kl = Finding(8, "kl_far_from_reference", CRITICAL, {"kl": 0.008}, "m", "a", {"kl": 2.0})
    assert (
        evidence_text(ROWS, kl)
        == "kl: 3: 0.003, 4: 0.004, 5: 0.005, 7: 0.007, [8: 0.008], 9: 0.009, 10: 0.01 (threshold 2)"
    )
    rows = [
        {"step": s, "val/ratio": r, "loss/value_avg": v}
        for s, r, v in [(3, 0.99, 1.0), (4, 0.981234, 1.5), (5, 0.52, 12345.0), (6, 0.5, 2.0)]
    ]
    two = Finding(5, "r", WARNING, {"val/ratio": 0.52, "loss/value_avg": 12345.0}, "m", "a", {"val/ratio": 0.5})
    assert evidence_text(rows, two).splitlines() == [
        "val/ratio: 3: 0.99, 4: 0.981, [5: 0.52], 6: 0.5 (threshold 0.5)",
        "loss/value_avg: 3: 1, 4: 1.5, [5: 1.23e+04], 6: 2",  # no threshold: none shown
    ]
    zero = Finding(6, "r", WARNING, {"val/ratio": 0.5}, "m", "a", {"val/ratio": 0.0})  # a threshold of 0 is shown
    assert evidence_text(rows, zero) == "val/ratio: 3: 0.99, 4: 0.981, 5: 0.52, [6: 0.5] (threshold 0)"


def test_evidence_text_of_a_non_finite_metric_has_no_threshold():
    rows = [{"step": 8, "loss/value_avg": 0.2}, {"step": 9, "loss/value_avg": math.nan}, {"step": 10}]
    assert evidence_text(rows, NAN) == "loss/value_avg: 8: 0.2, [9: nan]"
