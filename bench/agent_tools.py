"""Slow tools in a batch: how long one round of episodes takes when every episode calls a tool that takes 100 ms.

Each trainer (PPO, GRPO) samples one batch of 16 multi-turn episodes with a scripted policy (the tests' tiny tool-chat
model, whose turns are chosen by the conversation: a tool call, then the answer after the result), so the time is the
tools' and the trainers' own, not the sampler's. The tool sleeps 100 ms, sync (time.sleep, in the tool threads) or
async (asyncio.sleep, awaited). Two schedules:

- concurrent: rlhfkit's (agents.tools.run_tool_calls): every episode's calls of a round at once;
- one at a time: each episode's calls run after the previous episode's (what a loop over the episodes does).

    .venv/bin/python bench/agent_tools.py            # prints both tables (markdown), ~1 min

The generation step also scores the batch (reward functions, forwards for log-probs and values), the same in both.

The second table is whole runs with the same scripted episodes and the sync 100 ms tool (concurrent calls), trained
for STEPS updates with synchronous generation and with --async_generation (max_staleness 1, the worker running the
episodes and their tools while the trainer optimises): the median seconds per update after the first (which waits for
the worker to start), from the runs' own step_time.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from rlhfkit import GRPOConfig, GRPOTrainer  # noqa: E402
from rlhfkit.agents import episodes as episodes_module  # noqa: E402
from rlhfkit.agents.episodes import ToolEpisodes  # noqa: E402
from rlhfkit.agents.tools import run_tool_calls  # noqa: E402
from rlhfkit.config import PPOConfig  # noqa: E402
from rlhfkit.models import completion_token_stats  # noqa: E402
from rlhfkit.sampling import completions as sampling_completions  # noqa: E402
from rlhfkit.sampling.decoders import Generated  # noqa: E402
from rlhfkit.trainers.ppo import PPOTrainer  # noqa: E402
from tests.tool_chat import END, call_text, read_jsonl, scripted_generate, tool_chat_model, tool_chat_tokenizer  # noqa: E402

EPISODES, LATENCY_S, REPEATS, STEPS = 16, 0.1, 3, 6


def lookup(query: str) -> str:
    """Looks a query up (a slow service).

    Args:
        query: What to look up.
    """
    time.sleep(LATENCY_S)
    return f"found {query}"


async def async_lookup(query: str) -> str:
    """Looks a query up (a slow service).

    Args:
        query: What to look up.
    """
    await asyncio.sleep(LATENCY_S)
    return f"found {query}"


def scripted_sampler(tok, tool: str):
    """The scripted turns (a tool call, then the answer after the result), with the log-probs the policy gives them,
    as the sampler's would be (PPO reuses them as logp_old)."""

    def turn(text: str) -> str:
        return f"Done.{END}" if "<tool_response>" in text else call_text(tool, {"query": "x"})

    scripted = scripted_generate(tok, turn)

    def generate(model, prompt_ids, prompt_mask, config, **kwargs):
        tokens = scripted(model, prompt_ids, prompt_mask, config).tokens
        ids, mask = torch.cat([prompt_ids, tokens], 1), torch.cat([prompt_mask, torch.ones_like(tokens).bool()], 1)
        stats = completion_token_stats(model, ids, mask, prompt_ids.shape[1], tokens, config.temperature)
        return Generated(tokens, stats.logprobs.float())

    return generate


def one_at_a_time(turns, threads=None):
    """The schedule of a loop over the episodes: each episode's calls after the previous episode's."""
    return [run_tool_calls([turn])[0] for turn in turns]


def reward(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]


def trainer_of(algorithm: str, tool, out: str):
    tok = tool_chat_tokenizer()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(EPISODES)])
    common = dict(output_dir=out, report_to=["none"], save_steps=0, seed=0, max_tool_calling_iterations=1)
    if algorithm == "grpo":
        args = GRPOConfig(
            **common, num_generations=2, per_device_train_batch_size=EPISODES, gradient_accumulation_steps=1,
            max_steps=1, max_completion_length=128, num_sample_generations=0,
        )  # fmt: skip
        trainer = GRPOTrainer(tool_chat_model(tok), reward, args, data, processing_class=tok, tools=[tool])
        return tok, lambda: trainer.generation.generate_and_score(list(range(EPISODES // 2)))
    args = PPOConfig(
        **common, per_device_train_batch_size=EPISODES, local_rollout_forward_batch_size=EPISODES,
        total_episodes=EPISODES, response_length=128, num_sample_generations=0,
    )  # fmt: skip
    model = tool_chat_model(tok)
    trainer = PPOTrainer(args, tok, model, train_dataset=data, reward_funcs=reward, tools=[tool])
    rows = [trainer.train_dataset[i] for i in range(EPISODES)]
    return tok, lambda: trainer.generation.generate_and_score(rows)


def measure(algorithm: str, tool, schedule) -> float:
    """Median seconds of one generation step of EPISODES episodes."""
    with tempfile.TemporaryDirectory() as out:
        tok, step = trainer_of(algorithm, tool, out)
        original_generate, original_run = sampling_completions.generate, episodes_module.run_tool_calls
        sampling_completions.generate = scripted_sampler(tok, tool.__name__)
        episodes_module.run_tool_calls = schedule
        try:
            step()  # warm-up
            times = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
        finally:
            sampling_completions.generate, episodes_module.run_tool_calls = original_generate, original_run
    return statistics.median(times)


class LookupEpisodes(ToolEpisodes):
    """The scripted turns of the whole-run table (a call of the run's tool, then the answer after its result), as a
    class of this module: the generation worker unpickles the trainer's episodes as it and runs the same script."""

    def turns(self, model, contexts, budgets, config, device):
        tok, tool, ids = self.tokenizer, self.toolbox.names[0], []
        for context, budget in zip(contexts, budgets):
            text = tok.decode(context, skip_special_tokens=False)
            turn = f"Done.{END}" if "<tool_response>" in text else call_text(tool, {"query": "x"})
            ids.append(tok(turn, add_special_tokens=False)["input_ids"][:budget])
        return ids, [[0.0] * len(row) for row in ids]  # stand-in sampler log-probs


def whole_run(algorithm: str, async_generation: bool) -> float:
    """Median seconds per update after the first, of a STEPS-update run whose episodes call `lookup` (100 ms), on 2
    torch threads."""
    tok = tool_chat_tokenizer()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(EPISODES)])
    torch.set_num_threads(2)  # equal cores: the synchronous run takes both, the asynchronous splits them 1 + 1
    with tempfile.TemporaryDirectory() as out:
        common = dict(output_dir=out, report_to=["none"], save_steps=0, seed=0, max_tool_calling_iterations=1,
                      num_sample_generations=0, logging_steps=1, async_generation=async_generation, max_staleness=1)  # fmt: skip
        if algorithm == "grpo":
            args = GRPOConfig(**common, num_generations=2, per_device_train_batch_size=EPISODES,
                              gradient_accumulation_steps=1, max_steps=STEPS, max_completion_length=128)  # fmt: skip
            trainer = GRPOTrainer(tool_chat_model(tok), reward, args, data, processing_class=tok, tools=[lookup])
        else:
            args = PPOConfig(**common, per_device_train_batch_size=EPISODES, local_rollout_forward_batch_size=EPISODES,
                             total_episodes=EPISODES * STEPS, response_length=128)  # fmt: skip
            trainer = PPOTrainer(
                args, tok, tool_chat_model(tok), train_dataset=data, reward_funcs=reward, tools=[lookup]
            )
        trainer.episodes.__class__ = LookupEpisodes
        trainer.train()
        rows = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if "step_time" in r]
    return statistics.median(r["step_time"] for r in rows[1:])


def main() -> None:
    torch.set_num_threads(1)
    print(f"{EPISODES} episodes per step, one {LATENCY_S * 1000:.0f} ms tool call each; median of {REPEATS} steps")
    print()
    print(
        "| trainer | tool | one at a time: s / step | concurrent: s / step | episodes/s one at a time | episodes/s concurrent |"
    )
    print("|---|---|---|---|---|---|")
    for algorithm in ("ppo", "grpo"):
        for tool, kind in ((lookup, "sync"), (async_lookup, "async")):
            serial = measure(algorithm, tool, one_at_a_time)
            concurrent = measure(algorithm, tool, run_tool_calls)
            print(
                f"| {algorithm.upper()} | {kind} | {serial:.2f} | {concurrent:.2f} | {EPISODES / serial:.1f} | "
                f"{EPISODES / concurrent:.1f} |"
            )
    print()
    print(f"Whole runs, {STEPS} updates of {EPISODES} episodes, the sync tool; median s / update after the first")
    print()
    print(
        "| trainer | synchronous: s / update | async_generation: s / update | episodes/s synchronous | episodes/s async |"
    )
    print("|---|---|---|---|---|")
    for algorithm in ("ppo", "grpo"):
        synchronous, asynchronous = whole_run(algorithm, False), whole_run(algorithm, True)
        print(
            f"| {algorithm.upper()} | {synchronous:.2f} | {asynchronous:.2f} | {EPISODES / synchronous:.1f} | "
            f"{EPISODES / asynchronous:.1f} |"
        )


if __name__ == "__main__":
    main()
