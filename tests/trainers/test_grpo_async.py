"""GRPO's asynchronous generation (--async_generation) in the real trainer on the tiny built-in task: max_staleness 0
reproduces the synchronous run exactly, staleness never exceeds the bound and is logged, stale batches are reweighted
by exactly the importance-sampling correction, and a killed worker stops the run with a checkpoint that resumes to the
uninterrupted run's numbers."""

import os
import signal

import pytest
import torch
from transformers import TrainerCallback

from rlhfkit import GRPOConfig
from rlhfkit.errors import ConfigError, GenerationWorkerStopped
from rlhfkit.metrics import registry as M
from rlhfkit.trainers.build import build_grpo_trainer
from rlhfkit.trainers.generation_worker import flatten_weights, load_flat_weights
from tests.helpers import MACHINE_METRICS, run_two_processes
from tests.trainers.test_grpo import grpo_config, read_jsonl, train_rows, two_process_grpo_command
from tests.trainers.test_resume import rows_of, weights

ASYNC_METRICS = {m.name for m in M.metrics_for("grpo") if m.when.startswith("async_generation")}
# Wall-clock and scheduling numbers: the only ones allowed to differ between equal runs.
TIMING = {"eps", "time/rollout", "time/optimization", "step_time", "sample/rollout_queue_size", "perf/rollout_wait_s",
          "rollout/backpressure_s", "rollout/generated_tokens_per_s", "perf/weight_sync_s"}  # fmt: skip
TIMING |= MACHINE_METRICS


def config(assets, out, **overrides) -> GRPOConfig:
    values = dict(gradient_accumulation_steps=1, max_steps=4, save_steps=2, output_dir=str(out))
    return grpo_config(assets, out, **{**values, **overrides})


def asynchronous(assets, out, max_staleness, **overrides) -> GRPOConfig:
    # the worker gets the trainer's own thread count, so that both sum in the same order as the synchronous run
    return config(
        assets, out, async_generation=True, max_staleness=max_staleness,
        generation_threads=torch.get_num_threads(), **overrides,
    )  # fmt: skip


def comparable(rows):
    return [{k: v for k, v in r.items() if k not in TIMING and k not in ASYNC_METRICS} for r in rows]


@pytest.fixture(scope="module")
def synchronous_run(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("sync") / "run"
    build_grpo_trainer(config(tiny_assets, out), set()).train()
    return out


@pytest.fixture(scope="module")
def staleness_0_run(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("async0") / "run"
    build_grpo_trainer(asynchronous(tiny_assets, out, 0), set()).train()
    return out


@pytest.mark.slow
def test_max_staleness_0_equals_the_synchronous_run(synchronous_run, staleness_0_run):
    """The worker samples with the trainer's RNG state on the trainer's weights: every metric and every final weight
    is the synchronous run's, bit for bit."""
    assert comparable(rows_of(staleness_0_run)) == comparable(rows_of(synchronous_run))
    a, b = weights(synchronous_run), weights(staleness_0_run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = train_rows(read_jsonl(staleness_0_run / "metrics.jsonl"))
    assert all(r["sample/staleness_max"] == 0 for r in rows)
    assert all(r["off_policy/mismatch_kl"] < 1e-5 for r in rows)  # the same weights, cached decoding vs a forward


@pytest.mark.slow
def test_staleness_1_is_bounded_overlapped_and_logged(tiny_assets, tmp_path):
    out = tmp_path / "run"
    build_grpo_trainer(asynchronous(tiny_assets, out, 1, max_steps=5, save_steps=0), set()).train()
    rows = train_rows(read_jsonl(out / "metrics.jsonl"))
    assert [r["sample/staleness_max"] for r in rows] == [0, 1, 1, 1, 1]  # the pipeline fills after the first step
    assert [r["sample/staleness_mean"] for r in rows] == [0, 1, 1, 1, 1]
    logged = set().union(*(r.keys() for r in rows))
    assert ASYNC_METRICS <= logged  # stale batches with the default correction log every one of them
    for r in rows[1:]:
        assert 0 < r["off_policy/mismatch_kl"] < 1  # one step of learning rate 1e-3 apart
        assert 0 <= r["off_policy/masked_frac"] <= 1 and r["off_policy/truncated_frac"] == 0  # sequence_mask
    assert all(r["rollout/generated_tokens_per_s"] > 0 for r in rows)


@pytest.mark.slow
def test_staleness_1_reproduces_with_its_seed(tiny_assets, tmp_path):
    """The schedule, not timing, decides which weights sample each generation, so two runs are the same run."""
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        build_grpo_trainer(asynchronous(tiny_assets, out, 1, max_steps=3, save_steps=0), set()).train()
    assert comparable(rows_of(runs[0])) == comparable(rows_of(runs[1]))
    assert [r["sample/staleness_max"] for r in train_rows(read_jsonl(runs[0] / "metrics.jsonl"))] == [0, 1, 1]


@pytest.mark.parametrize("mode, clip_max, shift", [("token_truncate", 3.0, 0.5), ("token_truncate", 1.2, 0.5),
                                                   ("token_mask", 1.2, 0.5), ("sequence_truncate", None, -0.05)])  # fmt: skip
def test_a_stale_batch_is_reweighted_by_the_correction(tiny_assets, tmp_path, mode, clip_max, shift):
    """A hand-computed case: the behaviour log-probs are the trainer's minus `shift` on every token, so the per-token
    weight is exp(shift) (token modes) or exp(shift x tokens) (sequence modes), truncated at clip_max or zeroed above
    it; with loss_type grpo's per-completion means the loss of a micro-batch scales by exactly that weight when every
    completion's weight is the same (token modes), and row by row otherwise (checked through a one-row micro-batch)."""
    args = config(
        tiny_assets, tmp_path / "run", loss_type="grpo", max_steps=1, beta=0.0,
        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=clip_max,
    )  # fmt: skip
    trainer = build_grpo_trainer(args, set())
    trainer.generation_worker = object()  # micro_step applies the correction to batches the worker sampled
    torch.manual_seed(0)
    batch = trainer.generation.generate_and_score([0, 1])
    rows = slice(0, 1) if mode.startswith("sequence") else slice(0, args.per_device_train_batch_size)
    mask = batch.loss_mask[rows]
    assert mask.any()
    current = trainer.generation.logprobs(trainer.model, batch.input_ids, batch.attention_mask, batch.prompt_width,
                               batch.completion_ids).detach()  # fmt: skip
    batch.sampling_logprobs = torch.where(batch.loss_mask, current - shift, 0.0)
    batch.staleness = 0
    plain = trainer.micro_step(batch, rows)
    assert plain != 0
    batch.staleness = 1
    corrected = trainer.micro_step(batch, rows)

    log_ratio = shift * (mask.sum().item() if mode.startswith("sequence") else 1)
    ratio = torch.tensor(log_ratio, dtype=torch.float64).exp().item()
    high = clip_max if clip_max is not None else float("inf")
    expected = min(ratio, high) if mode.endswith("truncate") else (ratio if ratio <= high else 0.0)
    assert corrected == pytest.approx(plain * expected, rel=1e-5, abs=1e-7)


def test_the_weights_travel_whole_and_in_order_across_dtypes():
    params = [torch.randn(3, 4), torch.randn(5, dtype=torch.float64), torch.randn(2, 2), torch.randn(7).bfloat16()]
    flats = flatten_weights(params)
    assert [f.dtype for f in flats] == [torch.float32, torch.float64, torch.bfloat16]
    target = [torch.zeros_like(p) for p in params]
    load_flat_weights(target, flats)
    assert all(torch.equal(a, b) for a, b in zip(params, target))


class KillWorker(TrainerCallback):
    """SIGKILL the generation worker at the end of step `step`, as the system's out-of-memory killer would."""

    def __init__(self, trainer, step):
        self.trainer, self.step = trainer, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(self.trainer.generation_worker.process.pid, signal.SIGKILL)
            self.trainer.generation_worker.process.join()


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_with_a_checkpoint_that_resumes_exactly(tiny_assets, tmp_path, staleness_0_run):
    out = tmp_path / "run"
    trainer = build_grpo_trainer(asynchronous(tiny_assets, out, 0, save_steps=0), set())
    trainer.add_callback(KillWorker(trainer, step=3))
    with pytest.raises(GenerationWorkerStopped) as stopped:
        trainer.train()
    message = str(stopped.value)
    assert "generation worker" in message and "exited with code -9" in message
    assert f"--output_dir {out} --resume_from_checkpoint latest" in message
    assert stopped.value.checkpoint.endswith("checkpoint-3") and os.path.isdir(stopped.value.checkpoint)
    assert not trainer.generation_worker.process.is_alive()

    resumed = asynchronous(tiny_assets, out, 0, save_steps=0, resume_from_checkpoint="latest")
    build_grpo_trainer(resumed, set()).train()
    assert comparable(rows_of(out)) == comparable(rows_of(staleness_0_run))
    a, b = weights(staleness_0_run), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(steps_per_generation=2), r"async_generation needs one generation per optimizer step: steps_per_generation "
                                       r"\(2\) x num_iterations \(1\) = 2 .* gradient_accumulation_steps is 1"),
        (dict(num_iterations=2, gradient_accumulation_steps=1), r"num_iterations \(2\) = 2"),
        (dict(dynamic_sampling=True), r"async_generation with dynamic_sampling is not supported yet"),
        (dict(use_peft=True), r"async_generation with --use_peft is not supported yet"),
        (dict(vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=1.0),
         r"vllm_importance_sampling_clip_min \(2.0\) is greater than vllm_importance_sampling_clip_max \(1.0\)"),
        (dict(max_staleness=-1), r"max_staleness=-1: must be an integer >= 0"),
        (dict(vllm_importance_sampling_mode="token"), r"vllm_importance_sampling_mode='token': must be one of "
                                                      r"token_truncate, token_mask, sequence_truncate, sequence_mask"),
    ],
)  # fmt: skip
def test_settings_the_asynchronous_schedule_cannot_honour_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(async_generation=True, **overrides)


def test_trl_importance_sampling_names_parse_with_trl_defaults():
    from rlhfkit.config.parse import parse_config

    defaults = GRPOConfig()
    assert (defaults.async_generation, defaults.max_staleness) == (False, 1)
    assert defaults.vllm_importance_sampling_correction is True
    assert (defaults.vllm_importance_sampling_mode, defaults.vllm_importance_sampling_clip_max) == (
        "sequence_mask",
        3.0,
    )
    flags = ["--async_generation", "--max_staleness", "2", "--vllm_importance_sampling_mode", "token_truncate"]
    args, explicit = parse_config(GRPOConfig, flags, "rlhfkit grpo")
    assert (args.async_generation, args.max_staleness, args.vllm_importance_sampling_mode) == (
        True, 2, "token_truncate",
    )  # fmt: skip


@pytest.mark.slow
def test_two_trainer_processes_each_with_a_worker_equal_the_synchronous_launch(tiny_assets, tmp_path):
    """accelerate launch with 2 CPU processes: each trainer process has its own worker for its share of every
    generation; at max_staleness 0 the run is the synchronous 2-process run."""
    outs = {mode: tmp_path / mode for mode in ("sync", "async")}
    for mode, out in outs.items():
        command = two_process_grpo_command(tiny_assets, out, "tests.trainers.grpo_rewards:recorded_length")
        extra = ["--async_generation", "--max_staleness", "0"] if mode == "async" else []
        run_two_processes([*command, "--max_steps", "3", *extra], tmp_path)
    assert comparable(rows_of(outs["async"])) == comparable(rows_of(outs["sync"]))
    assert [r["sample/staleness_max"] for r in train_rows(read_jsonl(outs["async"] / "metrics.jsonl"))] == [0, 0, 0]
