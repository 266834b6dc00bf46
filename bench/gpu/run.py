"""GPU bench (issue 39, item 4): rlhfkit GRPO, TRL 1.16 GRPO and rlhfkit PPO at real model shapes, bf16, one table.

    python3 bench/gpu/run.py --device cuda --out DIR     # the GPU plan: Qwen2.5-0.5B at full depth, N = 512 and 1024
    python3 bench/gpu/run.py --device cpu --out DIR      # the CPU rehearsal: the tiny shape, 2 layers, N = 16
    python3 bench/gpu/run.py --summary DIR/gpu-bench.json  # print a results file's table again

bench/gpu/run.sh runs the GPU plan in one call of the device tool (bench/gpu/README.md). Per shape, the models are
built on the machine from their configs (bench/real_shapes_assets.py: the public configs' vocabulary and widths,
``num_hidden_layers`` from FULL_DEPTH below, random weights, nothing downloaded). Per shape, completion length N and
arm, a fresh process of this script (``--arm``) builds the arm's trainer with the same settings as every other arm
(bench/real_shapes.py's ``grpo_settings`` / ``ppo_settings``, and bench/runners/real_shapes_runner.py's model
loading, reward and trainer construction), with ``bf16`` (accelerate's bfloat16 autocast over float32 weights, both
libraries' meaning of the flag), and trains ``--steps`` steps:

* ``rlhfkit-grpo``  rlhfkit's GRPOTrainer: 8 completions of one prompt per step, a reference model (beta 0.04);
* ``trl-grpo``      TRL's GRPOTrainer (1.16, no vLLM) with the same settings; the process never imports rlhfkit;
* ``rlhfkit-ppo``   rlhfkit's PPOTrainer: 8 rollouts per update, reference, value and reward model of the same
                    config, one PPO epoch of one mini-batch.

Every completion is exactly N tokens in every arm (the tokenizer's EOS and PAD ids lie beyond the LM head), checked.
The timing is bench/runners/probe.py's instrumentation, identical for both libraries, split into steps: a step ends at
its last optimizer step, the next begins with its generation. Reported per arm, from the LAST step (the first one
pays for CUDA/cuBLAS initialisation, the allocator's growth and the AdamW moments' creation):

* generation tokens/s   completion tokens generated in the step / seconds inside generation (the decoding loop);
* training tokens/s     B x (prompt + N) tokens through the trained model(s) / seconds of the training phase:
                        gradient-enabled forwards, backward, gradient clipping and optimizer step;
* step time             wall seconds from the previous step's end to this step's end (everything in between);
* peak memory           torch.cuda.max_memory_allocated of the whole run (loading, both steps); on the CPU peak RSS;
* training MFU          3 x forward FLOPs per token (rlhfkit.perf.forward_flops_per_token: the policy's, plus the
                        value model's for PPO) x training tokens / (training seconds x the device's dense bf16 peak,
                        rlhfkit.perf.device_peak_flops); n/a on the CPU.

A budget (``--budget-s``, default 480 s on cuda) keeps the plan inside one 10-minute device command: an arm whose
estimated run (from the arms already run, scaled by N) would end past it is skipped and the table says so; an arm
still running at the budget is stopped. gpu-bench.json and gpu-bench.md are rewritten after every arm, so whatever ran
comes back even if the command is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parent
BENCH_DIR = GPU_DIR.parent
ROOT = BENCH_DIR.parent
RUNNERS = BENCH_DIR / "runners"
sys.path[:0] = [str(BENCH_DIR), str(RUNNERS)]

import real_shapes  # noqa: E402  (grpo_settings, ppo_settings: the real-shape bench's settings)
from real_shapes_assets import PROMPT_TOKENS, SHAPES  # noqa: E402

PROCESS_START = time.time()
TRL_PIN = "1.16.0"
# num_hidden_layers of the public models (config.json on the hub); real_shapes_assets.SHAPES holds the rest.
FULL_DEPTH = {"qwen2.5-0.5b": 24, "qwen3-1.7b": 28, "llama-3.2-1b": 16}
ARMS = {"rlhfkit-grpo": ("rlhfkit", "grpo"), "trl-grpo": ("trl", "grpo"), "rlhfkit-ppo": ("rlhfkit", "ppo")}
PLANS = {  # per device: what runs by default
    "cuda": {"shapes": ["qwen2.5-0.5b"], "layers": None, "lengths": [512, 1024], "budget_s": 480.0, "threads": 0},
    "cpu": {"shapes": ["tiny"], "layers": 2, "lengths": [16], "budget_s": 0.0, "threads": 2},
}
GENERATIONS = 8  # completions per prompt (GRPO), rollouts per prompt batch (PPO)


# ---------------------------------------------------------------------------------------------------------------
# settings: the real-shape bench's, for `steps` steps of `prompts` x 8 sequences of N tokens, in bf16
def arm_settings(arm: str, length: int, steps: int, prompts: int, precision: str, device: str) -> dict:
    library, trainer = ARMS[arm]
    batch = GENERATIONS * prompts
    bf16 = precision == "bf16"
    if trainer == "grpo":
        settings = real_shapes.grpo_settings(length, library)
        settings.update(per_device_train_batch_size=batch, num_generations=GENERATIONS, max_steps=steps)
    else:
        settings = real_shapes.ppo_settings(length, library)
        settings.update(
            per_device_train_batch_size=batch, local_rollout_forward_batch_size=batch, total_episodes=batch * steps
        )
    settings.update(bf16=bf16, fp16=False, logging_steps=1, report_to="none")
    if device == "cpu" and library == "trl":  # transformers refuses bf16 without a GPU unless told it is on the CPU
        settings["use_cpu"] = True
    return settings


# ---------------------------------------------------------------------------------------------------------------
# the child processes: --preflight (versions, device, FLOPs per token) and --arm (one trainer, timed by step)
def preflight(spec: dict) -> dict:
    """Import everything the arms need (fail fast, before any arm runs), name the device and its peak, and count
    each shape's forward FLOPs per token (rlhfkit.perf, on meta-device models built from the same configs)."""
    import importlib.metadata as md

    import torch

    out: dict = {"python": platform.python_version(), "torch": torch.__version__}
    for name in (
        "transformers",
        "accelerate",
        "datasets",
        "huggingface_hub",
        "tokenizers",
        "safetensors",
        "pyarrow",
        "trl",
        "numpy",
    ):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    import datasets  # noqa: F401
    import transformers
    import trl  # noqa: F401

    import rlhfkit
    from rlhfkit.trainers.grpo import GRPOTrainer  # noqa: F401
    from rlhfkit.trainers.ppo import PPOTrainer  # noqa: F401

    out["rlhfkit"] = rlhfkit.__version__
    out["rlhfkit_file"] = rlhfkit.__file__
    device = torch.device(spec["device"])
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out["device_name"] = torch.cuda.get_device_name(device)
        out["device_detail"] = (
            f"compute capability {props.major}.{props.minor}, {props.total_memory / 1e9:.1f} GB, "
            f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda}"
        )
    else:
        out["device_name"] = platform.processor() or platform.machine()
        out["device_detail"] = f"{os.cpu_count()} CPUs visible"
    try:
        from rlhfkit import perf
    except ImportError as e:  # rlhfkit without perf.py: the table still comes, without MFU
        out["perf_error"] = repr(e)
        return out
    dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
    out["peak_flops"] = perf.device_peak_flops(device, dtype)
    from real_shapes_assets import make_config
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    transformers.logging.set_verbosity_error()  # make_config's EOS beyond the vocabulary is deliberate
    flops = {}
    for shape, layers in spec["shapes"].items():
        with torch.device("meta"):
            policy = AutoModelForCausalLM.from_config(make_config(shape, layers))
            value = AutoModelForSequenceClassification.from_config(make_config(shape, layers, num_labels=1))
        for length in spec["lengths"]:
            tokens = PROMPT_TOKENS + length
            context = (tokens + 1) / 2  # a causal sequence's mean attended keys
            flops[f"{shape}/{length}"] = {
                "tokens_per_sequence": tokens,
                "policy_forward_flops_per_token": perf.forward_flops_per_token(policy, context),
                "value_forward_flops_per_token": perf.forward_flops_per_token(value, context),
                "policy_parameters": sum(p.numel() for p in policy.parameters()),
            }
    out["flops"] = flops
    return out


def step_probe():
    """bench/runners/probe.py's Probe (the same instrumentation for both libraries), with a mark at the start of
    every outermost generation call and at the end of every optimizer step, so the totals can be cut into steps."""
    from probe import Probe

    class StepProbe(Probe):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[str, float, dict, int]] = []

        def mark(self, kind: str) -> None:
            self.events.append((kind, self._now(), dict(self.seconds), int(self.generated_tokens)))

        def _timed(self, phase, fn, *args, _part=None, **kwargs):
            if phase == "generation":
                self.mark("generation")
            return super()._timed(phase, fn, *args, _part=_part, **kwargs)

        def install(self):
            super().install()
            from torch.optim.optimizer import register_optimizer_step_post_hook

            def after_step(optimizer, args, kwargs):  # runs after the Probe's own post-hook (registration order)
                if self.enabled and not self._busy:
                    self.mark("optimizer")

            register_optimizer_step_post_hook(after_step)
            return self

        def steps(self) -> list[dict]:
            """One row per training step: a step ends at the last optimizer step before the next step's first
            generation (or the run's last optimizer step) and begins where the previous one ended."""
            ends, last_opt, generated = [], None, False
            for event in self.events[1:]:
                if event[0] == "generation":
                    if generated and last_opt is not None:
                        ends.append(last_opt)
                        last_opt = None
                    generated = True
                elif event[0] == "optimizer":
                    last_opt = event
            if last_opt is not None:
                ends.append(last_opt)
            rows, prev = [], self.events[0]
            for end in ends:
                phases = {
                    p: end[2].get(p, 0.0) - prev[2].get(p, 0.0) for p in ("generation", "scoring", "optimization")
                }
                seconds = end[1] - prev[1]
                rows.append(
                    {
                        "seconds": round(seconds, 4),
                        **{f"{p}_s": round(v, 4) for p, v in phases.items()},
                        "other_s": round(seconds - sum(phases.values()), 4),
                        "generated_tokens": end[3] - prev[3],
                    }
                )
                prev = end
            return rows

    return StepProbe()


def arm(spec: dict) -> dict:
    import torch

    if spec["threads"]:
        torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(int(spec["seed"]))
    probe = step_probe().install()  # before the trainer exists, as bench/runners do
    import real_shapes_runner as R
    from datasets import load_from_disk
    from probe import peak_rss_mb

    library, kind = spec["library"], spec["trainer"]
    tok, models = R.load_models(spec["paths"], kind)  # float32 weights, as real_shapes_runner loads them
    dataset = load_from_disk(spec["paths"]["prompts"])
    build = R.build_rlhfkit if library == "rlhfkit" else R.build_trl
    trainer = build(
        {"trainer": kind, "settings": spec["settings"], "output_dir": spec["output_dir"]}, tok, models, dataset
    )
    del models
    if kind == "ppo":
        R.count_ppo_completions(library, trainer)
    if library == "rlhfkit":
        from rlhfkit_runner import wrap_generation

        wrap_generation(probe)  # rlhfkit's own decoding loop (transformers' generate is wrapped by the Probe)
    cuda = torch.cuda.is_available()
    resets = keep_peak_across_resets(torch) if cuda else None
    setup_s = time.time() - PROCESS_START
    probe.enabled = True
    probe.mark("start")
    t0 = time.perf_counter()
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    probe.enabled = False
    other = "trl" if library == "rlhfkit" else "rlhfkit"
    assert other not in sys.modules, f"the {library} arm imported {other}"
    lib = __import__(library)
    result = {
        "library": library,
        "version": lib.__version__,
        "trainer_class": f"{type(trainer).__module__}.{type(trainer).__qualname__}",
        "modules": sorted(m for m in ("trl", "rlhfkit") if m in sys.modules),
        "device": "cuda" if cuda else "cpu",
        "device_name": torch.cuda.get_device_name() if cuda else platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "accelerator_device": str(trainer.accelerator.device),
        "steps": probe.steps(),
        "train_seconds": round(train_s, 3),
        "setup_seconds": round(setup_s, 3),
        "completion_lengths": sorted(set(int(n) for n in R.COMPLETION_LENGTHS)),
        "completions": len(R.COMPLETION_LENGTHS),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    if library == "rlhfkit":  # rlhfkit's own perf/ and time/ metrics of the last step, beside the bench's
        result["rlhfkit_metrics"] = own_metrics(spec["output_dir"])
    if cuda:
        peak = max(resets["peak"], torch.cuda.max_memory_allocated())
        result["peak_cuda_allocated_mb"] = round(peak / 2**20, 1)
        result["peak_resets_seen"] = resets["count"]
        result["peak_cuda_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    return result


def keep_peak_across_resets(torch) -> dict:
    """The run's peak must survive anyone resetting torch's peak counter (rlhfkit measures each phase's peak that
    way unless RLHFKIT_PHASE_MEMORY=0, which child_env sets): the peak so far is kept before every reset."""
    seen = {"peak": 0, "count": 0}
    original = torch.cuda.reset_peak_memory_stats

    def reset_peak_memory_stats(device=None):
        seen["peak"] = max(seen["peak"], torch.cuda.max_memory_allocated(device))
        seen["count"] += 1
        return original(device)

    torch.cuda.reset_peak_memory_stats = reset_peak_memory_stats
    return seen


def own_metrics(output_dir: str) -> dict:
    """The perf/* and time/* values of the last row of rlhfkit's metrics.jsonl that has any."""
    path = Path(output_dir) / "metrics.jsonl"
    last: dict = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            picked = {k: v for k, v in row.items() if k.startswith(("perf/", "time/")) and isinstance(v, (int, float))}
            last = picked or last
    return last


def child_main(kind: str, spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out = preflight(spec) if kind == "preflight" else arm(spec)
    Path(spec["result"]).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "flops"}))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# the driver (standard library only: it holds no models and no CUDA context)
def child_env(device: str, threads: int, library: str | None) -> dict:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0",
        WANDB_DISABLED="true",
        WANDB_MODE="disabled",
        TQDM_DISABLE="1",
        PYTHONUNBUFFERED="1",
        RLHFKIT_PHASE_MEMORY="0",  # rlhfkit's per-phase peaks reset the counter the run's peak is read from
    )
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    if library != "trl":  # rlhfkit from this checkout; TRL's arm gets no path to it (and asserts it never imports it)
        paths.insert(0, str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def scratch_dir(device: str) -> str | None:
    """Where the arms' output directories go: on the GPU machine a RAM disk (/dev/shm) when it has room, so that the
    checkpoint rlhfkit's train() writes after its last step (weights and AdamW moments, 6-12 GB in fp32 at 0.5B) costs
    seconds of the budget rather than the disk's time; else the temporary directory."""
    if device == "cuda" and os.path.isdir("/dev/shm"):
        try:
            if shutil.disk_usage("/dev/shm").free > 40e9:
                return "/dev/shm"
        except OSError:
            pass
    return None


def run_child(
    kind: str, spec: dict, env: dict, cwd: str, timeout: float | None, log, scratch: str | None = None
) -> dict:
    """This script in a fresh process (`--preflight` or `--arm`): its result, or why it failed; its output to log."""
    with tempfile.TemporaryDirectory(prefix="gpu-bench-", dir=scratch) as tmp:
        spec = dict(spec, result=os.path.join(tmp, "result.json"))
        spec.setdefault("output_dir", os.path.join(tmp, "run"))
        spec_path = os.path.join(tmp, "spec.json")
        Path(spec_path).write_text(json.dumps(spec))
        argv = [sys.executable, str(Path(__file__).resolve()), f"--{kind}", spec_path]
        start = time.time()
        log.write(f"\n===== {kind} {spec.get('arm', '')} {spec.get('shape', '')} N={spec.get('length', '')}: "
                  f"{shlex.join(argv)}\n")  # fmt: skip
        log.flush()
        with tempfile.TemporaryFile("w+") as out:
            try:
                limit = None if timeout is None else max(timeout, 1.0)
                proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=limit)
                failed = None if proc.returncode == 0 else f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:
                failed = f"stopped at the budget ({timeout:.0f} s)"
            out.seek(0)
            text = out.read()
        log.write(text)
        log.flush()
        wall = round(time.time() - start, 1)
        if failed is None and os.path.exists(spec["result"]):
            return dict(json.loads(Path(spec["result"]).read_text()), wall_seconds=wall)
        return {"failed": failed or "no result written", "wall_seconds": wall, "log_tail": text[-3000:]}


def build_assets(shape: str, layers: int, env: dict, log) -> dict:
    """bench/real_shapes_assets.py in a child process (cached under bench/.cache/real-shapes/)."""
    argv = [sys.executable, str(BENCH_DIR / "real_shapes_assets.py"), shape, "--layers", str(layers)]
    start = time.time()
    built = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(ROOT))
    log.write(f"\n===== assets {shape} L{layers} ({time.time() - start:.1f} s)\n{built.stderr[-3000:]}\n")
    if built.returncode != 0:
        raise RuntimeError(f"building the {shape} assets failed:\n{built.stderr[-3000:]}")
    meta = json.loads(built.stdout.strip().splitlines()[-1])
    meta["build_seconds"] = round(time.time() - start, 1)
    return meta


def derive(result: dict, meta: dict) -> dict:
    """The table's numbers for one arm, from its last (warm) step."""
    if "failed" in result or "skipped" in result or not result.get("steps"):
        return {}
    last = result["steps"][-1]
    batch, length = meta["batch"], result["length"]
    flops = (meta["preflight"].get("flops") or {}).get(f"{result['shape']}/{length}")
    tokens = batch * (PROMPT_TOKENS + length)  # through the trained model(s) in the step's training phase
    out = {
        "generation_tokens_per_s": last["generated_tokens"] / last["generation_s"]
        if last["generation_s"] > 0
        else None,
        "training_tokens_per_s": tokens / last["optimization_s"] if last["optimization_s"] > 0 else None,
        "training_tokens": tokens,
        "step_seconds": last["seconds"],
        "peak_memory_gb": (result.get("peak_cuda_allocated_mb") or result["peak_rss_mb"]) * 2**20 / 1e9,
        "peak_memory_kind": "cuda max_memory_allocated" if "peak_cuda_allocated_mb" in result else "peak RSS",
        "training_mfu": None,
    }
    peak = meta["preflight"].get("peak_flops")
    if flops and peak and last["optimization_s"] > 0:
        per_token = flops["policy_forward_flops_per_token"]
        if result["trainer"] == "ppo":  # the value model is trained beside the policy, on the same tokens
            per_token += flops["value_forward_flops_per_token"]
        out["training_flops"] = 3 * per_token * tokens
        out["training_mfu"] = out["training_flops"] / (last["optimization_s"] * peak)
    return out


def fmt(value, spec: str, none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def rate(value) -> str:
    """Tokens/s: whole numbers from 100 up, three significant digits under (the CPU rehearsal's)."""
    return "n/a" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def markdown(data: dict) -> str:
    meta, results = data["meta"], data["results"]
    pre = meta.get("preflight", {})
    lines = [f"# GPU bench: rlhfkit vs TRL {pre.get('trl') or TRL_PIN} (bench/gpu/run.py)", ""]
    peak = pre.get("peak_flops")
    peak_text = f"{peak / 1e12:.0f} TFLOP/s dense {meta['precision']} (rlhfkit.perf)" if peak else "unknown: MFU n/a"
    versions = ", ".join(
        f"{name} {pre.get(key)}"
        for name, key in (("torch", "torch"), ("transformers", "transformers"), ("accelerate", "accelerate"),
                          ("datasets", "datasets"), ("huggingface_hub", "huggingface_hub"), ("TRL", "trl"))
    )  # fmt: skip
    lines.append(
        f"Device: **{pre.get('device_name', '?')}** ({meta['device']}; {pre.get('device_detail', '')}); peak "
        f"{peak_text}. {versions}; rlhfkit {pre.get('rlhfkit')} at {meta['rlhfkit_commit']}; Python "
        f"{pre.get('python')}. Measured {meta['started']}, whole plan {meta.get('plan_seconds', '?')} s."
    )
    depths = ", ".join(f"{shape} at {n} layers" for shape, n in meta["layers"].items())
    lines.append("")
    lines.append(
        f"Settings: {meta['precision']} (autocast over float32 weights) on both libraries; per step "
        f"{meta['batch']} sequences = {meta['prompts']} prompt(s) x {GENERATIONS} of {PROMPT_TOKENS} prompt tokens + N "
        f"completion tokens, every completion exactly N tokens (checked); GRPO with a reference model (beta 0.04), "
        f"PPO with reference, value and reward models; {meta['steps']} steps per run, the last one reported (warm). "
        f"Random-init models of each shape's config: {depths}."
    )
    lines.append("")
    lines.append(
        "| shape | N | arm | library | generation tok/s | training tok/s | step (s) | generation (s) | scoring (s) "
        "| training (s) | peak memory (GB) | training MFU |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        name = f"{r['library']} {r.get('version', '')}".strip()
        head = f"| {r['shape']} | {r['length']} | {r['arm']} | {name} |"
        if "failed" in r or "skipped" in r:
            lines.append(f"{head} {r.get('failed') or r.get('skipped')} | | | | | | | |")
            continue
        d, last = r["derived"], r["steps"][-1]
        mfu = "n/a" if d["training_mfu"] is None else f"{100 * d['training_mfu']:.1f}%"
        lines.append(
            f"{head} {rate(d['generation_tokens_per_s'])} | {rate(d['training_tokens_per_s'])} | "
            f"{d['step_seconds']:.2f} | {last['generation_s']:.2f} | {last['scoring_s']:.2f} | "
            f"{last['optimization_s']:.2f} | {d['peak_memory_gb']:.2f} | {mfu} |"
        )
    ratios = []
    for shape in dict.fromkeys(r["shape"] for r in results):
        for length in dict.fromkeys(r["length"] for r in results):
            pair = {r["arm"]: r for r in results if (r["shape"], r["length"]) == (shape, length) and r.get("derived")}
            if "rlhfkit-grpo" in pair and "trl-grpo" in pair:
                a, b = pair["rlhfkit-grpo"]["derived"], pair["trl-grpo"]["derived"]

                def ratio(key, a=a, b=b):
                    return f"{a[key] / b[key]:.2f}x" if a.get(key) and b.get(key) else "n/a"

                ratios.append(
                    f"| {shape} | {length} | {ratio('generation_tokens_per_s')} | {ratio('training_tokens_per_s')} | "
                    f"{ratio('step_seconds')} | {ratio('peak_memory_gb')} |"
                )
    if ratios:
        lines += [
            "",
            "GRPO, rlhfkit / TRL (tokens/s: above 1 is faster; step time and memory: below 1 is better):",
            "",
        ]
        lines.append("| shape | N | generation tok/s | training tok/s | step time | peak memory |")
        lines.append("|---|---|---|---|---|---|")
        lines += ratios
    lines += [
        "",
        "generation tok/s: completion tokens / seconds in the decoding loop; training tok/s: sequences x (prompt + N) "
        "tokens / seconds of the gradient-enabled forwards, backward, clipping and optimizer step; scoring: "
        "gradient-free forwards outside generation (reference; PPO's value and reward model too); step: wall time "
        "from the previous step's end; peak memory: "
        + (
            "torch.cuda.max_memory_allocated over the run, GB = 10^9 bytes; "
            if meta["device"] == "cuda"
            else "peak RSS of the process (VmHWM), GB = 10^9 bytes; "
        )  # fmt: skip
        + "training MFU: 3 x forward FLOPs per token (rlhfkit.perf; policy, plus the value model for PPO) x training "
        "tokens / (training seconds x peak).",
    ]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, data: dict) -> str:
    (out_dir / "gpu-bench.json").write_text(json.dumps(data, indent=2) + "\n")
    text = markdown(data)
    (out_dir / "gpu-bench.md").write_text(text)
    return text


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "rlhfkit", "bench"], capture_output=True, text=True
        )
        if head.returncode == 0:
            return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")
    except OSError:
        pass
    return os.environ.get("RLHFKIT_COMMIT", "unknown (no git here: set RLHFKIT_COMMIT)")


def estimate(done: list[dict], length: int) -> float:
    """Seconds an arm at `length` should take, from those run so far: setup as measured, training scaled by N."""
    guesses = [
        (r["wall_seconds"] - r["train_seconds"]) + r["train_seconds"] * length / r["length"]
        for r in done
        if "train_seconds" in r
    ]
    return max(guesses, default=0.0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--arm"], ["--preflight"]):
        return child_main(argv[0][2:], argv[1])
    p = argparse.ArgumentParser(
        description="rlhfkit vs TRL 1.16 GRPO and rlhfkit PPO at real shapes, bf16: one table."
    )
    p.add_argument("--device", choices=sorted(PLANS), default="cuda")
    p.add_argument("--out", type=Path, help="writes gpu-bench.json, gpu-bench.md and gpu-bench.log there")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="default: cuda qwen2.5-0.5b; cpu tiny")
    p.add_argument("--layers", type=int, help="decoder layers of every shape (default: cuda the full depth; cpu 2)")
    p.add_argument("--lengths", nargs="+", type=int, help="completion lengths N (default: cuda 512 1024; cpu 16)")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--steps", type=int, default=2, help="training steps per arm; the last is reported (default 2)")
    p.add_argument("--prompts", type=int, default=1, help=f"prompts per step, each with {GENERATIONS} completions")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--threads", type=int, help="torch threads per arm (default: cuda torch's own; cpu 2)")
    p.add_argument(
        "--budget-s", type=float, help="skip or stop arms past this many seconds (default: cuda 480; 0: none)"
    )
    p.add_argument("--summary", type=Path, help="print the table of a gpu-bench.json and exit")
    args = p.parse_args(argv)
    if args.summary:
        print(markdown(json.loads(args.summary.read_text())), end="")
        return 0
    if args.out is None:
        p.error("--out DIR is required")
    plan = PLANS[args.device]
    shapes = args.shapes or plan["shapes"]
    lengths = args.lengths or plan["lengths"]
    threads = plan["threads"] if args.threads is None else args.threads
    budget = plan["budget_s"] if args.budget_s is None else args.budget_s
    layers = {s: args.layers or plan["layers"] or FULL_DEPTH.get(s, 2) for s in shapes}
    if args.steps < 2:
        print("[gpu-bench] --steps 1: the reported step is the first one, warm-up included", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "gpu-bench.log", "w")  # noqa: SIM115 (open for the whole plan)
    started = time.time()

    def remaining() -> float | None:
        return None if not budget else budget - (time.time() - started)

    data = {
        "meta": {
            "device": args.device,
            "precision": args.precision,
            "steps": args.steps,
            "prompts": args.prompts,
            "batch": GENERATIONS * args.prompts,
            "layers": layers,
            "lengths": lengths,
            "arms": args.arms,
            "threads": threads,
            "budget_s": budget,
            "rlhfkit_commit": git_commit(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "host": platform.node(),
            "argv": argv,
        },
        "results": [],
    }
    env = child_env(args.device, threads, "rlhfkit")
    spec = {"device": args.device, "precision": args.precision, "shapes": layers, "lengths": lengths}
    pre = run_child("preflight", spec, env, str(ROOT), remaining(), log)
    data["meta"]["preflight"] = pre
    print(f"[gpu-bench] preflight ({pre['wall_seconds']} s): "
          + json.dumps({k: v for k, v in pre.items() if k not in ("flops", "log_tail")}), flush=True)  # fmt: skip
    if "failed" in pre:
        print(pre["log_tail"], flush=True)
        write(args.out, data)
        return 1
    if pre.get("trl") != TRL_PIN:
        print(f"[gpu-bench] warning: TRL {pre.get('trl')} is installed, not {TRL_PIN}", flush=True)
    for shape in shapes:
        try:
            assets = build_assets(shape, layers[shape], child_env(args.device, threads, None), log)
        except (RuntimeError, ValueError, IndexError) as e:  # the table says so; the next shape may still run
            data["results"] += [
                {"arm": a, "library": ARMS[a][0], "trainer": ARMS[a][1], "shape": shape, "length": n,
                 "failed": "assets not built", "log_tail": str(e)[-3000:], "derived": {}}
                for n in lengths for a in args.arms
            ]  # fmt: skip
            write(args.out, data)
            print(f"[gpu-bench] {shape}: {e}", flush=True)
            continue
        data["meta"].setdefault("assets", {})[shape] = {k: v for k, v in assets.items() if k != "paths"}
        print(f"[gpu-bench] {shape} at {layers[shape]} layers: {assets['policy_parameters'] / 1e6:.1f}M parameters, "
              f"built in {assets['build_seconds']} s", flush=True)  # fmt: skip
        for length in lengths:
            for name in args.arms:
                library, trainer = ARMS[name]
                row = {"arm": name, "library": library, "trainer": trainer, "shape": shape, "length": length}
                left = remaining()
                guess = estimate(data["results"], length)
                if left is not None and (guess > left or left < 10):
                    row["skipped"] = f"skipped: ~{guess:.0f} s expected, {max(left, 0):.0f} s of the budget left"
                else:
                    arm_spec = {
                        "arm": name,
                        "library": library,
                        "trainer": trainer,
                        "shape": shape,
                        "length": length,
                        "paths": assets["paths"],
                        "settings": arm_settings(name, length, args.steps, args.prompts, args.precision, args.device),
                        "threads": threads,
                        "seed": 0,
                    }
                    cwd = str(ROOT) if library == "rlhfkit" else tempfile.gettempdir()
                    arm_env = child_env(args.device, threads, library)
                    result = run_child("arm", arm_spec, arm_env, cwd, left, log, scratch_dir(args.device))
                    row.update(result)
                    if "failed" not in row:
                        if row["completion_lengths"] != [length]:
                            row["failed"] = f"completions of {row['completion_lengths']} tokens, not {length}"
                        elif len(row["steps"]) != args.steps:
                            row["failed"] = f"{len(row['steps'])} steps found, {args.steps} asked for"
                        elif (library == "trl") != row["trainer_class"].startswith("trl."):
                            row["failed"] = f"the {name} arm ran {row['trainer_class']}"
                        elif not row["accelerator_device"].startswith(args.device):
                            row["failed"] = f"the {name} arm trained on {row['accelerator_device']}"
                row["derived"] = derive(row, data["meta"])
                data["results"].append(row)
                data["meta"]["plan_seconds"] = round(time.time() - started, 1)
                write(args.out, data)
                d = row["derived"]
                status = (
                    row.get("failed")
                    or row.get("skipped")
                    or (
                        f"step {d['step_seconds']:.2f} s, generation {rate(d['generation_tokens_per_s'])} tok/s, "
                        f"training {rate(d['training_tokens_per_s'])} tok/s, peak {d['peak_memory_gb']:.2f} GB, "
                        f"process {row['wall_seconds']} s"
                    )
                )
                print(f"[gpu-bench] {shape} N={length} {name}: {status}", flush=True)
                if "log_tail" in row:
                    print(row["log_tail"][-2000:], flush=True)
    log.close()
    data["meta"]["plan_seconds"] = round(time.time() - started, 1)
    text = write(args.out, data)
    print()
    print(text, end="")
    failed = [r for r in data["results"] if "failed" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
