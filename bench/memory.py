"""Peak memory (RSS) of short PPO and GRPO runs, one row per trainer and mode: bench/README.md, "Memory".

A mode is a name and the flags it adds to the same command (``full``: none, full fine-tuning; ``lora``:
``--use_peft``); ``--mode NAME=FLAGS`` adds a row of your own, e.g. ``--mode "bf16=--bf16"``. Each run is a fresh
``python -m rlhfkit.cli ppo|grpo ...`` process, and its peak is the kernel's ``ru_maxrss`` for that process
(``os.wait4``): the run's own peak, imports, model loading, training and the final save included.

The model: a Llama built from a config with transformers (hidden 512, intermediate 1536, 8 layers, 8 heads, tied
embeddings; 27.3M parameters with the built-in task's 49-token character tokenizer), random weights (memory does
not depend on their values), fp32. PPO's reward model (and so the value model's initialisation) is a
sequence-classification model of the same config with one label, as the built-in task's reward model is. Prompts,
tokenizer and GRPO's rule-based rewards are the built-in task's (``rlhfkit.tasks.build_tiny``, test preset). The
assets are built once under ``bench/.cache/memory-*/``.

    .venv/bin/python bench/memory.py                        # PPO and GRPO, modes full and lora, 3 runs each
    .venv/bin/python bench/memory.py --trainers ppo --modes lora --runs 1
    .venv/bin/python bench/memory.py --modes full lora --mode "lora+bf16=--use_peft --bf16"
    .venv/bin/python bench/memory.py --engines multi_gpu deepspeed_zero2 deepspeed_zero3 fsdp2   # 2 processes each

``--engines`` launches each run with ``accelerate launch --config_file examples/accelerate_configs/ENGINE.yaml
--num_processes 2`` (fp32: ``--bf16 false``, DeepSpeed on its CPU accelerator without GPUs) instead of the modes;
the peak is then the largest process's (``ru_maxrss`` of the launcher covers its waited-for children), i.e. the
memory one device would need.

Results: a table on stdout and ``bench/results/memory-<time>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
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
MODEL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8)

# Flags each mode adds to the command. Add a row with --mode NAME=FLAGS, or here once it is worth keeping.
MODES = {
    "full": [],
    "lora": ["--use_peft"],
    "bf16": ["--bf16"],  # mixed precision: bf16 autocast over fp32 weights
    "gc": ["--gradient_checkpointing"],
}

# The same short run for every mode: enough steps that the optimizer state exists and one update follows it.
SETTINGS = {
    "ppo": {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "num_mini_batches": 1,
        "num_ppo_epochs": 1,
        "total_episodes": 16,  # 2 updates
        "local_rollout_forward_batch_size": 8,
        "response_length": 16,
        "learning_rate": 1e-5,
    },
    "grpo": {
        "per_device_train_batch_size": 8,  # 2 prompts x 4 completions
        "gradient_accumulation_steps": 1,
        "num_generations": 4,
        "max_steps": 2,
        "max_completion_length": 16,
        "beta": 0.04,  # a reference model: a frozen copy in full fine-tuning, the adapter-disabled policy with LoRA
        "learning_rate": 1e-5,
        "reward_funcs": "correctness",
    },
}
COMMON = {"num_sample_generations": 0, "save_steps": 0, "report_to": "none", "logging_steps": 1, "seed": 0}


def build_assets(root: Path) -> dict[str, str]:
    """The built-in task's tokenizer, prompts and task.json, plus a random causal LM and a 1-label
    sequence-classification model of MODEL's size (once; reused)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from rlhfkit.tasks import build_tiny

    tiny, sft, reward = root / "tiny", root / "sft", root / "reward"
    if not (tiny / "task.json").exists():
        build_tiny(str(tiny), seed=0, preset="test", log=lambda *a, **k: None)
    if not (reward / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(tiny / "tokenizer")
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            num_key_value_heads=MODEL["num_attention_heads"],
            max_position_embeddings=256,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
            **MODEL,
        )
        reward_config = copy.deepcopy(config)
        reward_config.num_labels = 1
        torch.manual_seed(0)
        for model, path in ((LlamaForCausalLM(config), sft), (LlamaForSequenceClassification(reward_config), reward)):
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
    return {"tokenizer": str(tiny / "tokenizer"), "prompts": str(tiny / "prompts"), "task": str(tiny),
            "sft": str(sft), "reward": str(reward)}  # fmt: skip


def parameter_count(path: str) -> int:
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), "numpy") as f:  # no torch in this process
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def command(trainer: str, paths: dict, flags: list[str], output_dir: str) -> list[str]:
    models = (
        ["--model_name_or_path", paths["sft"], "--reward_model_path", paths["reward"]]
        if trainer == "ppo"
        else ["--model_name_or_path", paths["sft"]]
    )
    settings = [f"--{k}={v}" for k, v in {**SETTINGS[trainer], **COMMON}.items()]
    data = ["--dataset_name", paths["prompts"], "--task", paths["task"], "--output_dir", output_dir]
    return [sys.executable, "-m", "rlhfkit.cli", trainer, *models, *data, *settings, *flags]


def launched(argv: list[str], engine: str, processes: int = 2) -> list[str]:
    """`argv` (python -m rlhfkit.cli ...) started by accelerate launch with examples/accelerate_configs/ENGINE.yaml,
    in fp32 so that every engine trains the same arithmetic."""
    config = ROOT / "examples" / "accelerate_configs" / f"{engine}.yaml"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    return [*launcher, "--num_processes", str(processes), *argv[1:], "--bf16", "false"]


def measure(argv: list[str], threads: int, timeout: float) -> dict:
    """Run `argv` in a fresh process; its peak RSS (MB, from ru_maxrss: the largest of it and its waited-for child
    processes) and wall time."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0", DS_ACCELERATOR="cpu",
               PYTHONPATH=str(ROOT))  # fmt: skip
    start = time.time()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                proc.kill()
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read()[-3000:]
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(map(shlex.quote, argv))}\n{tail}")
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "seconds": time.time() - start}  # Linux: ru_maxrss in KiB


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Peak RSS of short PPO/GRPO runs per mode (see bench/memory.py).")
    p.add_argument("--trainers", nargs="+", default=["ppo", "grpo"], choices=["ppo", "grpo"])
    p.add_argument("--modes", nargs="+", default=["full", "lora"], help=f"built-in modes: {', '.join(MODES)}")
    p.add_argument("--mode", action="append", default=[], metavar="NAME=FLAGS", help="a mode of your own")
    p.add_argument(
        "--engines", nargs="+", default=[], metavar="CONFIG",
        help="instead of the modes: accelerate configs (examples/accelerate_configs/CONFIG.yaml), 2 processes each",
    )  # fmt: skip
    p.add_argument("--runs", type=int, default=3, help="runs per trainer and mode (the table shows the median)")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per run (speed only, not memory)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed")
    p.add_argument("--assets-only", type=Path, help=argparse.SUPPRESS)  # build_assets(PATH) in a child process
    args = p.parse_args(argv)
    if args.assets_only:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(build_assets(args.assets_only)))
        return 0
    modes = {name: MODES[name] for name in args.modes}
    for spec in args.mode:
        name, _, flags = spec.partition("=")
        modes[name] = shlex.split(flags)
    if args.engines:
        modes = {engine: [] for engine in args.engines}

    # The assets are built (or found) by a child process: this one must stay small, since Linux carries a parent's
    # peak RSS into the ru_maxrss of every process it starts (torch and the models here would floor every reading).
    key = "-".join(f"{v}" for v in MODEL.values())
    root = BENCH_DIR / ".cache" / f"memory-llama-{key}"
    built = subprocess.run([sys.executable, __file__, "--assets-only", str(root)], capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"building the assets failed:\n{built.stderr[-3000:]}")
    paths = json.loads(built.stdout.splitlines()[-1])
    params = parameter_count(paths["sft"])
    print(f"[memory] model: Llama {MODEL}, {params / 1e6:.1f}M parameters (fp32: {params * 4 / 2**20:.0f} MB)")

    results = []
    for run in range(args.runs):  # modes alternate within each round, so slow drifts hit every mode alike
        for trainer in args.trainers:
            for name, flags in modes.items():
                with tempfile.TemporaryDirectory() as tmp:
                    argv_ = command(trainer, paths, flags, os.path.join(tmp, "run"))
                    if args.engines:
                        argv_ = launched(argv_, name)
                    result = measure(argv_, args.threads, args.timeout)
                result.update(trainer=trainer, mode=name, flags=flags, run=run)
                results.append(result)
                print(f"[memory] {trainer} {name} run {run + 1}: {result['peak_rss_mb']:.0f} MB, "
                      f"{result['seconds']:.0f} s", flush=True)  # fmt: skip

    print()
    print(f"Peak RSS (MB), median of {args.runs} run(s) each; model {params / 1e6:.1f}M parameters, fp32.")
    print()
    print(f"| trainer | mode | flags | peak RSS (MB) | runs (MB) | vs {next(iter(modes))} | wall time (s) |")
    print("|---|---|---|---|---|---|---|")
    for trainer in args.trainers:
        medians = {}
        for name, flags in modes.items():
            rows = [r for r in results if r["trainer"] == trainer and r["mode"] == name]
            medians[name] = statistics.median(r["peak_rss_mb"] for r in rows)
            each = ", ".join(f"{r['peak_rss_mb']:.0f}" for r in rows)
            first = next(iter(medians))  # full fine-tuning, or the first engine
            ratio = f"{medians[name] / medians[first]:.2f}x"
            seconds = statistics.median(r["seconds"] for r in rows)
            shown = " ".join(flags) or "(none)"
            print(f"| {trainer} | {name} | `{shown}` | {medians[name]:.0f} | {each} | {ratio} | {seconds:.0f} |")

    out = BENCH_DIR / "results"
    out.mkdir(exist_ok=True)
    path = out / f"memory-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"model": MODEL, "parameters": params, "settings": SETTINGS, "common": COMMON, "threads": args.threads,
            "engines": args.engines}  # fmt: skip
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"\n[memory] results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
