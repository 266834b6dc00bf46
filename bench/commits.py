"""Earlier commits of rlhfkit for the benches to run beside the working tree (bench/run.py --baseline, bench/startup.py).

A commit's ``rlhfkit/`` is taken with ``git archive`` into ``bench/.cache/commits/<sha>/`` once; a bench runs it with
that directory first on ``PYTHONPATH``, in the same environment as the working tree's runs, so only rlhfkit's source
differs between them.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMITS = REPO / "bench" / ".cache" / "commits"


def checkout(commit: str) -> tuple[str, Path]:
    """(short sha, directory holding that commit's rlhfkit/ package) for a git revision of this repository."""
    sha = subprocess.run(["git", "rev-parse", "--short", commit], cwd=REPO, capture_output=True, text=True, check=True)
    sha = sha.stdout.strip()
    target = COMMITS / sha
    if not (target / "rlhfkit").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha, "rlhfkit"], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return sha, target


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo), as the tables name the machine."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()
