"""TRL's own GRPO test file, run against TRL and against rlhfkit (issue 55; results in docs/trl-tests.md).

    .venv/bin/python bench/trl_tests/run.py PATH/TO/trl/tests/test_grpo_trainer.py [--write-doc] [-k EXPR]

The test file comes from a TRL snapshot (e.g. ``git show <commit>:tests/test_grpo_trainer.py`` of a clone); its
siblings ``__init__.py``, ``testing_utils.py``, ``testing_constants.py`` and ``conftest.py`` are copied with it. The
file runs twice, each time in a fresh directory under ``bench/.runs/trl-tests/<time>/``:

* ``trl/``: unchanged, against the installed TRL;
* ``rlhfkit/``: with only ``from trl import GRPOConfig, GRPOTrainer`` changed to ``from rlhfkit import ...``,
  the one line a user changes.

Both runs load the offline stand-ins of standins.py (hub cache, ``HF_HUB_OFFLINE=1``) and the same root conftest
(conftest_shim.py: the ``zen`` dataset). ``jmespath`` is installed if missing, so the tool tests run. The score is
rlhfkit's passes among the tests TRL passes; a test that fails or skips with TRL counts on neither side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = REPO / "bench" / ".cache" / "trl-tests"
DOC = REPO / "docs" / "trl-tests.md"
SIBLINGS = ["__init__.py", "testing_utils.py", "testing_constants.py", "conftest.py"]
TRL_IMPORT = "from trl import GRPOConfig, GRPOTrainer"
BEGIN, END = "<!-- trl-tests:begin -->", "<!-- trl-tests:end -->"


def prepare(test_file: Path, side: Path, rlhfkit: bool) -> None:
    tests = side / "tests"
    tests.mkdir(parents=True)
    for name in SIBLINGS:
        if (test_file.parent / name).exists():
            shutil.copy(test_file.parent / name, tests / name)
    source = test_file.read_text()
    if rlhfkit:
        if TRL_IMPORT not in source:
            raise SystemExit(f"{test_file} has no line {TRL_IMPORT!r} to change")
        source = source.replace(TRL_IMPORT, TRL_IMPORT.replace("from trl", "from rlhfkit"), 1)
    (tests / test_file.name).write_text(source)
    shutil.copy(HERE / "conftest_shim.py", side / "conftest.py")


def run_side(side: Path, test_file: str, keyword: str | None, log) -> dict[str, str]:
    """Run pytest in ``side``; return test id -> passed / failed / error / skipped / xfailed."""
    env = dict(
        os.environ,
        HF_HUB_CACHE=str(CACHE / "hub"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TRL_TESTS_ZEN=str(CACHE / "datasets" / "zen"),
        WANDB_MODE="disabled",
        TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0",
    )
    report = side / "junit.xml"
    command = [sys.executable, "-m", "pytest", f"tests/{test_file}", "-q", "-p", "no:cacheprovider", "-rN"]
    command += [f"--junitxml={report}", "-o", "junit_family=xunit2", "-W", "ignore"]
    if keyword:
        command += ["-k", keyword]
    with open(side / "pytest.log", "w") as out:
        subprocess.run(command, cwd=side, env=env, stdout=out, stderr=subprocess.STDOUT)
    outcomes, messages = {}, {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name')}"
        child = next(iter(case), None)
        tag = child.tag if child is not None and child.tag in ("failure", "error", "skipped") else "passed"
        if tag == "skipped" and child.get("type") == "pytest.xfail":
            tag = "xfailed"
        outcomes[test] = {"failure": "failed"}.get(tag, tag)
        if child is not None and tag != "passed":
            messages[test] = (child.get("message") or "").strip().splitlines()[0][:300] if child.get("message") else ""
    log(
        f"{side.name}: " + ", ".join(f"{k} {list(outcomes.values()).count(k)}" for k in sorted(set(outcomes.values())))
    )
    return {"outcomes": outcomes, "messages": messages}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("trl", "transformers", "torch", "accelerate", "datasets", "peft", "jmespath")}


def commit() -> str:
    """The commit of the rlhfkit these runs import (PYTHONPATH may point at another checkout), "+" if modified."""
    source = subprocess.run(
        [sys.executable, "-c", "import rlhfkit, os; print(os.path.dirname(rlhfkit.__file__))"],
        capture_output=True, text=True, check=True, cwd="/",  # as pytest imports it: not from this checkout's cwd
    ).stdout.strip()  # fmt: skip
    git = ["git", "-C", source]
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "."], capture_output=True, text=True).stdout.strip()
    return sha + ("+" if dirty else "")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "an unknown CPU"


def summarise(result: dict) -> tuple[list[str], list[str]]:
    trl, ours = result["trl"]["outcomes"], result["rlhfkit"]["outcomes"]
    counted = sorted(t for t, o in trl.items() if o == "passed")
    failing = [t for t in counted if ours.get(t) != "passed"]
    return counted, failing


def merge_results(results: list[dict]) -> dict:
    """Results of runs made apart, in order: each side's first run gives its outcomes; a later run of a side (a -k
    rerun at a later commit) replaces the outcomes of the tests it ran, which are listed as reruns."""
    merged = dict(results[0])
    for result in results[1:]:
        for side in ("trl", "rlhfkit"):
            if side not in result:
                continue
            if side not in merged:
                merged[side] = result[side]
                continue
            rerun = result[side]
            merged[side] = {**merged[side], "outcomes": {**merged[side]["outcomes"], **rerun["outcomes"]}}
            merged[side]["messages"] = {**merged[side]["messages"], **rerun["messages"]}
            merged.setdefault("reruns", []).append(
                {
                    "side": side,
                    "commit": rerun.get("commit"),
                    "time": rerun.get("time"),
                    "tests": sorted(rerun["outcomes"]),
                }
            )
    return merged


def write_doc(result: dict, reasons: dict[str, str]) -> None:
    counted, failing = summarise(result)
    trl, ours = result["trl"]["outcomes"], result["rlhfkit"]["outcomes"]
    neither = sorted(t for t, o in trl.items() if o != "passed")
    share = (len(counted) - len(failing)) / len(counted)
    side = result["rlhfkit"]  # the sides may have been run apart (--sides), each at its own time
    lines = [
        f"Measured {result['trl'].get('time', result['time'])} (TRL) and {side.get('time', result['time'])} (rlhfkit, "
        f"at {side.get('commit', result['commit'])}) on {cpu_name()}, test file `{Path(result['test_file']).name}` "
        f"(blob {result['test_file_sha']}), {', '.join(f'{k} {v}' for k, v in result['versions'].items())}.",
        "",
        f"**TRL passes {len(counted)} of the file's {len(trl)} tests here; rlhfkit passes "
        f"{len(counted) - len(failing)} of those {len(counted)} ({share:.1%}).**",
        "",
        "| test TRL passes and rlhfkit does not | rlhfkit's outcome | why |",
        "|---|---|---|",
    ]
    for test in failing:
        why = reasons.get(test) or reasons.get(test.split("[")[0]) or result["rlhfkit"]["messages"].get(test, "")
        lines.append(f"| `{test}` | {ours.get(test, 'not run')} | {why.replace('|', '/')} |")
    for rerun in result.get("reruns", []):
        lines += [
            "",
            f"Rerun on the {rerun['side']} side at {rerun['commit']} ({rerun['time']}), replacing those tests' outcomes "
            f"above: {len(rerun['tests'])} tests, " + ", ".join(f"`{t}`" for t in rerun["tests"]) + ".",
        ]
    lines += ["", f"Counted on neither side ({len(neither)}: TRL itself does not pass them here):", ""]
    by_outcome: dict[str, list[str]] = {}
    for test in neither:
        by_outcome.setdefault(trl[test], []).append(test)
    for outcome, tests in sorted(by_outcome.items()):
        lines.append(f"* {outcome} ({len(tests)}): " + ", ".join(f"`{t}`" for t in tests))
    text = DOC.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    DOC.write_text(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("test_file", type=Path, help="TRL's tests/test_grpo_trainer.py, in a snapshot's tests/")
    parser.add_argument("-k", dest="keyword", help="only tests matching this pytest -k expression")
    parser.add_argument("--sides", default="trl,rlhfkit", help="comma-separated: trl, rlhfkit")
    parser.add_argument("--write-doc", action="store_true", help="rewrite docs/trl-tests.md's table")
    parser.add_argument(
        "--doc-from", type=Path, nargs="+", help="only rewrite the doc from results.json files (sides run apart merge)"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from reasons import REASONS

    if args.doc_from:
        write_doc(merge_results([json.loads(path.read_text()) for path in args.doc_from]), REASONS)
        return
    try:
        import jmespath  # noqa: F401  (TRL's tool tests are skipped without it)
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "jmespath"], check=True)
    import standins

    failed = standins.build(CACHE)
    for name, error in failed.items():
        print(f"stand-in {name} not built ({error}): its tests count on neither side")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = REPO / "bench" / ".runs" / "trl-tests" / stamp
    result = {
        "time": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit(),
        "test_file": str(args.test_file),
        "test_file_sha": subprocess.run(
            ["git", "hash-object", str(args.test_file)], capture_output=True, text=True
        ).stdout.strip()[:12],
        "versions": versions(),
        "standins_not_built": failed,
    }
    for side in args.sides.split(","):
        prepare(args.test_file, work / side, rlhfkit=side == "rlhfkit")
        result[side] = run_side(work / side, args.test_file.name, args.keyword, print)
        result[side] |= {"time": result["time"], "commit": result["commit"]}
    (work / "results.json").write_text(json.dumps(result, indent=2))
    print(f"results: {work / 'results.json'}")
    if "trl" in result and "rlhfkit" in result:
        counted, failing = summarise(result)
        print(f"TRL passes {len(counted)}; rlhfkit passes {len(counted) - len(failing)} of them")
        for test in failing:
            print(f"  {result['rlhfkit']['outcomes'].get(test, 'not run'):8} {test}")
        if args.write_doc:
            write_doc(result, REASONS)


if __name__ == "__main__":
    main()
