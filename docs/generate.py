"""Every generated page of docs/, from the module that knows its facts: ``make docs`` writes them all.

    python docs/generate.py           # write every page (or every generated section of a page)
    python docs/generate.py --check   # exit 1 and name the pages that differ from their renderer's text

Run it with rlhfkit's interpreter (``make docs`` does): it imports rlhfkit, the health set's harness (bench/health/) and,
for the table of TRL's defaults, TRL itself (docs/trl_defaults.py). None of these pages is rlhfkit's business at run
time, so the generator lives beside the pages rather than in the package.

A generated section inside a hand-written page sits between two marker lines, ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->``; only the text between them is replaced.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script (sys.path[0] is docs/): rlhfkit, bench and docs from this checkout
    sys.path.insert(0, str(ROOT))
HEALTH_RECORDS = ROOT / "bench" / "health" / "records"  # the labelled run set's records (bench/health/build.py)
# Real runs other people published, read in place beside the repository, and what their repositories say of them.
WILD_RUNS, WILD_LABELS = ROOT.parent / "shared" / "wild-runs", ROOT / "bench" / "health" / "wild_runs.json"


class Page(NamedTuple):
    path: str  # relative to the repository root
    render: Callable[[], str]
    section: str | None = None  # the name of the generated section; None: the whole file is generated


def _metrics() -> str:
    from rlhfkit.metrics.docs import render_markdown

    return render_markdown()


def _health() -> str:
    from bench.health import wild
    from bench.health.detection import load_records
    from bench.health.docs import render_markdown

    if not WILD_RUNS.is_dir():
        raise FileNotFoundError(f"docs/health.md's real-runs table reads {WILD_RUNS}, which is absent")
    section = wild.render(wild.load_labels(WILD_LABELS), WILD_RUNS)
    return render_markdown(records=load_records(HEALTH_RECORDS), wild=section)


def _trl_flags() -> str:
    from rlhfkit.config.trl_flags_docs import render_markdown

    return render_markdown()


def _grpo_config_table() -> str:
    from rlhfkit.config.trl_flags_docs import render_grpo_config_table

    return render_grpo_config_table()


def _doctor_frameworks() -> str:
    from rlhfkit.health.frameworks import render_markdown

    return render_markdown()


def _trl_defaults() -> str:
    from docs.trl_defaults import render_table

    return render_table()


PAGES = (
    Page("docs/metrics.md", _metrics),
    Page("docs/health.md", _health),
    Page("docs/trl-flags.md", _trl_flags),
    Page("docs/algorithms/grpo.md", _grpo_config_table, section="trl-grpo-config"),
    Page("docs/migrating-from-trl.md", _trl_defaults, section="trl-defaults"),
    Page("docs/doctor-frameworks.md", _doctor_frameworks),
)


def expected(page: Page, current: str) -> str:
    """The text `page` should have, given its `current` text (a section is replaced inside it)."""
    text = page.render()
    if page.section is None:
        return text
    start, end = f"<!-- generated: {page.section} -->\n", f"<!-- end generated: {page.section} -->"
    if start not in current or end not in current:
        raise ValueError(f"{page.path} has no generated section {page.section!r} (marker lines {start!r}, {end!r})")
    head, rest = current.split(start, 1)
    return head + start + text + end + rest.split(end, 1)[1]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for page in PAGES:
        path = ROOT / page.path
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        text = expected(page, current)
        if text == current:
            continue
        stale.append(page.path)
        if not check:
            path.write_text(text, encoding="utf-8")
    if check and stale:
        print(f"stale generated docs: {', '.join(stale)}; run `make docs`", file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
