"""health.jsonl (append, read back) and the console panel."""

import math

from rich.console import Console

from rlhfkit.health import CRITICAL, WARNING, Finding, append_findings, print_finding
from rlhfkit.tracking.rundir import HEALTH_FILE, read_jsonl

RATIO = Finding(
    3, "ratio_far_from_one", WARNING, {"val/ratio": 2.5}, "val/ratio = 2.5, outside [0.5, 2].", "Lower lr."
)
NAN = Finding(9, "nonfinite_metric", CRITICAL, {"loss/value_avg": math.nan}, "1 non-finite metric(s).", "Resume.")


def test_append_writes_one_object_per_line_and_reads_back(tmp_path):
    append_findings(tmp_path, [RATIO])
    append_findings(tmp_path, [NAN])
    lines = (tmp_path / HEALTH_FILE).read_text().splitlines()
    assert len(lines) == 2
    assert '"loss/value_avg": NaN' in lines[1]
    back, unreadable = read_jsonl(tmp_path / HEALTH_FILE)
    assert unreadable == [] and back[0] == RATIO.to_dict()
    assert list(back[0]) == ["step", "rule", "severity", "metrics", "message", "advice"]
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
