"""`make docs` (python -m rlhfkit.docs) regenerates every generated page, and none is stale."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit import docs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(not docs.WILD_RUNS.is_dir(), reason=f"docs/health.md's real runs are read from {docs.WILD_RUNS}")
def test_every_generated_page_is_fresh():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "rlhfkit.docs", "--check"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr


def test_a_generated_section_is_replaced_between_its_markers_only(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nhand-written\n<!-- generated: table -->\nold\n<!-- end generated: table -->\ntail\n")
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(docs, "PAGES", (docs.Page("page.md", lambda: "new\n", section="table"),))
    assert docs.main(["--check"]) == 1
    assert docs.main([]) == 0
    expected = "# Title\n\nhand-written\n<!-- generated: table -->\nnew\n<!-- end generated: table -->\ntail\n"
    assert page.read_text() == expected
    assert docs.main(["--check"]) == 0


def test_a_page_without_its_markers_is_an_error_naming_them(tmp_path, monkeypatch):
    (tmp_path / "page.md").write_text("no markers\n")
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(docs, "PAGES", (docs.Page("page.md", lambda: "new\n", section="table"),))
    with pytest.raises(ValueError, match="page.md has no generated section 'table'"):
        docs.main([])
