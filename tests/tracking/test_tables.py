"""Completion tables as markdown (TensorBoard) and rich (console)."""

from rich.console import Console

from rlhfkit.tracking.tables import format_cell, markdown_table, rich_table


def test_format_cell():
    assert format_cell(3.921875) == "3.922"
    assert format_cell(float("nan")) == "nan"
    assert format_cell(True) == "True"
    assert format_cell("a") == "a"


def test_markdown_table_keeps_each_value_in_its_cell():
    text = markdown_table(["query", "model response", "score"], [["a|b", "line1\nline2", 0.5], ["x", "y", 1.0]])
    assert text.splitlines() == [
        "| query | model response | score |",
        "|---|---|---|",
        "| a\\|b | line1<br>line2 | 0.5 |",
        "| x | y | 1 |",
    ]


def test_rich_table_prints_model_output_verbatim():
    console = Console(record=True, width=80)
    console.print(
        rich_table("completions (step 3)", ["query", "model response", "score"], [["1+1=", "2[PAD][bold]", 0.25]])
    )
    text = console.export_text()
    assert "completions (step 3)" in text
    assert "2[PAD][bold]" in text  # not swallowed as rich markup
    assert "0.25" in text
