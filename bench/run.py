"""rlhfkit vs TRL, side by side: one command builds the assets and TRL's environments, runs both libraries with the
same settings several times, alternating, and prints the medians and the rlhfkit/TRL ratios.

    .venv/bin/python bench/run.py                      # PPO and GRPO, 3 runs each (about 20-40 minutes on 2 cores)
    .venv/bin/python bench/run.py --quick              # toy sizes, 1 run: checks the harness end to end
    .venv/bin/python bench/run.py --trainers grpo --runs 5
    .venv/bin/python bench/run.py --readme [RESULTS.json]   # rewrite bench/README.md's results table

Run it with rlhfkit's interpreter (it imports rlhfkit's builder for the assets, never TRL). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RUNNERS = BENCH_DIR / "runners"
VENVS = BENCH_DIR / ".venvs"
RESULTS = BENCH_DIR / "results"
RUNS_DIR = BENCH_DIR / ".runs"
README = BENCH_DIR / "README.md"
sys.path.insert(0, str(BENCH_DIR))

import settings as S  # noqa: E402
from commits import checkout, cpu_name  # noqa: E402

# Libraries both sides share, pinned in TRL's environments to the versions of rlhfkit's environment.
SHARED_PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "numpy",
)
LIBRARIES = ("rlhfkit", "trl")
ASYNC = "rlhfkit-async"  # rlhfkit with --async_generation (bench/run.py --async-staleness K)
AT = "rlhfkit@"  # + a short sha: an earlier commit's rlhfkit (bench/run.py --baseline REV), in the same environment


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# environments
def package_versions(python: str | Path, names=SHARED_PACKAGES + ("trl", "rlhfkit")) -> dict[str, str | None]:
    code = (
        "import json, importlib.metadata as m\n"
        f"names = {list(names)!r}\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def public(version: str) -> str:
    return version.split("+")[0]


def ensure_venv(name: str, requirement: str, wanted: dict[str, str], shared: dict[str, str]) -> Path:
    """bench/.venvs/NAME: `requirement` and its own dependencies, the shared libraries pinned to rlhfkit's versions.

    Reused when the versions in `wanted` (and the shared pins) already match. torch goes in first and alone: a bare
    torch requirement pulls a multi-GB CUDA build on machines without a GPU.
    """
    path = VENVS / name
    python = path / "bin" / "python"
    wanted = {**wanted, **{k: v for k, v in shared.items() if v}}
    if python.exists():
        have = package_versions(python, tuple(wanted))
        if all(have.get(k) and public(have[k]) == public(v) for k, v in wanted.items()):
            return python
        log(f"[bench] {path.name}: versions differ from the pins, rebuilding ({have})")
    log(f"[bench] creating {path} ({requirement}, torch {shared['torch']})")
    VENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [f"torch=={public(shared['torch'])}"], check=True)
    others = [f"{k}=={public(v)}" for k, v in shared.items() if v and k != "torch"]
    subprocess.run(pip + [*requirement.split(), *others], check=True)
    return python


def ensure_trl_venv(trainer: str, shared: dict[str, str]) -> Path:
    """bench/.venvs/trl-X: TRL pinned for this trainer."""
    pin = S.TRL_PINS[trainer]
    version = pin.split("==")[1]
    return ensure_venv(f"trl-{version}", pin, {"trl": version}, shared)


def ensure_rlhfkit_venv(version: str, shared: dict[str, str]) -> Path:
    """bench/.venvs/rlhfkit: this checkout installed editable (so every run measures the current source) with its
    required dependencies only, as `pip install rlhfkit` gives a user; the same recipe as TRL's environments.

    Not the development environment: transformers and accelerate import optional packages whenever they are
    installed (peft through transformers.trainer_utils, trio through httpcore2), so the dev extras (peft, selenium,
    deepspeed, ...) would cost rlhfkit's runs memory and start-up time that TRL's runs, in environments of TRL's own
    requirements, do not pay."""
    return ensure_venv("rlhfkit", f"-e {REPO_DIR}", {"rlhfkit": version}, shared)


# ---------------------------------------------------------------------------------------------------------------
# one run
def child_env(threads: int, device: str, tokenizer_json: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        OPENBLAS_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        WANDB_MODE="disabled",
        BENCH_TOKENIZER_JSON=tokenizer_json,
    )
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_one(
    library: str,
    trainer: str,
    run: int,
    seed: int,
    python: Path,
    cfg: dict,
    paths: dict,
    ns,
    session_dir: Path,
    source: Path | None = None,
) -> dict:
    """One run of `library` in a fresh process; `source`: the directory whose rlhfkit/ an earlier commit's run imports
    (bench/commits.py), ahead of the environment's editable install of the working tree."""
    run_dir = session_dir / f"{trainer}-{library}-{run}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    spec = {
        "trainer": trainer,
        "run": run,
        "seed": seed,
        "threads": ns.threads,
        "settings": dict(cfg["shared"], seed=seed),
        "rlhfkit_settings": cfg["rlhfkit"],
        "trl_settings": cfg["trl"],
        "episodes": cfg["episodes"],
        "paths": paths,
        "reward_func": f"{RUNNERS / 'reward.py'}:correctness",
        "output_dir": str(run_dir / "out"),
        "result": str(run_dir / "result.json"),
        "eval_max_new_tokens": S.EVAL_MAX_NEW_TOKENS,
    }
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2))
    if library == ASYNC:  # the same runner, settings and thread count; the trainer splits the threads with its worker
        spec["rlhfkit_settings"] = {
            **cfg["rlhfkit"],
            "async_generation": "true",
            "max_staleness": ns.async_staleness,
            "generation_threads": ns.async_generation_threads,
        }
        (run_dir / "spec.json").write_text(json.dumps(spec, indent=2))
    runner = RUNNERS / ("rlhfkit_runner.py" if library != "trl" else f"trl_{trainer}_runner.py")
    env = child_env(ns.threads, ns.device, str(Path(paths["tokenizer"]) / "tokenizer.json"))
    cwd = REPO_DIR if library != "trl" else run_dir  # TRL's runner starts where nothing of rlhfkit is importable
    if source is not None:
        env["PYTHONPATH"], cwd = str(source), source
    with open(run_dir / "log.txt", "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(python), str(runner), str(run_dir / "spec.json")],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        timer = threading.Timer(ns.timeout, proc.kill)
        timer.start()
        _, status, _ = os.wait4(proc.pid, 0)
        timer.cancel()
        wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    result_path = run_dir / "result.json"
    if code != 0 or not result_path.exists():
        tail = (run_dir / "log.txt").read_text()[-4000:]
        raise RuntimeError(f"{library} {trainer} run {run} failed (exit {code}); log {run_dir / 'log.txt'}:\n{tail}")
    result = json.loads(result_path.read_text())
    if library != "trl":  # rlhfkit's runner reports the package it imported: the intended tree's, or stop
        imported, intended = Path(result["rlhfkit_source"]).parent.resolve(), Path(source or REPO_DIR).resolve()
        if imported != intended:
            raise RuntimeError(f"{library} {trainer} run {run} imported rlhfkit from {imported}, not {intended}")
    result["library"] = library  # rlhfkit's runner says "rlhfkit" for both of rlhfkit's schedules
    result["process_seconds"] = round(wall, 3)
    result["new_tokens"] = cfg["new_tokens"]
    result["run_dir"] = str(run_dir)
    if not ns.keep_models:
        for sub in ("out",):
            for model_file in (run_dir / sub).rglob("*.safetensors"):
                model_file.unlink()
    return derive(result)


def derive(r: dict) -> dict:
    """Rates from a run's raw numbers."""
    t = r["train_seconds"]
    observed = r["generated_sequences"] > 0
    tokens = r["generated_tokens"] if observed else r["episodes"] * r["new_tokens"]
    gen = r["phases"]["generation"]
    r["generation_observed"] = observed
    r["episodes_per_s"] = r["episodes"] / t
    r["tokens_per_s"] = tokens / t
    r["generate_tokens_per_s"] = tokens / gen if observed and gen > 0 else None
    cpu = r.get("train_cpu_seconds")
    r["episodes_per_cpu_s"] = r["episodes"] / cpu if cpu else None
    return r


# ---------------------------------------------------------------------------------------------------------------
# summaries
ROWS = [
    # key, label, format, better ("high" / "low" / None)
    ("episodes_per_s", "episodes/s", "{:.2f}", "high"),
    ("episodes_per_cpu_s", "episodes per CPU-second", "{:.2f}", "high"),
    ("tokens_per_s", "generated tokens/s (whole run)", "{:.0f}", "high"),
    ("generate_tokens_per_s", "tokens/s inside generation", "{:.0f}", "high"),
    ("train_seconds", "train() wall time (s)", "{:.1f}", "low"),
    ("phases.generation", "  generation (s)", "{:.1f}", "low"),
    ("phases.scoring", "  scoring/ref/value forwards (s)", "{:.1f}", "low"),
    ("phases.optimization", "  optimisation (s)", "{:.1f}", "low"),
    ("phases.other", "  other (s)", "{:.1f}", "low"),
    ("train_cpu_seconds", "train() CPU time, all threads (s)", "{:.1f}", "low"),
    ("cpu_phases.generation", "  generation CPU (s)", "{:.1f}", "low"),
    ("cpu_phases.scoring", "  scoring CPU (s)", "{:.1f}", "low"),
    ("cpu_phases.optimization", "  optimisation CPU (s)", "{:.1f}", "low"),
    ("cpu_phases.other", "  other CPU (s)", "{:.1f}", "low"),
    ("setup_seconds", "start-up to train() (s)", "{:.1f}", "low"),
    ("peak_rss_mb", "peak RSS (MB)", "{:.0f}", "low"),
    ("peak_rss_before_train_mb", "  of which before train() (MB)", "{:.0f}", "low"),
    ("task_success", "task success after training", "{:.3f}", "high"),
]


def value(r: dict, key: str):
    for part in key.split("."):
        r = r.get(part) if isinstance(r, dict) else None
    return r


def medians(results: list[dict]) -> dict:
    out = {}
    for key, *_ in ROWS:
        vals = [v for v in (value(r, key) for r in results) if v is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def ratios_to_trl(med: dict, lib: str) -> dict:
    return {
        key: med[lib][key] / med["trl"][key]
        if med[lib][key] is not None and med["trl"][key] not in (None, 0)
        else None
        for key, *_ in ROWS
    }


def summarize(data: dict) -> dict:
    """Per trainer: each library's medians, and rlhfkit's (and rlhfkit-async's, when measured) ratios to TRL."""
    summary = {}
    for trainer in data["meta"]["trainers"]:
        measured = dict.fromkeys(r["library"] for r in data["runs"] if r["trainer"] == trainer)
        libraries = [*LIBRARIES, ASYNC, *sorted(lib for lib in measured if lib.startswith(AT))]
        by_lib = {
            lib: [r for r in data["runs"] if r["trainer"] == trainer and r["library"] == lib] for lib in libraries
        }
        if not all(by_lib[lib] for lib in LIBRARIES):
            continue
        by_lib = {lib: runs for lib, runs in by_lib.items() if runs}
        med = {lib: medians(rs) for lib, rs in by_lib.items()}

        pairs = [a["episodes_per_s"] / b["episodes_per_s"] for a, b in zip(by_lib["rlhfkit"], by_lib["trl"])]
        summary[trainer] = {
            "median": med,
            "ratio": ratios_to_trl(med, "rlhfkit"),
            "ratios": {lib: ratios_to_trl(med, lib) for lib in by_lib if lib != "trl"},
            "n": {k: len(v) for k, v in by_lib.items()},
            "paired_eps_ratios": pairs,
            "versions": {lib: runs[0]["version"] for lib, runs in by_lib.items()},
        }
    return summary


def fmt(v, f):
    return "-" if v is None else f.format(v)


TITLES = {
    "ppo": "PPO ({episodes} episodes, batch {b}, {n} new tokens, {e} PPO epochs)",
    "grpo": "GRPO ({episodes} completions, batch {b}, {g} generations/prompt, {n} new tokens, beta {beta})",
}


def title(trainer: str, data: dict) -> str:
    s = data["meta"]["settings"][trainer]
    sh = s["shared"]
    return TITLES[trainer].format(
        episodes=s["episodes"],
        b=sh["per_device_train_batch_size"],
        n=s["new_tokens"],
        e=sh.get("num_ppo_epochs"),
        g=sh.get("num_generations"),
        beta=sh.get("beta"),
    )


def table_lines(trainer: str, data: dict, summary: dict, markdown: bool) -> list[str]:
    s = summary[trainer]
    v = s["versions"]
    ours = [lib for lib in s["median"] if lib != "trl"]
    names = {lib: lib for lib in ours} | {
        "rlhfkit": f"rlhfkit at {data['meta']['versions'].get('rlhfkit commit') or 'the working tree'}",
        ASYNC: f"rlhfkit async (max_staleness {data['meta'].get('async_staleness')})",
    }
    head = ["", *(f"{names[lib]} {v[lib]}" for lib in ours), f"TRL {v['trl']}"]
    head += [f"{names[lib]} / TRL" for lib in ours]
    rows = []
    for key, label, f, better in ROWS:
        values = [s["median"][lib][key] for lib in [*ours, "trl"]]
        if all(x is None for x in values):  # not measured by this version of the harness
            continue
        note = (
            {"high": " (higher is better)", "low": " (lower is better)"}.get(better, "")
            if key in ("episodes_per_s", "peak_rss_mb")
            else ""
        )
        ratios = [s["ratios"][lib][key] for lib in ours]
        rows.append(
            [
                label.strip() if markdown else label,
                *(fmt(x, f) for x in values),
                *((fmt(r, "{:.2f}") + "x" if r is not None else "-") + note for r in ratios),
            ]
        )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return lines
    widths = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(head, widths))]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in rows]
    return lines


def print_summary(data: dict) -> None:
    summary = summarize(data)
    for trainer, s in summary.items():
        log("")
        log(f"== {title(trainer, data)}: median of {s['n']['rlhfkit']} (rlhfkit) / {s['n']['trl']} (TRL) runs")
        for line in table_lines(trainer, data, summary, markdown=False):
            log(line)
        log(
            "per run (episodes/s): "
            + "; ".join(
                f"{r['library']}#{r['run']} {r['episodes_per_s']:.2f}" for r in data["runs"] if r["trainer"] == trainer
            )
        )
        target_eps = s["ratio"]["episodes_per_s"]
        log(  # issue 54's memory target (<= 0.5x TRL at real shapes) is bench/real_shapes.py's
            f"target episodes/s >= 1.3x TRL (issue 54): {'met' if target_eps and target_eps >= 1.3 else 'NOT met'} "
            f"({fmt(target_eps, '{:.2f}')}x)"
        )
        if not all(r["generation_observed"] for r in data["runs"] if r["trainer"] == trainer):
            log(
                "warning: a run's generation did not go through transformers' generate; its generation phase is "
                "not measured (tokens counted as episodes x new tokens)"
            )
    if "baseline_success" in data["meta"]:
        log(f"\nSFT model before training: task success {data['meta']['baseline_success']['task_success']:.3f}")


# ---------------------------------------------------------------------------------------------------------------
# README
BEGIN, END = "<!-- bench-results:begin -->", "<!-- bench-results:end -->"


def readme_section(data: dict) -> str:
    meta, summary = data["meta"], summarize(data)
    lines = [
        f"Measured {meta['date']} on {meta['machine']['cpu']} ({meta['machine']['cores']} cores, "
        f"{meta['machine']['memory_gb']} GB), device {meta['device']}, {meta['threads']} threads, "
        f"{'--quick, ' if meta['quick'] else ''}"
        + "; ".join(f"{t.upper()}: median of {s['n']['rlhfkit']} runs per library" for t, s in summary.items())
        + ".",
    ]
    if meta.get("note"):
        lines += ["", f"**{meta['note']}**"]
    for trainer in summary:
        lines += ["", f"**{title(trainer, data)}**", ""] + table_lines(trainer, data, summary, markdown=True)
    if "baseline_success" in meta:
        lines += [
            "",
            f"Task success of the SFT model before training: {meta['baseline_success']['task_success']:.3f}.",
        ]
    lines += ["", "Library versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v) + "."]
    return "\n".join(lines)


def write_readme(data: dict) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{readme_section(data)}\n{END}{tail}")
    log(f"[bench] wrote the results table into {README}")


# ---------------------------------------------------------------------------------------------------------------
def load_results(files: list[str]) -> dict:
    """One results file, or several merged: the runs of all, the first file's metadata, the union of trainers."""
    datas = [json.loads(Path(f).read_text()) for f in files]
    data = datas[0]
    for other in datas[1:]:
        data["runs"] += other["runs"]
        for t in other["meta"]["trainers"]:
            if t not in data["meta"]["trainers"]:
                data["meta"]["trainers"].append(t)
                data["meta"]["settings"][t] = other["meta"]["settings"][t]
        versions = data["meta"]["versions"]
        for key, v in other["meta"]["versions"].items():
            if versions.get(key) != v:
                versions[key] = f"{versions.get(key) or '?'} / {v}"
        data["meta"]["date"] += f", {other['meta']['date']}"
    return data


def rlhfkit_revision() -> str | None:
    """The repository's commit, with '+dirty' when rlhfkit/ has uncommitted changes (what was measured)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "rlhfkit"], cwd=REPO_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def machine() -> dict:
    try:
        cpu = cpu_name()
    except OSError:
        cpu = platform.processor() or platform.machine()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 2**20)
    except OSError:
        pass
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "memory_gb": mem, "platform": platform.platform()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="rlhfkit vs TRL, side by side (see bench/README.md).")
    p.add_argument("--runs", type=int, default=None, help="runs per library and trainer (default 3; 1 with --quick)")
    p.add_argument("--trainers", default="ppo,grpo", help="comma-separated: ppo, grpo")
    p.add_argument("--quick", action="store_true", help="toy model and lengths: checks the harness in minutes")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch / OpenMP threads of every run (default 1: at these model sizes a second thread mostly "
        "adds synchronisation, and on a shared machine oversubscribed threads spin; see README)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu hides GPUs from both libraries")
    p.add_argument("--seed", type=int, default=42, help="seed of run 0; run i uses seed + i on both sides")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before a run is killed")
    p.add_argument("--keep-models", action="store_true", help="keep the trained weights under bench/.runs/")
    p.add_argument("--note", default=None, help="a line shown above the README table (e.g. 'preliminary')")
    p.add_argument(
        "--readme",
        nargs="*",
        default=None,
        metavar="RESULTS.json",
        help="only rewrite bench/README.md's results table from results files (default: the latest); "
        "several files are merged (e.g. PPO and GRPO measured in separate invocations)",
    )
    p.add_argument("--write-readme", action="store_true", help="also rewrite README's table after this run")
    p.add_argument(
        "--async-staleness",
        type=int,
        default=None,
        metavar="K",
        help="also run rlhfkit with --async_generation --max_staleness K (same threads in all: the trainer gives half "
        "to its generation worker)",
    )
    p.add_argument(
        "--async-generation-threads",
        type=int,
        default=0,
        metavar="N",
        help="with --async-staleness: the worker's --generation_threads (default 0: half the threads; N > 0 gives the "
        "worker N and leaves the trainer all --threads, oversubscribing the cores)",
    )
    p.add_argument(
        "--baseline",
        metavar="REV",
        default=None,
        help="also run an earlier commit's rlhfkit (a git revision), alternating with the working tree and TRL in the "
        "same environment and settings (bench/commits.py)",
    )
    p.add_argument("--summary", nargs="+", metavar="RESULTS.json", help="only print the tables of results files")
    ns = p.parse_args(argv)

    if ns.readme is not None:
        write_readme(load_results(ns.readme or [str(RESULTS / "latest.json")]))
        return 0
    if ns.summary:
        print_summary(load_results(ns.summary))
        return 0

    trainers = [t.strip() for t in ns.trainers.split(",") if t.strip()]
    for t in trainers:
        if t not in S.TRL_PINS:
            p.error(f"unknown trainer {t!r}: use ppo, grpo")
    runs = ns.runs or (1 if ns.quick else 3)

    from assets import ensure_assets
    from runners.evaluate import task_success

    rlhfkit_python = Path(sys.executable)
    shared = package_versions(rlhfkit_python, SHARED_PACKAGES + ("rlhfkit",))
    if not shared.get("rlhfkit"):
        p.error(f"{sys.executable} has no rlhfkit: run this with rlhfkit's interpreter (.venv/bin/python)")
    shared_pins = {k: v for k, v in shared.items() if k in SHARED_PACKAGES}
    rlhfkit_venv = ensure_rlhfkit_venv(shared["rlhfkit"], shared_pins)
    baseline_sha, baseline_source = checkout(ns.baseline) if ns.baseline else (None, None)
    pythons = {t: {"rlhfkit": rlhfkit_venv, "trl": ensure_trl_venv(t, shared_pins)} for t in trainers}

    assets = ensure_assets("quick" if ns.quick else "bench")
    paths = {k: assets[k] for k in ("tokenizer", "sft", "reward", "prompts", "eval_tokenizer")}
    baseline = task_success(assets["sft_original"], assets["eval_tokenizer"], assets["prompts"], S.EVAL_MAX_NEW_TOKENS)
    log(
        f"[bench] assets {assets['key']}: {assets['num_parameters'] / 1e6:.2f}M parameters, "
        f"SFT task success {baseline['task_success']:.3f}"
    )

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    session_dir = RUNS_DIR / stamp
    configs = {t: S.trainer_settings(t, ns.quick) for t in trainers}
    versions = {
        "rlhfkit": shared["rlhfkit"],
        "rlhfkit commit": rlhfkit_revision(),
        **({"baseline commit": baseline_sha} if baseline_sha else {}),
        **{f"trl ({t})": S.TRL_PINS[t].split("==")[1] for t in trainers},
        **shared_pins,
        "python": platform.python_version(),
    }
    data = {
        "meta": {
            "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "machine": machine(),
            "device": ns.device,
            "threads": ns.threads,
            "async_staleness": ns.async_staleness,
            "async_generation_threads": ns.async_generation_threads,
            "runs": runs,
            "quick": ns.quick,
            "trainers": trainers,
            "seed": ns.seed,
            "note": ns.note,
            "versions": versions,
            "assets": {k: v for k, v in assets.items() if k != "task"},
            "baseline_success": baseline,
            "settings": configs,
        },
        "runs": [],
    }
    RESULTS.mkdir(exist_ok=True)
    out_path = RESULTS / f"results-{stamp}.json"
    for run in range(runs):
        for trainer in trainers:
            libraries = (*LIBRARIES, *([ASYNC] if ns.async_staleness is not None else []))
            libraries += (AT + baseline_sha,) if baseline_sha else ()
            order = libraries if run % 2 == 0 else libraries[::-1]  # alternate who goes first
            for library in order:
                log(f"[bench] {trainer} run {run + 1}/{runs}: {library} ...")
                r = run_one(
                    library,
                    trainer,
                    run,
                    ns.seed + run,
                    pythons[trainer]["trl" if library == "trl" else "rlhfkit"],
                    configs[trainer],
                    paths,
                    ns,
                    session_dir,
                    baseline_source if library.startswith(AT) else None,
                )
                data["runs"].append(r)
                ph = r["phases"]
                log(
                    f"[bench]   {r['episodes_per_s']:.2f} episodes/s, {r['tokens_per_s']:.0f} tokens/s, train "
                    f"{r['train_seconds']:.1f}s (gen {ph['generation']:.1f}, score {ph['scoring']:.1f}, "
                    f"opt {ph['optimization']:.1f}, other {ph['other']:.1f}), peak RSS {r['peak_rss_mb']:.0f} MB, "
                    f"success {r['task_success']:.3f}"
                )
                out_path.write_text(json.dumps(data, indent=2))
    shutil.copyfile(out_path, RESULTS / "latest.json")
    print_summary(data)
    log(f"\n[bench] results: {out_path}")
    if ns.write_readme:
        write_readme(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
