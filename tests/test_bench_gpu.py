"""bench/gpu/run.py: the GPU bench's CPU rehearsal end to end, and its step split and MFU."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu" / "run.py"
ARMS = {"rlhfkit-grpo": "rlhfkit", "trl-grpo": "trl", "rlhfkit-ppo": "rlhfkit"}


@pytest.fixture
def bench_gpu():
    """bench/gpu/run.py as a module; the bench's sys.path entries and modules are taken back afterwards."""
    path, modules = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location("bench_gpu_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_steps_split_at_the_last_optimizer_step_before_the_next_generation(bench_gpu):
    probe = bench_gpu.step_probe()
    events = [
        ("start", 0.0, {}, 0),
        ("generation", 0.1, {}, 0),
        ("optimizer", 5.0, {"generation": 3.0, "scoring": 0.5, "optimization": 1.0}, 64),
        ("optimizer", 5.5, {"generation": 3.0, "scoring": 0.5, "optimization": 1.4}, 64),  # a second optimizer
        ("generation", 6.0, {"generation": 3.0, "scoring": 0.5, "optimization": 1.4}, 64),
        ("generation", 7.0, {"generation": 3.8, "scoring": 0.5, "optimization": 1.4}, 96),  # a second chunk
        ("optimizer", 9.5, {"generation": 4.6, "scoring": 0.8, "optimization": 2.0}, 128),
    ]
    probe.events = events
    first, last = probe.steps()
    assert first == {
        "seconds": 5.5,
        "generation_s": 3.0,
        "scoring_s": 0.5,
        "optimization_s": 1.4,
        "other_s": 0.6,
        "generated_tokens": 64,
    }
    assert last["seconds"] == 4.0 and last["generated_tokens"] == 64
    assert last["generation_s"] == pytest.approx(1.6) and last["optimization_s"] == pytest.approx(0.6)
    assert last["other_s"] == pytest.approx(4.0 - 1.6 - 0.3 - 0.6)


def test_training_mfu_is_three_forwards_of_flops_over_seconds_and_peak(bench_gpu):
    meta = {
        "batch": 8,
        "preflight": {
            "peak_flops": 1e15,
            "flops": {"s/100": {"policy_forward_flops_per_token": 1e9, "value_forward_flops_per_token": 5e8}},
        },
    }
    step = {"seconds": 3.0, "generation_s": 2.0, "scoring_s": 0.2, "optimization_s": 0.5, "generated_tokens": 800}
    tokens = 8 * (bench_gpu.PROMPT_TOKENS + 100)
    for trainer, per_token in (("grpo", 1e9), ("ppo", 1.5e9)):
        result = {"shape": "s", "length": 100, "trainer": trainer, "steps": [step], "peak_cuda_allocated_mb": 1024.0}
        d = bench_gpu.derive(result, meta)
        assert d["generation_tokens_per_s"] == 400.0
        assert d["training_tokens_per_s"] == tokens / 0.5
        assert d["training_mfu"] == pytest.approx(3 * per_token * tokens / (0.5 * 1e15))
        assert d["peak_memory_gb"] == pytest.approx(2**30 / 1e9)
    meta["preflight"]["peak_flops"] = None  # the CPU: no peak, no MFU
    assert bench_gpu.derive(result, meta)["training_mfu"] is None


def test_the_run_peak_survives_a_reset_of_torch_peak_counter(bench_gpu):
    """rlhfkit resets torch.cuda's peak counter at every phase (perf/peak_memory_gb/*): the bench keeps the max."""
    from types import SimpleNamespace

    counter = {"peak": 0}
    cuda = SimpleNamespace(
        max_memory_allocated=lambda device=None: counter["peak"],
        reset_peak_memory_stats=lambda device=None: counter.update(peak=0),
    )
    fake = SimpleNamespace(cuda=cuda)
    seen = bench_gpu.keep_peak_across_resets(fake)
    counter["peak"] = 9e9  # the training phase's peak
    fake.cuda.reset_peak_memory_stats("cuda:0")  # a phase starts
    counter["peak"] = 2e9
    assert counter["peak"] == 2e9 and seen == {"peak": 9e9, "count": 1}
    assert max(seen["peak"], fake.cuda.max_memory_allocated()) == 9e9
    assert bench_gpu.child_env("cuda", 0, "rlhfkit")["RLHFKIT_PHASE_MEMORY"] == "0"


def test_only_rlhfkit_arms_get_the_checkout_on_their_path(bench_gpu, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", str(ROOT)]))
    assert bench_gpu.child_env("cuda", 0, "rlhfkit")["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/tmp/site"]
    assert bench_gpu.child_env("cuda", 0, "trl")["PYTHONPATH"].split(os.pathsep) == ["/tmp/site"]
    cpu = bench_gpu.child_env("cpu", 2, "trl")
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["OMP_NUM_THREADS"] == "2"


@pytest.mark.slow
def test_cpu_rehearsal_runs_every_arm_end_to_end(tmp_path):
    """The GPU plan's code paths at the smallest size, on the CPU: three arms, two steps each, fixed-length
    completions, positive rates, times and memory, and the TRL arm ran TRL's trainer without rlhfkit."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path), "--threads", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads((tmp_path / "gpu-bench.json").read_text())
    assert data["meta"]["device"] == "cpu" and data["meta"]["preflight"]["peak_flops"] is None
    results = {r["arm"]: r for r in data["results"]}
    assert set(results) == set(ARMS)
    for name, library in ARMS.items():
        r = results[name]
        assert "failed" not in r and "skipped" not in r, r
        assert r["library"] == library and r["modules"] == [library], r["modules"]
        assert r["trainer_class"].startswith(f"{library}."), r["trainer_class"]
        assert r["mixed_precision"] == "bf16"
        assert r["completion_lengths"] == [16] and r["completions"] >= 16
        assert len(r["steps"]) == 2
        for step in r["steps"]:
            assert step["seconds"] > 0 and step["generation_s"] > 0 and step["optimization_s"] > 0
            assert step["generated_tokens"] == 8 * 16
        d = r["derived"]
        assert d["generation_tokens_per_s"] > 0 and d["training_tokens_per_s"] > 0 and d["step_seconds"] > 0
        assert d["peak_memory_gb"] > 0.1 and d["peak_memory_kind"] == "peak RSS"
        assert d["training_mfu"] is None
    assert results["trl-grpo"]["version"] == "1.16.0"
    table = (tmp_path / "gpu-bench.md").read_text()
    for name, library in ARMS.items():
        row = next(line for line in table.splitlines() if f"| {name} |" in line)
        assert f"| {library} " in row and row.rstrip().endswith("| n/a |"), row
    assert "| tiny | 16 |" in table and "GRPO, rlhfkit / TRL" in table
    assert "failed" not in table and "skipped" not in table
