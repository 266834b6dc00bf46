"""`make docs` (python docs/generate.py) regenerates every generated page, and none is stale."""

import subprocess
import sys
from pathlib import Path

import pytest

from docs import generate

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(
    not generate.WILD_RUNS.is_dir(), reason=f"docs/health.md's real runs are read from {generate.WILD_RUNS}"
)
def test_every_generated_page_is_fresh(tmp_path):
    # Run as `make docs` runs it, from another directory: the script puts its own checkout first on sys.path.
    script = ROOT / "docs" / "generate.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_generated_section_is_replaced_between_its_markers_only(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nhand-written\n<!-- generated: table -->\nold\n<!-- end generated: table -->\ntail\n")
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    monkeypatch.setattr(generate, "PAGES", (generate.Page("page.md", lambda: "new\n", section="table"),))
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0
    expected = "# Title\n\nhand-written\n<!-- generated: table -->\nnew\n<!-- end generated: table -->\ntail\n"
    assert page.read_text() == expected
    assert generate.main(["--check"]) == 0


def test_a_page_without_its_markers_is_an_error_naming_them(tmp_path, monkeypatch):
    (tmp_path / "page.md").write_text("no markers\n")
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    monkeypatch.setattr(generate, "PAGES", (generate.Page("page.md", lambda: "new\n", section="table"),))
    with pytest.raises(ValueError, match="page.md has no generated section 'table'"):
        generate.main([])
