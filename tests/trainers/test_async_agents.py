"""Tools and environments under --async_generation (trainers/generation_worker.py): the worker runs the episodes, their
tools and environments; with max_staleness 0 a run with tools (GRPO, PPO) or an environment (GRPO) logs the same rows
and samples and ends with the same weights as the synchronous run; with staleness 1 the tool metrics and the
environments' rewards are logged and the environments' state comes back to the trainer; what cannot travel to the
worker is refused before anything loads."""

from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from rlhfkit import GRPOTrainer, PPOTrainer
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.generation_worker import _Result, snapshot
from tests.helpers import MACHINE_METRICS
from tests.tool_chat import multiply, tool_chat_model, tool_chat_tokenizer, use_script
from tests.trainers.test_grpo_async import TIMING
from tests.trainers.test_grpo_environments import CurriculumEnv, IncrementEnv
from tests.trainers.test_grpo_environments import config as environment_config
from tests.trainers.test_grpo_tools import config as grpo_config
from tests.trainers.test_grpo_tools import conversations
from tests.trainers.test_ppo_tools import config as ppo_config
from tests.trainers.test_resume import rows_of, weights

pytestmark = pytest.mark.slow  # each test starts generation worker processes

# What may differ between equal runs: wall-clock numbers, the asynchronous schedule's own metrics, and the health
# rules' counts (the off-policy rule reads the worker's sampler log-probs, the script's stand-in zeros).
DIFFERING = (
    *TIMING,
    *MACHINE_METRICS,
    "sample/",
    "perf/",
    "rollout/backpressure_s",
    "rollout/generated_tokens_per_s",
    "off_policy/",
    "health/",
)


def comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(DIFFERING) and not k.endswith("/latency_s")} for r in rows]


def asynchronous(staleness: int) -> dict:
    # the worker gets the trainer's own thread count, so that both sum in the same order as the synchronous run
    return dict(async_generation=True, max_staleness=staleness, generation_threads=torch.get_num_threads())


def prompts():
    return conversations("What is 3 times 4?", "Multiply 3 by 4.", "3 x 4?", "Four threes?")


def reward(completions, **kwargs):
    return [float(c[-1]["content"] == "Done.") + 0.1 * len(c) for c in completions]


def grpo_tools(out, **overrides):
    tok = tool_chat_tokenizer()
    args = grpo_config(out.parent, output_dir=str(out), max_steps=3, max_completion_length=200, **overrides)
    model = tool_chat_model(tok)
    return use_script(GRPOTrainer(model, reward, args, prompts(), processing_class=tok, tools=[multiply]))


def grpo_environment(out, environment=IncrementEnv, **overrides):
    tok = tool_chat_tokenizer()
    args = environment_config(
        out.parent, **{"output_dir": str(out), "max_steps": 3, "max_completion_length": 200, **overrides}
    )
    model = tool_chat_model(tok)
    return use_script(GRPOTrainer(model, args=args, processing_class=tok, environment_factory=environment))


def ppo_tools(out, **overrides):
    tok = tool_chat_tokenizer()
    args = ppo_config(out.parent, output_dir=str(out), total_episodes=12, response_length=200, **overrides)
    model = tool_chat_model(tok)
    return use_script(PPOTrainer(args, tok, model, train_dataset=prompts(), reward_funcs=[reward], tools=[multiply]))


AGENTS = {"grpo_tools": grpo_tools, "grpo_environment": grpo_environment, "ppo_tools": ppo_tools}


@pytest.mark.parametrize("agent", list(AGENTS))
def test_max_staleness_0_with_tools_equals_the_synchronous_run(agent, tmp_path):
    build = AGENTS[agent]
    synchronous = tmp_path / "sync" / "run"
    build(synchronous).train()
    worker = tmp_path / "async" / "run"
    build(worker, **asynchronous(0)).train()
    rows = rows_of(worker)
    assert comparable(rows) == comparable(rows_of(synchronous))
    assert (worker / "samples.jsonl").read_text() == (synchronous / "samples.jsonl").read_text()
    a, b = weights(synchronous), weights(worker)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [r for r in rows if "tools/call_frequency" in r]
    assert steps and all(r["sample/staleness_max"] == 0 for r in steps)
    # the script called tools, failed some and answered without others: the worker ran them
    assert sum(r["tools/call_frequency"] for r in steps) > 0
    assert 0 < sum(r["tools/failure_frequency"] for r in steps) or agent == "grpo_environment"
    if agent == "grpo_environment":  # reset's targets (Python's random) and get_reward, as in the trainer
        assert any(r["rewards/IncrementEnv/mean"] > 0 for r in steps)


def test_staleness_1_logs_the_tools_and_brings_the_environments_state_back(tmp_path):
    trainer = grpo_environment(tmp_path / "run", CurriculumEnv, max_steps=4, **asynchronous(1))
    trainer.train()
    steps = [r for r in rows_of(tmp_path / "run") if "tools/call_frequency" in r]
    assert len(steps) == 4 and max(r["sample/staleness_max"] for r in steps) == 1
    assert all("tools/increment/calls" in r and "rewards/CurriculumEnv/mean" in r for r in steps)
    # 4 episodes a generation (2 prompts x 2), one pooled instance each: every instance served one episode a
    # generation, counted in the worker and adopted by the trainer, whose checkpoints save it
    pool = trainer.environments.pool[None]
    assert len(pool) == 4 and [e.served for e in pool] == [4] * 4
    assert trainer.environments.state_dict()["pools"][""][0]["served"] == 4


def test_a_generation_s_pool_is_the_state_when_sent_not_when_the_queue_pickles_it():
    # a queue's put pickles later, in a feeder thread, while the worker already resets the same instances for the next
    # generation: the message is pickled when the worker sends it (this test's run above once adopted 5 episodes)
    instance = CurriculumEnv()
    instance.reset()
    sent = snapshot(_Result(0, 0, [], {}, 0.0, 0.0, 0.0, rows=[{"environment": instance}], pool={None: [instance]}))
    instance.reset()  # the next generation, begun before a feeder thread would have pickled the first
    received = ForkingPickler.loads(sent)
    assert received.pool[None][0].served == 1 and received.rows[0]["environment"] is received.pool[None][0]


def test_what_cannot_travel_to_the_worker_is_refused_before_anything_loads(tmp_path):
    def local_tool(a: int) -> int:
        """
        A tool defined in a function: pickle cannot name it.

        Args:
            a: A number.
        """
        return a

    tok = tool_chat_tokenizer()
    args = grpo_config(tmp_path, **asynchronous(1))
    with pytest.raises(ConfigError, match=r"must be picklable.*top level of a module"):
        GRPOTrainer(tool_chat_model(tok), reward, args, prompts(), processing_class=tok, tools=[local_tool])
    with pytest.raises(ConfigError, match=r"rollout_func=\.\.\.\) with async_generation"):
        GRPOTrainer(tool_chat_model(tok), reward, args, prompts(), processing_class=tok, rollout_func=lambda p, t: {})
