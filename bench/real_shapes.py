"""Peak memory of rlhfkit and TRL at real model shapes on the CPU: bench/README.md, "Real shapes (CPU)".

Models with a real vocabulary and real widths, scaled down in depth (bench/real_shapes_assets.py: Qwen2.5-0.5B,
Qwen3-1.7B and Llama-3.2-1B shapes, random weights, float32), one GRPO step (8 completions of N tokens for one
prompt, a reference model, beta 0.04) or one PPO update (8 rollouts of N tokens, policy, reference, value and reward
models), every completion exactly N tokens long in both libraries. Each run is a fresh process
(bench/runners/real_shapes_runner.py); its peak is the kernel's ``ru_maxrss`` (``os.wait4``), as in bench/memory.py.

    .venv/bin/python bench/real_shapes.py                                  # GRPO and PPO, Qwen2.5-0.5B, 32/256/512
    .venv/bin/python bench/real_shapes.py --trainers grpo --lengths 512 --runs 3
    .venv/bin/python bench/real_shapes.py --shapes qwen3-1.7b llama-3.2-1b --trainers grpo --lengths 32 256
    .venv/bin/python bench/real_shapes.py --profile --lengths 512          # per-phase peaks, one run per library
    .venv/bin/python bench/real_shapes.py --quick                          # tiny shape: checks the harness (a minute)
    .venv/bin/python bench/real_shapes.py --summary bench/results/real-shapes-YYYYMMDD-HHMMSS.json

Environments: rlhfkit and TRL 1.16 (GRPO) run with this interpreter by default (the development environment holds
both); TRL 1.12 (PPO, ``trl.experimental.ppo``) cannot be installed beside TRL 1.16 and runs with
``--trl-ppo-python`` (default: bench/.venvs/trl-1.12.0, which bench/run.py builds, else /tmp/trl112), an environment
with the same torch and transformers. ``--rlhfkit-src DIR`` runs rlhfkit from another checkout (e.g. a commit
extracted with ``git archive``), so a measurement names the commit it measured (``--rlhfkit-commit``).

Memory guard (the machine may be shared): before each run the driver waits until ``MemAvailable`` is at least
``--min-available-gb``, and kills a run whose RSS passes ``--max-rss-gb`` (reported as over the budget).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RUNNER = BENCH_DIR / "runners" / "real_shapes_runner.py"
RESULTS = BENCH_DIR / "results"
sys.path.insert(0, str(BENCH_DIR))

import settings as S  # noqa: E402
from real_shapes_assets import SHAPES, logits_gb  # noqa: E402

BATCH = 8  # GRPO: 8 completions of one prompt; PPO: 8 rollouts


def grpo_settings(length: int, library: str) -> dict:
    """bench/settings.py's GRPO settings (the throughput bench's), for one step of 8 completions of `length`."""
    shared = dict(S.GRPO_SHARED)
    shared.update(
        per_device_train_batch_size=BATCH,
        num_generations=BATCH,
        max_steps=1,
        max_completion_length=length,
        mask_truncated_completions=False,  # every completion is cut at `length` (no reachable EOS)
    )
    own = S.GRPO_RLHFKIT if library == "rlhfkit" else S.GRPO_TRL
    return {**shared, **own}


def ppo_settings(length: int, library: str) -> dict:
    """bench/settings.py's PPO settings, for one update of 8 rollouts of `length` (one epoch, one mini-batch)."""
    shared = dict(S.PPO_SHARED)
    shared.update(
        per_device_train_batch_size=BATCH,
        local_rollout_forward_batch_size=BATCH,
        total_episodes=BATCH,
        num_ppo_epochs=1,
        num_mini_batches=1,
        response_length=length,
    )
    own = S.PPO_RLHFKIT if library == "rlhfkit" else S.PPO_TRL
    return {**shared, **own}


def gb(mib: float) -> float:
    """MiB (what the kernel and the runner report) to GB (10^9 bytes, the unit of every table)."""
    return mib * 2**20 / 1e9


def trl_version(trainer: str) -> str:
    return S.TRL_PINS[trainer].split("==")[1]


# ---------------------------------------------------------------------------------------------------------------
def mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9  # kB (KiB) to GB
    return float("nan")


def wait_for_memory(need_gb: float, patience_s: float) -> bool:
    deadline = time.time() + patience_s
    while mem_available_gb() < need_gb:
        if time.time() > deadline:
            return False
        print(f"[real-shapes] waiting: {mem_available_gb():.1f} GB available, {need_gb:.0f} GB wanted", flush=True)
        time.sleep(30)
    return True


def child_rss_gb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 0.0


def run_one(python: str, spec: dict, env: dict, cwd: str, max_rss_gb: float, timeout: float) -> dict:
    """A runner process: its result, the kernel's ru_maxrss (MB), and why it failed if it did."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(spec, output_dir=os.path.join(tmp, "run"), result=os.path.join(tmp, "result.json"))
        spec_path = os.path.join(tmp, "spec.json")
        Path(spec_path).write_text(json.dumps(spec))
        log_path = os.path.join(tmp, "log.txt")
        start, killed = time.time(), None
        with open(log_path, "w") as log:
            proc = subprocess.Popen([python, str(RUNNER), spec_path], cwd=cwd, env=env, stdout=log, stderr=log)
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                rss = child_rss_gb(proc.pid)
                if killed is None and rss > max_rss_gb:
                    killed = f"RSS {rss:.1f} GB passed --max-rss-gb {max_rss_gb}"
                    proc.kill()
                elif killed is None and time.time() - start > timeout:
                    killed = f"over --timeout {timeout:.0f} s"
                    proc.kill()
                time.sleep(0.1)
        code = os.waitstatus_to_exitcode(status)
        out = {"ru_maxrss_mb": round(usage.ru_maxrss / 1024, 1), "seconds": round(time.time() - start, 1)}
        if code == 0 and killed is None:
            out.update(json.loads(Path(spec["result"]).read_text()))
        else:
            out["failed"] = killed or f"exit {code}"
            out["log_tail"] = Path(log_path).read_text()[-4000:]
        return out


def rlhfkit_commit(src: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--", "rlhfkit"], capture_output=True, text=True
        )
        if head.returncode == 0:
            return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")
    except OSError:
        pass
    return "unknown"


def build_assets(shape: str, layers: int, python: str) -> dict:
    """In a child process: this one stays small (Linux carries a parent's peak RSS into its children's ru_maxrss)."""
    argv = [python, str(BENCH_DIR / "real_shapes_assets.py"), shape, "--layers", str(layers)]
    built = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if built.returncode != 0:
        raise RuntimeError(f"building the {shape} assets failed:\n{built.stderr[-3000:]}")
    return json.loads(built.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
def tables(data: dict) -> str:
    """Markdown: per trainer, shape and length, both libraries' median peak and the ratio; the profiles."""
    meta, results = data["meta"], data["results"]
    lines = []
    keys = sorted({(r["trainer"], r["shape"], r["length"]) for r in results}, key=lambda k: (k[0], k[1], k[2]))
    runs = sorted({r["run"] for r in results})
    profile = meta.get("profile")
    if not profile:
        lines.append(f"Peak RSS (GB = 10^9 bytes), median of each row's runs (listed; up to {len(runs)} per library).")
        lines.append("")
        lines.append("| trainer | shape | N | rlhfkit (GB) | TRL (GB) | rlhfkit / TRL | rlhfkit runs | TRL runs |"
                     " [8, N, V] fp32 (GB) |")  # fmt: skip
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for trainer, shape, length in keys:
            cells = {}
            for library in ("rlhfkit", "trl"):
                rows = [r for r in results if (r["trainer"], r["shape"], r["length"], r["library"]) ==
                        (trainer, shape, length, library)]  # fmt: skip
                ok = [gb(r["ru_maxrss_mb"]) for r in rows if "failed" not in r]
                failed = [r["failed"] for r in rows if "failed" in r]
                each = ", ".join(f"{v:.2f}" for v in ok) + (f" ({len(failed)} failed: {failed[0]})" if failed else "")
                cells[library] = (statistics.median(ok) if ok else None, each or "-")
            (a, a_runs), (b, b_runs) = cells["rlhfkit"], cells["trl"]
            ratio = f"{a / b:.2f}x" if a and b else "-"
            name = f"{trainer.upper()} (TRL {trl_version(trainer)})"
            vocab = SHAPES[shape]["vocab_size"]
            lines.append(
                f"| {name} | {shape} | {length} | {a or float('nan'):.2f} | {b or float('nan'):.2f} | {ratio} | "
                f"{a_runs} | {b_runs} | {logits_gb(BATCH, length, vocab):.2f} |"
            )
        return "\n".join(lines)
    for r in results:
        if "failed" in r:
            lines.append(f"{r['library']} {r['trainer']} {r['shape']} N={r['length']}: failed ({r['failed']})")
            continue
        lines.append(
            f"**{r['library']} {r['version']} {r['trainer'].upper()}, {r['shape']}, 8 x {r['length']} tokens**: "
            f"peak {gb(r['peak_rss_mb']):.2f} GB; RSS when train() starts {gb(r['rss_at_train_start_mb']):.2f} GB"
        )
        lines.append("")
        lines.append("| phase | calls | RSS at entry (GB) | peak (GB) | peak - entry (GB) |")
        lines.append("|---|---|---|---|---|")
        for p in r["phases"]:
            indent = "&nbsp;&nbsp;" * p["depth"]
            lines.append(
                f"| {indent}{p['label']} | {p['calls']} | {gb(p['rss_in_mb']):.2f} | {gb(p['peak_mb']):.2f} | "
                f"{gb(p['peak_mb'] - p['rss_in_mb']):+.2f} |"
            )
        for label, saved in r.get("saved_for_backward", {}).items():
            big = "; ".join(f"{s['shape']} {s['dtype']} {gb(s['mb']):.2f}" for s in saved["largest"][:6])
            lines.append("")
            lines.append(f"Saved for backward in the {label}: {gb(saved['total_mb']):.2f} GB in all; largest: {big}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Peak RSS of rlhfkit vs TRL at real model shapes (bench/real_shapes.py).")
    p.add_argument("--shapes", nargs="+", default=["qwen2.5-0.5b"], choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=1, help="transformer layers of every shape (default 1)")
    p.add_argument("--trainers", nargs="+", default=["grpo", "ppo"], choices=["grpo", "ppo"])
    p.add_argument("--lengths", nargs="+", type=int, default=[32, 256, 512], help="completion lengths N")
    p.add_argument("--libraries", nargs="+", default=["rlhfkit", "trl"], choices=["rlhfkit", "trl"])
    p.add_argument("--runs", type=int, default=3, help="runs per row and library (the table shows the median)")
    p.add_argument("--profile", action="store_true", help="per-phase peaks instead (one run per library)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (speed only, not memory)")
    p.add_argument("--rlhfkit-src", type=Path, default=ROOT, help="the rlhfkit checkout to measure")
    p.add_argument("--rlhfkit-commit", help="the commit --rlhfkit-src holds (default: asked from git)")
    p.add_argument("--rlhfkit-python", default=sys.executable)
    p.add_argument("--trl-grpo-python", default=sys.executable, help="an environment with trl==1.16.0")
    default_ppo = BENCH_DIR / ".venvs" / "trl-1.12.0" / "bin" / "python"
    p.add_argument("--trl-ppo-python", default=str(default_ppo if default_ppo.exists() else "/tmp/trl112/bin/python"))
    p.add_argument("--min-available-gb", type=float, default=12.0, help="wait for this much MemAvailable (GB) first")
    p.add_argument("--max-rss-gb", type=float, default=14.0, help="kill a run whose RSS passes this many GB")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is killed")
    p.add_argument("--quick", action="store_true", help="the tiny shape, N = 16, one run: checks the harness")
    p.add_argument("--trim-cpu-heap", action="store_true", help="rlhfkit's runs with --trim_cpu_heap (off by default)")
    p.add_argument("--summary", type=Path, help="print the tables of a results file and exit")
    args = p.parse_args(argv)
    if args.summary:
        print(tables(json.loads(args.summary.read_text())))
        return 0
    if args.quick:
        args.shapes, args.lengths, args.runs, args.min_available_gb = ["tiny"], [16], 1, 0.0
    if args.profile:
        args.runs = 1

    src = args.rlhfkit_src.resolve()
    commit = args.rlhfkit_commit or rlhfkit_commit(src)
    pythons = {
        ("rlhfkit", "grpo"): args.rlhfkit_python,
        ("rlhfkit", "ppo"): args.rlhfkit_python,
        ("trl", "grpo"): args.trl_grpo_python,
        ("trl", "ppo"): args.trl_ppo_python,
    }
    base_env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                    HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                    CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0", WANDB_DISABLED="true", TQDM_DISABLE="1")  # fmt: skip
    base_env.pop("PYTHONPATH", None)
    assets = {shape: build_assets(shape, args.layers, args.rlhfkit_python) for shape in args.shapes}
    for shape, meta in assets.items():
        print(f"[real-shapes] {shape}, {args.layers} layer(s): {meta['policy_parameters'] / 1e6:.1f}M parameters "
              f"({meta['policy_parameters'] * 4 / 1e9:.2f} GB fp32; embedding {meta['embedding_parameters'] / 1e6:.1f}M)",
              flush=True)  # fmt: skip

    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(exist_ok=True)
    kind = "real-shapes-profile" if args.profile else "real-shapes"
    out_path = RESULTS / f"{kind}-{stamp}.json"
    data = {
        "meta": {
            "rlhfkit_commit": commit,
            "rlhfkit_src": str(src),
            "layers": args.layers,
            "threads": args.threads,
            "profile": args.profile,
            "batch": BATCH,
            "argv": sys.argv[1:] if argv is None else argv,
            "shapes": {s: {k: v for k, v in m.items() if k != "paths"} for s, m in assets.items()},
        },
        "results": [],
    }
    for run in range(args.runs):
        for shape in args.shapes:
            for trainer in args.trainers:
                for length in args.lengths:
                    libraries = list(args.libraries) if run % 2 == 0 else list(reversed(args.libraries))
                    for library in libraries:  # alternate who goes first, as bench/run.py does
                        settings = (grpo_settings if trainer == "grpo" else ppo_settings)(length, library)
                        if library == "rlhfkit" and args.trim_cpu_heap:  # rlhfkit's memory-for-time setting
                            settings["trim_cpu_heap"] = True
                        spec = {"library": library, "trainer": trainer, "paths": assets[shape]["paths"],
                                "settings": settings, "threads": args.threads, "seed": run, "profile": args.profile}  # fmt: skip
                        env = dict(base_env)
                        if library == "rlhfkit":
                            env["PYTHONPATH"] = str(src)
                        if not wait_for_memory(args.min_available_gb, patience_s=1800):
                            result = {"failed": f"MemAvailable stayed under {args.min_available_gb} GB"}
                        else:
                            python = pythons[(library, trainer)]
                            cwd = str(src) if library == "rlhfkit" else str(RUNNER.parent)
                            result = run_one(python, spec, env, cwd, args.max_rss_gb, args.timeout)
                        result.update(library=library, trainer=trainer, shape=shape, length=length, run=run)
                        data["results"].append(result)
                        out_path.write_text(json.dumps(data, indent=2) + "\n")
                        peak = gb(result.get("peak_rss_mb", float("nan")))
                        status = result.get("failed") or (
                            f"ru_maxrss {gb(result['ru_maxrss_mb']):.2f} GB, runner's peak {peak:.2f} GB, "
                            f"train() {result['train_seconds']:.0f} s, completion lengths "
                            f"{result['completion_lengths']} ({result['completions']} completions)"
                        )
                        if "failed" not in result and result["completion_lengths"] != [length]:
                            result["failed"] = f"completions of {result['completion_lengths']} tokens, not {length}"
                        print(f"[real-shapes] run {run + 1}/{args.runs} {trainer} {shape} N={length} {library}: "
                              f"{status}", flush=True)  # fmt: skip
                        if "failed" in result and "log_tail" in result:
                            print(result["log_tail"][-1500:], flush=True)
    print()
    print(f"rlhfkit at {commit} ({src}); {args.layers} layer(s); {args.threads} thread(s)")
    print(tables(data))
    print(f"\n[real-shapes] results: {out_path}  (reproduce: {shlex.join([sys.executable, *sys.argv])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
