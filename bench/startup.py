"""Whole-process time of short rlhfkit commands, at commits side by side (issue 54: what short runs pay before work).

    .venv/bin/python bench/startup.py --commits 3b71dcd HEAD [--runs 3]

Times two commands from process start to exit, each in a fresh process:

* ``rlhfkit grpo --help``: imports and the parser;
* ``rlhfkit grpo --max_steps 2``: a 2-step GRPO run of the built-in task (its assets cached by a first run), no
  trackers, no sample generations.

Each commit is taken with ``git archive`` into ``bench/.cache/commits/<sha>/`` and run from there (``PYTHONPATH``
before the installed rlhfkit) in ``bench/.venvs/rlhfkit`` (rlhfkit's required dependencies only, as bench/run.py
builds it; ``.venv`` with ``--python``). Runs alternate between the commits; the table gives medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commits import REPO, checkout, cpu_name

COMMANDS = {
    "`rlhfkit grpo --help`": ["grpo", "--help"],
    "`rlhfkit grpo --max_steps 2` (built-in task)": [
        "grpo",
        "--max_steps",
        "2",
        "--report_to",
        "none",
        "--num_sample_generations",
        "0",
    ],  # fmt: skip
}


def timed(python: str, source: Path, argv: list[str], scratch: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(source), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if "--max_steps" in argv:
        argv = [*argv, "--output_dir", str(scratch / f"run-{time.monotonic_ns()}")]
    start = time.perf_counter()
    # from `source`: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH
    done = subprocess.run([python, "-m", "rlhfkit", *argv], env=env, cwd=source, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed at {source.name}:\n{done.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", nargs="+", default=["HEAD"], help="commits to compare (git revisions)")
    parser.add_argument("--runs", type=int, default=3, help="runs per command and commit (default 3)")
    parser.add_argument("--python", default=str(REPO / "bench" / ".venvs" / "rlhfkit" / "bin" / "python"))
    args = parser.parse_args()
    sources = [checkout(c) for c in args.commits]
    for _, source in sources:  # each commit's runs import that commit's rlhfkit, not the installed working tree
        probe = [args.python, "-c", "import rlhfkit; print(rlhfkit.__file__)"]
        imported = subprocess.run(probe, env=dict(os.environ, PYTHONPATH=str(source)), cwd=source, capture_output=True)
        if not Path(imported.stdout.decode().strip()).resolve().is_relative_to(source.resolve()):
            raise SystemExit(f"{source} does not import its own rlhfkit: {imported.stdout.decode()}{imported.stderr}")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for _, source in sources:  # a first run of each builds the caches (built-in task assets, .pyc files)
            for argv in COMMANDS.values():
                timed(args.python, source, argv, Path(scratch))
        for i in range(args.runs):
            for label, argv in COMMANDS.items():
                order = sources if i % 2 == 0 else sources[::-1]
                for sha, source in order:
                    times.setdefault((label, sha), []).append(timed(args.python, source, argv, Path(scratch)))
    shas = [sha for sha, _ in sources]
    print(f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_name()} ({os.cpu_count()} cores), "
          f"{Path(args.python).parent.parent.name} environment, whole-process wall time, median of {args.runs} "
          "(alternating):\n")  # fmt: skip
    print("| command | " + " | ".join(f"at {s} (s)" for s in shas) + " |")
    print("|---|" + "---|" * len(shas))
    for label in COMMANDS:
        cells = []
        for sha in shas:
            runs = times[(label, sha)]
            cells.append(f"{statistics.median(runs):.2f} ({', '.join(f'{t:.2f}' for t in runs)})")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
