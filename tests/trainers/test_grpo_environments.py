"""GRPOTrainer(environment_factory=...) and GRPOTrainer(rollout_func=...) (agents/environments.py,
agents/episodes.py): TRL 1.16's documented environment examples run with rlhfkit's import (IncrementEnv without a
dataset and with one, the dict of environments), each episode has its own reset instance and only its environment's
tools, get_reward is a reward source named after the class, reward functions get environments=; a rollout_func's
completions are trained with its env_mask out of the loss and its extra fields reach the reward functions."""

import itertools
import os
import random
import re

import pytest
import torch
from datasets import Dataset

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.sampling import completions as sampling_completions
from tests.tool_chat import END, call_text, read_jsonl, scripted_generate, tool_chat_model, tool_chat_tokenizer
from tests.trainers.test_grpo_tools import config as tool_config
from tests.trainers.test_grpo_tools import final_hidden_grads


def config(tmp_path, **overrides) -> GRPOConfig:
    return tool_config(tmp_path, **{"max_completion_length": 48, **overrides})


class IncrementEnv:
    """TRL 1.16's documented environment: it draws its own target and writes the prompt."""

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = random.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def metric_rows(args):
    return [r for r in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "loss" in r]


@pytest.mark.slow
def test_trl_s_increment_env_without_a_dataset_trains_and_logs_its_reward_and_tools(tmp_path):
    # The documented example: no train_dataset, max_steps, reset() writes the prompt, get_reward() scores, the real
    # sampler of a tiny random model.
    tok = tool_chat_tokenizer()
    args = config(tmp_path)
    trainer = GRPOTrainer(tool_chat_model(tok), args=args, processing_class=tok, environment_factory=IncrementEnv)
    assert trainer.reward_func_names == ["IncrementEnv"]
    assert [t.__name__ for t in trainer.tools] == ["increment"]
    assert trainer.train().global_step == 2
    rows = metric_rows(args)
    assert len(rows) == 2
    for r in rows:
        assert 0 <= r["rewards/IncrementEnv/mean"] <= 1
        assert r["tools/call_frequency"] >= 0 and "tools/increment/calls" in r


# ----------------------------------------------------------------------------------------------------------------
# Scripted episodes: the model's turns chosen from the conversation it reads.


def last_user_text(text: str) -> str:
    return text.rsplit("<|im_start|>user\n", 1)[1].split(END, 1)[0]


def increment_script(text: str) -> str:
    """Calls increment with the target the prompt names, then answers."""
    if "<tool_response>" in text:
        return f"Done.{END}"
    target = int(re.search(r"by (\d)", text).group(1))
    return call_text("increment", {"step": target})


@pytest.fixture
def scripted(monkeypatch):
    tok = tool_chat_tokenizer()

    def use(script):
        monkeypatch.setattr(sampling_completions, "generate", scripted_generate(tok, script))
        return tok

    return use


def test_each_episode_has_its_own_reset_instance_and_scores_its_own_calls(scripted, tmp_path):
    tok = scripted(increment_script)
    made = []

    class Counted(IncrementEnv):
        def __init__(self):
            made.append(self)

    seen = []

    def sees_environments(completions, environments, **kwargs):
        seen.append(list(environments))
        return [float(e.counter) for e in environments]

    args = config(tmp_path, max_steps=3)
    trainer = GRPOTrainer(
        tool_chat_model(tok), sees_environments, args, processing_class=tok, environment_factory=Counted
    )
    assert trainer.reward_func_names == ["sees_environments", "Counted"]
    trainer.train()
    rows = metric_rows(args)
    # The script increments by exactly the target: every episode's own environment pays 1.
    assert all(r["rewards/Counted/mean"] == 1.0 for r in rows)
    assert all(r["tools/call_frequency"] == 1.0 and r["tools/failure_frequency"] == 0.0 for r in rows)
    # One instance per episode of a round (4 = 2 prompts x 2 generations), the probe among them, reused every round.
    assert len(made) == 4
    assert all(len(batch) == 4 and len({id(e) for e in batch}) == 4 for batch in seen)
    assert all({id(e) for e in batch} == {id(e) for e in made} for batch in seen)
    assert all(e.counter == e.target for e in made)  # each got its own calls only


class TargetEnv(IncrementEnv):
    """The environment reads its task from the dataset: reset gets the row's other columns (and writes no prompt)."""

    def reset(self, target: int) -> None:
        self.counter, self.target = 0, target


def test_with_a_dataset_reset_gets_the_row_s_other_columns_and_the_prompt_is_the_dataset_s(scripted, tmp_path):
    tok = scripted(increment_script)
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Increment by {t}."}], "target": t} for t in (1, 2, 3, 4)]
    )
    prompts_seen = []

    def format_ok(prompts, completions, **kwargs):
        prompts_seen.extend(p[-1]["content"] for p in prompts)
        return [1.0] * len(completions)

    args = config(tmp_path)
    trainer = GRPOTrainer(
        tool_chat_model(tok), format_ok, args, train_dataset=data, processing_class=tok, environment_factory=TargetEnv
    )
    trainer.train()
    assert set(prompts_seen) <= {f"Increment by {t}." for t in (1, 2, 3, 4)}
    assert all(r["rewards/TargetEnv/mean"] == 1.0 for r in metric_rows(args))


class CodingEnv:
    def reset(self, **kwargs) -> str:
        self.ran = None
        return " (code)"

    def get_reward(self) -> float:
        return float(self.ran == "print(1)")

    def run_code(self, code: str) -> str:
        """
        Runs code (here: remembers it).

        Args:
            code: The code to run.
        """
        self.ran = code
        return "1"


class GameEnv:
    def reset(self, **kwargs) -> None:
        self.moves = []

    def move(self, direction: str) -> str:
        """
        Moves the player.

        Args:
            direction: Where to move.
        """
        self.moves.append(direction)
        return "moved"


def test_a_dict_of_environments_routes_rows_and_shows_each_prompt_its_own_tools(scripted, tmp_path):
    rendered = []

    def script(text):
        rendered.append(text)
        if "<tool_response>" in text:
            return f"Done.{END}"
        if "run_code(" in text:
            return call_text("run_code", {"code": "print(1)"})
        return call_text("move", {"direction": "up"})

    tok = scripted(script)
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "Code it"}], "environment": "coding"},
            {"prompt": [{"role": "user", "content": "Play it"}], "environment": "game"},
        ]
        * 2
    )

    def moved(completions, environments, **kwargs):
        return [float(getattr(e, "moves", None) == ["up"]) for e in environments]

    args = config(tmp_path, max_completion_length=128)
    trainer = GRPOTrainer(
        tool_chat_model(tok),
        moved,
        args,
        train_dataset=data,
        processing_class=tok,
        environment_factory={"coding": CodingEnv, "game": GameEnv},
    )
    assert trainer.reward_func_names == ["moved", "CodingEnv"]
    trainer.train()
    firsts = [t for t in rendered if "<tool_response>" not in t]
    coding = [t for t in firsts if "Code it (code)" in t]
    game = [t for t in firsts if "Play it" in t]
    assert coding and game
    assert all("run_code(code)" in t and "move(" not in t for t in coding)
    assert all("move(direction)" in t and "run_code(" not in t for t in game)
    for r in metric_rows(args):
        assert r["rewards/CodingEnv/mean"] == 1.0  # the game's episodes have no CodingEnv reward (None)
        assert r["rewards/moved/mean"] == 0.5
        assert r["tools/run_code/calls"] == 0.5 and r["tools/move/calls"] == 0.5
        assert r["tools/failure_frequency"] == 0.0


@pytest.mark.parametrize(
    "case, match",
    [
        ("no_reset", r"NoReset, which has no reset method"),
        ("no_dataset_no_max_steps", r"max_steps.*-1"),
        ("dict_without_dataset", r"dict of environments, which requires a `train_dataset`"),
        ("dict_without_column", r"'environment' column, which the train_dataset lacks"),
        ("dict_unknown_route", r"'chess', not among the environments"),
        ("no_reward", r"needs reward_funcs.*get_reward"),
    ],
)
def test_environment_misuse_exits_2_naming_the_fix(tmp_path, case, match):
    class NoReset:
        def go(self, x: int) -> int:
            """Go.

            Args:
                x: How far.
            """
            return x

    tok = tool_chat_tokenizer()
    routed = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}], "environment": "chess"}])
    plain = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}])
    kwargs = dict(reward_funcs=len, environment_factory=IncrementEnv, train_dataset=None)
    overrides = {}
    if case == "no_reset":
        kwargs["environment_factory"] = NoReset
    elif case == "no_dataset_no_max_steps":
        overrides["max_steps"] = -1
    elif case == "dict_without_dataset":
        kwargs["environment_factory"] = {"game": GameEnv}
    elif case == "dict_without_column":
        kwargs.update(environment_factory={"game": GameEnv}, train_dataset=plain)
    elif case == "dict_unknown_route":
        kwargs.update(environment_factory={"game": GameEnv}, train_dataset=routed)
    elif case == "no_reward":
        kwargs.update(environment_factory=GameEnv, reward_funcs=None)
    with pytest.raises((ConfigError, DataError), match=match):
        GRPOTrainer(tool_chat_model(tok), args=config(tmp_path, **overrides), processing_class=tok, **kwargs)


class GuessEnv:
    """An environment without tools (TRL 1.16 takes one): reset writes the question (the row's own, else a fixed one)
    and get_reward scores from the environment's state, here the question's length, so that each routed environment
    logs a reward of its own."""

    def reset(self, **kwargs) -> str:
        self.question = kwargs.get("question") or "Say hi."
        return self.question

    def get_reward(self) -> float:
        return float(len(self.question))


class EchoEnv(GuessEnv):
    def reset(self, **kwargs) -> str:
        self.question = "Echo."
        return self.question


def test_a_dataset_of_only_environment_names_trains_with_environments_without_tools(tmp_path):
    # TRL 1.16's environment-owned data: each row only names its environment, whose reset() writes the prompt into an
    # empty user message; neither environment offers a tool (one-turn episodes) and no reward function is given.
    tok = tool_chat_tokenizer()
    routed = Dataset.from_list([{"environment": name} for name in ("guess", "echo") * 2])
    args = config(tmp_path, max_steps=2)
    trainer = GRPOTrainer(tool_chat_model(tok), args=args, train_dataset=routed, processing_class=tok,
                          environment_factory={"guess": GuessEnv, "echo": EchoEnv})  # fmt: skip
    assert trainer.tools == [] and trainer.reward_func_names == ["GuessEnv", "EchoEnv"]
    prompts = [tok.decode(trainer.train_dataset[i]["input_ids"]) for i in range(2)]
    assert all("Tools:" not in p and "<|im_start|>user\n<|im_end|>" in p for p in prompts)  # empty until reset
    trainer.train()
    rows = metric_rows(args)
    assert [r["rewards/GuessEnv/mean"] for r in rows] == [7.0, 7.0]  # "Say hi." on its own routes
    assert [r["rewards/EchoEnv/mean"] for r in rows] == [5.0, 5.0]
    assert all(r["tools/call_frequency"] == 0.0 and r["tools/mean_turns"] == 1.0 for r in rows)


# ----------------------------------------------------------------------------------------------------------------
# rollout_func


def test_a_rollout_func_s_completions_train_with_env_mask_out_of_the_loss_and_extra_fields_reach_rewards(tmp_path):
    tok = tool_chat_tokenizer()
    calls = []
    policy = tok("ab", add_special_tokens=False)["input_ids"]
    env = tok("<tool_response>xyz</tool_response>", add_special_tokens=False)["input_ids"]

    def rollout(prompts, trainer):
        calls.append(len(prompts))
        prompt_ids = [tok(p[-1]["content"], add_special_tokens=False)["input_ids"] for p in prompts]
        completion = policy + env + policy + [tok.eos_token_id]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [completion] * len(prompts),
            "logprobs": [[-1.0] * len(completion)] * len(prompts),
            "env_mask": [[1] * len(policy) + [0] * len(env) + [1] * (len(policy) + 1)] * len(prompts),
            "env_reward": [float(i) for i in range(len(prompts))],
        }

    def from_env(completions, env_reward, **kwargs):
        assert all("xyz" in c[-1]["content"] for c in completions)
        return env_reward

    args = config(tmp_path, max_steps=1)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": c}]} for c in "pqrs"])
    trainer = GRPOTrainer(tool_chat_model(tok), from_env, args, train_dataset=data, processing_class=tok,
                          rollout_func=rollout)  # fmt: skip
    batch = trainer.generation.generate_and_score(list(range(2)))
    assert calls == [4]  # this process's prompts of the round, each num_generations times
    width = batch.prompt_width
    expected = torch.tensor([1] * len(policy) + [0] * len(env) + [1] * (len(policy) + 1), dtype=torch.bool)
    assert torch.equal(batch.loss_mask[0], expected)
    assert batch.rewards[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    # No gradient of the loss reaches a position that predicts a token the policy did not write (one real micro-step).
    grad = final_hidden_grads(trainer, batch)
    predicts = grad[:, width - 1 : -1].abs().sum(-1)
    env_tokens = batch.attention_mask[:, width:] & ~batch.loss_mask
    assert env_tokens.any() and (predicts[batch.loss_mask] > 0).any()
    assert torch.all(predicts[env_tokens] == 0)
    trainer.train()
    assert metric_rows(args)[0]["completions/mean_length"] == 2 * len(policy) + 1  # the policy's tokens only


@pytest.mark.parametrize(
    "output, match",
    [
        ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4}, r"must return keys \['logprobs'\]"),
        (
            {"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 3, "logprobs": None},
            r"'completion_ids'.*\(4.*3 entries",
        ),
        ({"prompt_ids": [[1]] * 4, "completion_ids": [["a"]] * 4, "logprobs": None}, r"completion_ids\[0\].*integers"),
        ({"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": [[0.0, 0.0]] * 4}, r"logprobs\[0\]"),
        (
            {"prompt_ids": [[1]] * 4, "completion_ids": [[2]] * 4, "logprobs": None, "env_mask": [[2]] * 4},
            r"env_mask\[0\] must hold a 0 or 1",
        ),
        ([1, 2], r"must return a dict"),
    ],
)
def test_a_rollout_func_s_bad_output_names_the_key_and_what_is_expected(tmp_path, output, match):
    tok = tool_chat_tokenizer()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": c}]} for c in "pq"])
    trainer = GRPOTrainer(tool_chat_model(tok), len, config(tmp_path), train_dataset=data, processing_class=tok,
                          rollout_func=lambda prompts, trainer: output)  # fmt: skip
    with pytest.raises(ConfigError, match=match):
        trainer.generation.generate_and_score([0, 1])


def test_a_rollout_func_with_tools_is_refused(tmp_path):
    tok = tool_chat_tokenizer()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(
        ConfigError, match=r"rollout_func=\.\.\., environment_factory=\.\.\.\).*inside the rollout_func"
    ):
        GRPOTrainer(tool_chat_model(tok), len, config(tmp_path), train_dataset=data, processing_class=tok,
                    rollout_func=lambda p, t: {}, environment_factory=IncrementEnv)  # fmt: skip
    assert not (tmp_path / "run").exists()


class CounterEnv(IncrementEnv):
    """TRL 1.16's test of an environment-owned reward: reset writes no prompt, get_reward (the final counter) is the
    run's only reward."""

    def reset(self, **kwargs):
        self.counter = 0

    def get_reward(self) -> float:
        return float(self.counter)


def test_an_environment_s_get_reward_as_the_only_reward_trains(monkeypatch, tmp_path):
    # As TRL's test: no reward_funcs, no train_dataset; of each group of 3 one episode increments by 1, one calls a tool
    # that does not exist, one answers without a call: counters 1, 0, 0, rewards 1, 0, 0.
    tok = tool_chat_tokenizer()
    first = [call_text("increment", {"step": 1}), call_text("decrement", {"step": 2}), f"I won't increment{END}"]
    turns = iter(first * 100)

    def script(text):
        return f"Done!{END}" if "<tool_response>" in text else next(turns)

    monkeypatch.setattr(sampling_completions, "generate", scripted_generate(tok, script))
    args = config(tmp_path, num_generations=3, per_device_train_batch_size=3, max_steps=2, learning_rate=0.1)
    model = tool_chat_model(tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(model, args=args, processing_class=tok, environment_factory=CounterEnv)
    assert trainer.reward_func_names == ["CounterEnv"] and trainer.reward_weights.tolist() == [1.0]
    assert [t.__name__ for t in trainer.tools] == ["increment"]  # neither reset nor get_reward is a tool
    trainer.train()
    rows = metric_rows(args)
    assert [r["rewards/CounterEnv/mean"] for r in rows] == [pytest.approx(1 / 3)] * 2
    logged = [r for r in trainer.state.log_history if "rewards/CounterEnv/mean" in r]  # the callbacks' view too
    assert len(logged) == 2 and logged[-1]["rewards/CounterEnv/mean"] == pytest.approx(1 / 3)
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())


# ----------------------------------------------------------------------------------------------------------------
# Environments in checkpoints: a stateful environment resumes exactly.


class CurriculumEnv(IncrementEnv):
    """A stateful environment: its targets come from its own random generator (seeded once, each instance from the next
    seed, not the run's), and it counts the episodes it served; state_dict / load_state_dict keep both."""

    seeds = itertools.count()

    def __init__(self):
        self.rng, self.served = random.Random(next(self.seeds)), 0

    def reset(self, **kwargs) -> str:
        self.counter, self.served = 0, self.served + 1
        self.target = self.rng.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target) + 0.01 * self.served + 0.1 * self.target

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "served": self.served}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.served = state["served"]


class ForgetfulEnv(CurriculumEnv):
    state_dict = None  # cannot save its state
    load_state_dict = None


def half_right_script(text: str) -> str:
    """Increments by the target when it is even, by 1 otherwise: rewards differ within a group."""
    if "<tool_response>" in text:
        return f"Done.{END}"
    target = int(re.search(r"by (\d)", text).group(1))
    return call_text("increment", {"step": target if target % 2 == 0 else 1})


def test_a_stateful_environment_resumes_exactly(scripted, tmp_path):
    from tests.trainers.test_resume import crashed_copy, rows_of, weights

    tok = scripted(half_right_script)

    def run(out, **extra):
        args = config(
            tmp_path, output_dir=str(out), max_steps=4, save_steps=2, learning_rate=1e-2, max_completion_length=200,
            **extra,
        )  # fmt: skip
        trainer = GRPOTrainer(tool_chat_model(tok), args=args, processing_class=tok, environment_factory=CurriculumEnv)
        trainer.train()
        return out

    original = run(tmp_path / "a")
    copy = crashed_copy(original, 2, tmp_path)  # as after a crash just after checkpoint-2
    resumed = run(copy, resume_from_checkpoint="latest")

    def comparable(rows):  # the tools' latencies are wall-clock seconds
        return [{k: v for k, v in r.items() if not k.endswith("/latency_s")} for r in rows]

    assert comparable(rows_of(resumed)) == comparable(rows_of(original))
    assert any(r.get("reward_std", 0) > 0 for r in rows_of(original))  # the groups' rewards differ: the policy learns
    samples = [(original / "samples.jsonl").read_text(), (resumed / "samples.jsonl").read_text()]
    assert samples[0] == samples[1]
    a, b = weights(original), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_environment_that_cannot_save_its_state_is_resumed_fresh_and_said_so(scripted, tmp_path):
    from tests.trainers.test_resume import crashed_copy

    tok = scripted(half_right_script)

    def trainer(out, **extra):
        args = config(tmp_path, output_dir=str(out), max_steps=2, save_steps=1, **extra)
        return GRPOTrainer(tool_chat_model(tok), args=args, processing_class=tok, environment_factory=ForgetfulEnv)

    trainer(tmp_path / "a").train()
    copy = crashed_copy(tmp_path / "a", 1, tmp_path)
    with pytest.warns(UserWarning, match="environment ForgetfulEnv has no state_dict"):
        trainer(copy, resume_from_checkpoint="latest").train()


def test_trainer_environments_index_as_trl_s_list():
    # TRL 1.16's trainer.environments[i] is the instance that plays the i-th episode of a generation
    from rlhfkit.agents.environments import Environments

    class Env:
        def reset(self, **kwargs):
            return "go"

    single = Environments(Env)
    single.pool[None].append(Env())
    assert len(single) == 2 and single[1] is single.pool[None][1] and list(single) == single.pool[None]
    multi = Environments({"a": Env, "b": Env})
    assert multi  # true whatever its pools hold
    with pytest.raises(TypeError, match=r"environments.pool\[name\]\[i\]"):
        multi[0]
