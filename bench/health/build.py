"""The labelled run set and its detection table, in one command:

    .venv/bin/python bench/health/build.py             # train the runs not yet recorded (2 at a time), then the table
    .venv/bin/python bench/health/build.py --only lr_fast healthy-ppo-default-s0     # names or name prefixes
    .venv/bin/python bench/health/build.py --rebuild --only reward_hacking            # train those again
    .venv/bin/python bench/health/build.py --table     # no training: the table from the records
    .venv/bin/python bench/health/build.py --rerecord  # the records again from bench/health/.runs, without training

Each run (specs.py) trains in its own process with one thread, two side by side, in bench/health/.runs/NAME. Its
record, bench/health/records/NAME.json.gz, keeps the labels (mode, onset), how it ended and every logged row (wall-clock
metrics left out, 6 significant digits): the records are committed, so the table can be regenerated without training
(``make docs``, which writes it into docs/health.md; a test checks it is fresh). Run it from the repository root with
rlhfkit's interpreter. The whole set takes about an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.health.detection import success_fall  # noqa: E402
from bench.health.specs import MODES, SPECS, Spec  # noqa: E402
from rlhfkit.health.sources import read_source  # noqa: E402

HERE = ROOT / "bench" / "health"
RUNS = HERE / ".runs"
RECORDS = HERE / "records"
CPU_2PROC = ROOT / "examples" / "accelerate_configs" / "cpu_2proc.yaml"
# Metrics that measure the machine, not the run (async_generation's waits, speeds and queue depth among them).
WALL_CLOCK = (
    "time/",
    "step_time",
    "eps",
    "perf/",
    "rollout/backpressure_s",
    "rollout/generated_tokens_per_s",
    "sample/rollout_queue_size",
)


def selected(patterns: list[str]) -> list[Spec]:
    if not patterns:
        return list(SPECS.values())
    # In the patterns' order (then the specs'): `--only trl held-out` trains TRL's runs first.
    out = {}
    for p in patterns:
        out |= {s.name: s for s in SPECS.values() if s.name.startswith(p) or s.mode == p or s.split == p}
    return list(out.values())


def train(spec: Spec, out: Path | None = None) -> tuple[Spec, float, int]:
    """Train `spec` into `out` (default bench/health/.runs/NAME, emptied first) in its own process(es), one thread
    each; its output goes to out.log beside it. Returns the spec, the seconds it took and the exit status."""
    out = out or RUNS / spec.name
    if out.exists():
        shutil.rmtree(out)
    python = sys.executable
    command = [python, str(HERE / "run_one.py"), spec.name, str(out)]
    if spec.processes > 1:
        accelerate = str(Path(python).parent / "accelerate")
        command = [accelerate, "launch", "--config_file", str(CPU_2PROC), *command[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    start = time.time()
    out.mkdir(parents=True)
    with open(out.parent / f"{out.name}.log", "w") as log:
        status = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    return spec, time.time() - start, status


def _rounded(value):
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.6g}")
    return value


def record(spec: Spec, out: Path | None = None) -> dict:
    """The record of the run of `spec` in `out` (default bench/health/.runs/NAME): its spec, labels, how it ended and
    its logged rows."""
    out = out or RUNS / spec.name
    rows = []
    if spec.algorithm == "trl-grpo":  # what rlhfkit doctor reads from TRL's TensorBoard files
        logged = read_source(out).rows if any(out.rglob("events.out.tfevents*")) else []
    elif (out / "metrics.jsonl").exists():
        logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    else:
        logged = []
    # TensorBoard's float32 values are kept as read: rounded, a borderline finding of the replay could differ from
    # the one HealthCallback made live on the same values.
    keep = (lambda v: v) if spec.algorithm == "trl-grpo" else _rounded
    for row in logged:
        rows.append({k: keep(v) for k, v in row.items() if not k.startswith(WALL_CLOCK)})
    outcome_file = out / "outcome.json"
    outcome = json.loads(outcome_file.read_text()) if outcome_file.exists() else {"ended": "crashed"}
    onset = success_fall(rows) if spec.onset == "success_fall" else spec.onset
    if spec.mode == "healthy":
        onset = None
    return {
        "name": spec.name,
        "algorithm": spec.algorithm,
        "task": spec.task,
        "split": spec.split,
        "mode": spec.mode,
        "description": MODES.get(
            spec.mode, "healthy settings: " + (json.dumps(spec.flags) if spec.flags else "the built-in ones")
        ),
        "seed": spec.seed,
        "flags": spec.flags,
        "injection": list(spec.injection),
        "onset": onset,
        "onset_kind": "true success falls" if spec.onset == "success_fall" else "injected",
        "ended": outcome,
        "rows": rows,
    }


def write_record(rec: dict) -> None:
    RECORDS.mkdir(parents=True, exist_ok=True)
    # mtime 0: a record written again from the same run is the same bytes (a clean git diff).
    with gzip.GzipFile(RECORDS / f"{rec['name']}.json.gz", "wb", mtime=0) as f:
        f.write(json.dumps(rec, separators=(",", ":")).encode("utf-8"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="Spec names, name prefixes, failure modes or splits (tuning, held-out, trl).",
    )
    parser.add_argument("--rebuild", action="store_true", help="Train the selected runs again.")
    parser.add_argument("--table", action="store_true", help="Only regenerate and print the table.")
    parser.add_argument(
        "--rerecord", action="store_true", help="Write the records again from the run directories, without training."
    )
    parser.add_argument("--jobs", type=int, default=2, help="Runs side by side (one thread each).")
    ns = parser.parse_args(argv)
    if ns.rerecord:
        for spec in selected(ns.only):
            if (RUNS / spec.name / "outcome.json").exists():
                write_record(record(spec))
    elif not ns.table:
        todo = [s for s in selected(ns.only) if ns.rebuild or not (RECORDS / f"{s.name}.json.gz").exists()]
        print(f"{len(todo)} run(s) to train", flush=True)
        with ThreadPoolExecutor(ns.jobs) as pool:
            for spec, seconds, status in pool.map(train, todo):
                rec = record(spec)
                write_record(rec)
                ended = rec["ended"]["ended"]
                print(f"{spec.name}: {len(rec['rows'])} rows, {ended}, exit {status}, {seconds:.0f} s", flush=True)
    for path in RECORDS.glob("*.json.gz"):  # a spec that was removed or renamed takes its record with it
        if path.name.removesuffix(".json.gz") not in SPECS:
            path.unlink()
            print(f"removed {path.name}: no such spec", flush=True)
    from bench.health.detection import load_records, render_markdown
    from docs import generate

    generate.main([])
    print(render_markdown(load_records(RECORDS)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
