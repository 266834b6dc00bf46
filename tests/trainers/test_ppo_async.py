"""PPO's asynchronous generation (--async_generation) in the real trainer on the tiny built-in task: max_staleness 0
reproduces the synchronous run exactly (two sampling chunks per batch), staleness 1 is bounded, logged and corrected,
and a killed worker stops the run with a checkpoint that resumes to the uninterrupted run's numbers."""

import pytest
import torch

from rlhfkit.errors import GenerationWorkerStopped
from rlhfkit.metrics import registry
from rlhfkit.trainers.build import build_ppo_trainer
from tests.helpers import expand_templates
from tests.trainers.test_grpo_async import KillWorker, comparable
from tests.trainers.test_ppo import read_jsonl, small_config
from tests.trainers.test_resume import rows_of, weights

pytestmark = pytest.mark.slow  # each test trains with a spawned generation worker (3-6 s)


def config(assets, out, **overrides):
    # 4 updates of 16 completions, sampled in 2 chunks of 8; evaluation only at the end
    values = dict(total_episodes=64, output_dir=str(out), num_sample_generations=0)
    return small_config(assets, out, **{**values, **overrides})


def asynchronous(assets, out, max_staleness, **overrides):
    return config(
        assets, out, async_generation=True, max_staleness=max_staleness,
        generation_threads=torch.get_num_threads(), **overrides,
    )  # fmt: skip


def update_rows(out):
    return [r for r in read_jsonl(out / "metrics.jsonl") if "loss/policy_avg" in r]


@pytest.fixture(scope="module")
def staleness_0_run(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo-async0") / "run"
    build_ppo_trainer(asynchronous(tiny_assets, out, 0)).train()
    return out


def test_max_staleness_0_equals_the_synchronous_run(tiny_assets, tmp_path, staleness_0_run):
    synchronous = tmp_path / "sync"
    build_ppo_trainer(config(tiny_assets, synchronous)).train()
    assert comparable(rows_of(staleness_0_run)) == comparable(rows_of(synchronous))
    a, b = weights(synchronous), weights(staleness_0_run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(r["sample/staleness_max"] == 0 for r in update_rows(staleness_0_run))


def test_staleness_1_is_bounded_corrected_and_logged(tiny_assets, tmp_path):
    out = tmp_path / "run"
    build_ppo_trainer(asynchronous(tiny_assets, out, 1, vllm_importance_sampling_mode="token_truncate")).train()
    rows = update_rows(out)
    assert [r["sample/staleness_max"] for r in rows] == [0, 1, 1, 1]
    logged = set().union(*(r.keys() for r in read_jsonl(out / "metrics.jsonl"))) - {"step"}
    expected = {m.name for m in expand_templates(registry.metrics_for("ppo"), [], async_generation=True)}
    assert logged == expected - {"eval/scores", "eval/task_success"}  # num_sample_generations 0: no evaluation
    for r in rows[1:]:
        assert 0 < r["off_policy/mismatch_kl"] < 1
        assert 0 < r["off_policy/importance_weight_mean"] <= 3.0 and r["off_policy/masked_frac"] == 0


def test_a_killed_worker_stops_the_run_with_a_checkpoint_that_resumes_exactly(tiny_assets, tmp_path, staleness_0_run):
    out = tmp_path / "run"
    trainer = build_ppo_trainer(asynchronous(tiny_assets, out, 0))
    trainer.add_callback(KillWorker(trainer, step=2))
    with pytest.raises(GenerationWorkerStopped, match="exited with code -9") as stopped:
        trainer.train()
    assert stopped.value.checkpoint.endswith("checkpoint-2")
    build_ppo_trainer(asynchronous(tiny_assets, out, 0, resume_from_checkpoint="latest")).train()
    assert comparable(rows_of(out)) == comparable(rows_of(staleness_0_run))
    a, b = weights(staleness_0_run), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
