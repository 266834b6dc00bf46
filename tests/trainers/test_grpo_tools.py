"""GRPOTrainer(tools=[...]) (agents/episodes.py, agents/tools.py): TRL 1.16's tool-calling example runs with
rlhfkit's import and logs the tool metrics; scripted tool calls go through execution, every failure kind and the turn
cap with the run going on; tool results are out of the loss (no gradient reaches the positions that predict them) and
an episode's log-probs are those of its text scored in one forward."""

import itertools
import os
import subprocess
import sys
import threading

import pytest
import torch
from datasets import Dataset

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.errors import ConfigError
from rlhfkit.metrics import registry
from rlhfkit.sampling import completions as sampling_completions
from tests.helpers import REPO, expand_templates
from tests.tool_chat import (
    END,
    async_add,
    call_text,
    multiply,
    read_jsonl,
    scripted_generate,
    tool_chat_model,
    tool_chat_tokenizer,
)


def config(tmp_path, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=str(tmp_path / "run"),
        report_to=["none"],
        learning_rate=1e-3,
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_steps=2,
        max_completion_length=32,
        logging_steps=1,
        num_sample_generations=0,
        save_steps=0,
        seed=3,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def conversations(*contents: str) -> Dataset:
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": c}], "answer": str(i)} for i, c in enumerate(contents)]
    )


@pytest.mark.slow
def test_trl_s_tool_example_runs_with_rlhfkit_s_import_and_logs_the_tool_metrics(tmp_path):
    # TRL 1.16's documented agent example (tools=[multiply, async_add], an accuracy reward on the last message), on a
    # tiny random model whose chat template renders tools: the real sampler, whatever it samples.
    def accuracy(completions, answer, **kwargs):
        return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]

    tok = tool_chat_tokenizer()
    args = config(tmp_path)
    trainer = GRPOTrainer(
        tool_chat_model(tok),
        accuracy,
        args,
        train_dataset=conversations("What is 3 times 4?", "Add 1 and 2."),
        processing_class=tok,
        tools=[multiply, async_add],
    )
    assert trainer.tools == [multiply, async_add]
    assert "Tools: multiply(a,b) async_add(a,b)" in tok.decode(trainer.train_dataset[0]["input_ids"])
    assert trainer.train().global_step == 2
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 2
    assert all(r["tools/call_frequency"] >= 0 and 0 <= r["tools/failure_frequency"] <= 1 for r in steps)
    logged = set().union(*(r.keys() for r in rows)) - {"step"}
    expected = expand_templates(registry.metrics_for("grpo"), ["accuracy"], tool_names=["multiply", "async_add"])
    not_this_run = {"cispo_clip_ratio", "vespo/phi_seq_mean", "entropy_coef", "policy_loss", "kl"}
    not_this_run |= {m.name for m in expected if m.name.startswith(("dynamic_sampling/", "eval", "rollout/"))}
    assert logged == {m.name for m in expected} - not_this_run


# ----------------------------------------------------------------------------------------------------------------
# Scripted episodes: each prompt names what its first turn calls; after a tool result the model answers.
release = threading.Event()  # lets the hung tool's thread end when the test is over


@pytest.fixture(autouse=True)
def hung_tools_end():
    """Each test's hung tool calls time out (the event is clear while it runs) and their threads end after it."""
    release.clear()
    yield
    release.set()


def boom(x: int) -> str:
    """Raises.

    Args:
        x: Anything.
    """
    raise RuntimeError("boom " * 400)  # a long error, cut in the conversation


def hang(x: int) -> str:
    """Never answers in time.

    Args:
        x: Anything.
    """
    release.wait(30)
    return "late"


class Unprintable:
    def __str__(self):
        raise ValueError("no text")


def unprintable(x: int) -> str:
    """Returns something that has no text.

    Args:
        x: Anything.
    """
    return Unprintable()


def big(x: int) -> str:
    """Answers at length.

    Args:
        x: Anything.
    """
    return "x" * 1000  # more than the completion budget left: the result is rolled back


TOOLS = [multiply, async_add, boom, hang, unprintable, big]
FIRST_TURNS = {
    "ok": call_text("multiply", {"a": 3, "b": 4}),
    "async": "Adding." + call_text("async_add", {"a": 1, "b": 2}),
    "raise": call_text("boom", {"x": 1}),
    "hang": call_text("hang", {"x": 1}),
    "unprintable": call_text("unprintable", {"x": 1}),
    "wrong": call_text("multiply", {"a": "three", "b": 4}),
    "unknown": call_text("__import__", {"name": "os"}),
    "loop": call_text("multiply", {"a": 2, "b": 2}),
    "big": call_text("big", {"x": 1}),
}


def script(text: str) -> str:
    """The scripted model: its first turn is FIRST_TURNS[prompt]; after a tool result it answers, except in "loop"
    episodes, which call multiply again every turn."""
    prompt = text.split("<|im_start|>user\n", 1)[1].split(END, 1)[0]
    if "<tool_response>" not in text or prompt == "loop":
        return FIRST_TURNS[prompt]
    return f"Done.{END}"


@pytest.fixture
def scripted(monkeypatch):
    tok = tool_chat_tokenizer()
    monkeypatch.setattr(sampling_completions, "generate", scripted_generate(tok, script))
    return tok


def scripted_trainer(tok, tmp_path, reward, dtype=torch.float32, **overrides):
    prompts = list(FIRST_TURNS)
    args = config(
        tmp_path,
        per_device_train_batch_size=2 * len(prompts),
        max_steps=1,
        max_completion_length=800,
        max_tool_calling_iterations=2,
        **overrides,
    )
    trainer = GRPOTrainer(
        tool_chat_model(tok, dtype=dtype), reward, args, conversations(*prompts), processing_class=tok, tools=TOOLS
    )
    trainer.episodes.toolbox.timeout_s = 0.2
    return trainer


def test_tool_calls_run_and_every_failure_goes_into_the_conversation(scripted, tmp_path):
    seen = {}

    def recorded(prompts, completions, **kwargs):
        for p, c in zip(prompts, completions):
            seen[p[0]["content"]] = c
        return [0.0] * len(completions)

    trainer = scripted_trainer(scripted, tmp_path, recorded)
    trainer.train()
    tool = {k: [m for m in v if m["role"] == "tool"] for k, v in seen.items()}
    assert tool["ok"] == [{"role": "tool", "name": "multiply", "content": "12"}]
    assert seen["ok"][0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    assert seen["ok"][-1] == {"role": "assistant", "content": "Done."}
    assert tool["async"][0]["content"] == "3" and seen["async"][0]["content"] == "Adding."
    errors = {k: tool[k][0]["content"] for k in ("raise", "hang", "unprintable", "wrong", "unknown")}
    assert all(e.startswith("{'error': ") for e in errors.values())
    assert "RuntimeError: boom" in errors["raise"] and len(errors["raise"]) < 600  # cut, not 2000 characters
    assert "timed out after 0.2 s" in errors["hang"]
    assert "could not be turned into text" in errors["unprintable"]
    assert "a must be integer" in errors["wrong"]
    assert errors["unknown"] == "{'error': 'Tool __import__ not found.'}"
    assert all(seen[k][-1]["content"] == "Done." for k in errors)  # the episodes went on after the error
    # The turn cap: 2 rounds of tool results, so 3 turns, the last one's call left pending.
    assert [m["role"] for m in seen["loop"]] == ["assistant", "tool"] * 2 + ["assistant"]
    assert "tool_calls" in seen["loop"][-1]
    # A result that would push the completion past max_completion_length is rolled back: the episode ends with its call.
    assert [m["role"] for m in seen["big"]] == ["assistant"] and "tool_calls" in seen["big"][0]

    (row,) = [r for r in read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl")) if "loss" in r]
    episodes = 18  # 9 prompts x 2
    calls = 2 * (8 + 2)  # each prompt's episodes: one call (big's rolled back too), loop's two executed
    failures = 2 * 5
    assert row["tools/call_frequency"] == pytest.approx(calls / episodes)
    assert row["tools/failure_frequency"] == pytest.approx(failures / calls)
    assert row["tools/multiply/calls"] == pytest.approx(2 * (1 + 1 + 2) / episodes)
    assert row["tools/multiply/failure_frequency"] == pytest.approx(2 / 8)  # the wrong-argument calls
    assert row["tools/boom/failure_frequency"] == 1.0 and row["tools/async_add/failure_frequency"] == 0.0
    assert row["tools/hang/latency_s"] >= 0.2
    assert row["tools/max_turns"] == 3
    assert row["tools/turn_cap_ratio"] == pytest.approx(2 / episodes)  # loop's
    assert row["tools/rolled_back_ratio"] == pytest.approx(2 / episodes)  # big's
    assert row["tools/mean_tool_tokens"] > 0
    assert row["tools/mean_turns"] == pytest.approx(2 * (7 * 2 + 1 + 3) / episodes)
    assert not any(k.startswith("tools/__import__") for k in row)  # an invented name makes no metric


def test_evaluation_runs_the_tools_too(scripted, tmp_path):
    seen = []

    def recorded(completions, **kwargs):
        seen.extend(completions)
        return [1.0] * len(completions)

    trainer = scripted_trainer(scripted, tmp_path, recorded)
    metrics = trainer.evaluate(conversations("ok", "unknown"))
    assert metrics["eval_reward"] == 1.0
    ok, unknown = seen  # greedy: one episode per prompt
    assert [m["role"] for m in ok] == ["assistant", "tool", "assistant"] and ok[1]["content"] == "12"
    assert unknown[1]["content"] == "{'error': 'Tool __import__ not found.'}"
    # its tools metrics, as training's over the evaluation's episodes: two calls, the unknown one failed
    assert metrics["eval_tools/call_frequency"] == 1.0 and metrics["eval_tools/failure_frequency"] == 0.5
    assert metrics["eval_tools/multiply/calls"] == 0.5 and metrics["eval_tools/mean_turns"] == 2.0
    logged = [r for r in read_jsonl(os.path.join(trainer.args.output_dir, "metrics.jsonl")) if "eval/reward" in r]
    assert logged[-1]["eval/tools/call_frequency"] == 1.0 and "tools/call_frequency" not in logged[-1]


def test_completion_lengths_count_the_model_s_tokens_only(scripted, tmp_path):
    trainer = scripted_trainer(scripted, tmp_path, lambda completions, **kw: [0.0] * len(completions))
    batch = trainer.generation.generate_and_score(list(range(len(FIRST_TURNS))))
    real = batch.attention_mask[:, batch.prompt_width :]
    tool_tokens = real & ~batch.loss_mask
    big = batch.prompts.index([{"role": "user", "content": "big"}])
    assert not tool_tokens[big].any() and tool_tokens.any(1).sum() == len(batch.prompts) - 2  # all but big's
    ok = batch.prompts.index([{"role": "user", "content": "ok"}])
    turns = len(scripted(FIRST_TURNS["ok"] + f"Done.{END}", add_special_tokens=False)["input_ids"])
    assert batch.loss_mask[ok].sum() == turns  # both turns, nothing of the tool result
    text = scripted.decode(batch.completion_ids[ok][tool_tokens[ok]])
    assert text.startswith("<|im_start|>user\n<tool_response>12</tool_response>")
    # The completions table shows the episode as the policy read it: turns, call, result, special tokens kept.
    assert batch.completions[ok] == FIRST_TURNS["ok"] + text + f"Done.{END}"
    m = trainer.run.metrics.reduce().scalars
    assert m["tools/mean_tool_tokens"] == pytest.approx(tool_tokens.sum().item() / len(batch.prompts))
    assert m["completions/mean_length"] == pytest.approx(batch.loss_mask.sum().item() / len(batch.prompts))


def alternating_reward():
    counter = itertools.count()

    def reward(completions, **kwargs):  # spread within every group, so every advantage is non-zero
        return [float(next(counter) % 2) for _ in completions]

    return reward


def episode_batch(tok, tmp_path, multiply_result: str):
    """A batch of the scripted episodes whose multiply returns `multiply_result`, in float64."""

    def multiply(a: int, b: int) -> str:  # noqa: F811 - the same name, another result text
        """Multiplies two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return multiply_result

    TOOLS[0] = multiply
    try:
        trainer = scripted_trainer(tok, tmp_path, alternating_reward(), dtype=torch.float64, beta=0.0)
        return trainer, trainer.generation.generate_and_score(list(range(len(FIRST_TURNS))))
    finally:
        TOOLS[0] = globals()["multiply"]


def final_hidden_grads(trainer, batch) -> torch.Tensor:
    """d loss / d (final hidden state) at every position, from one real micro-step: at the last layer's output a
    position feeds only the logits of the token after it."""
    captured = []

    def keep(module, inputs, output):
        output.retain_grad()
        captured.append(output)

    handle = trainer.policy.model.norm.register_forward_hook(keep)
    try:
        trainer.micro_step(batch, slice(0, len(batch.input_ids)))
    finally:
        handle.remove()
    (hidden,) = captured
    return hidden.grad


@pytest.mark.slow
def test_tool_results_get_no_gradient_whatever_their_text(scripted, tmp_path):
    grads, masks = [], []
    for result in ("12", "99"):  # the same length, another text
        trainer, batch = episode_batch(scripted, tmp_path / result, result)
        grad = final_hidden_grads(trainer, batch)
        width = batch.prompt_width
        # position width + t - 1 predicts completion token t
        predicts = grad[:, width - 1 : -1].abs().sum(-1)
        real = batch.attention_mask[:, width:]
        tool_tokens = real & ~batch.loss_mask
        assert tool_tokens.any() and (predicts[batch.loss_mask] > 0).any()  # not vacuous: the turns do train
        assert torch.all(predicts[tool_tokens] == 0)  # exactly no gradient through the tool results
        grads.append(grad)
        masks.append(batch.loss_mask)
    # Before the first tool result the episodes are the same and so are their gradients.
    first_tool = int((masks[0] == 0).float().argmax(1).min())
    width = batch.prompt_width
    assert torch.equal(masks[0], masks[1])
    torch.testing.assert_close(grads[0][:, : width + first_tool - 1], grads[1][:, : width + first_tool - 1])


def test_an_episode_s_log_probs_are_its_text_s_scored_in_one_forward(scripted, tmp_path):
    trainer, batch = episode_batch(scripted, tmp_path, "12")
    model, width = trainer.policy, batch.prompt_width
    logprobs = trainer.generation.logprobs(
        model, batch.input_ids, batch.attention_mask, width, batch.completion_ids
    ).double()
    for r in range(len(batch.input_ids)):
        ids = batch.input_ids[r][batch.attention_mask[r]].tolist()
        text = scripted.decode(ids, skip_special_tokens=False)
        again = scripted(text, add_special_tokens=False)["input_ids"]
        assert again == ids  # the episode is its text: nothing was re-tokenized differently
        prompt_len = int(batch.attention_mask[r, :width].sum())
        with torch.no_grad():
            logits = model(torch.tensor([again])).logits[0].double()
        reference = torch.log_softmax(logits, -1)[prompt_len - 1 : -1].gather(
            -1, torch.tensor(again[prompt_len:])[:, None]
        )[:, 0]
        n = len(again) - prompt_len
        mask = batch.loss_mask[r, :n]
        torch.testing.assert_close(logprobs[r, :n][mask], reference[mask], rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "dropped, old, new",
    [
        ("tool calls", "{%- for c in m.tool_calls or [] %}", "{%- for c in [] %}"),
        ("tool messages", "<tool_response>{{ m.content }}</tool_response>", ""),
    ],
)
def test_a_chat_template_that_drops_tool_calls_or_results_is_refused(tmp_path, dropped, old, new):
    tok = tool_chat_tokenizer()
    assert old in tok.chat_template
    tok.chat_template = tok.chat_template.replace(old, new)
    with pytest.raises(ConfigError, match=f"this tokenizer's template drops the {dropped}"):
        GRPOTrainer(
            tool_chat_model(tok), len, config(tmp_path), conversations("x"), processing_class=tok, tools=[multiply]
        )


def test_a_tokenizer_without_response_parsing_is_refused(tmp_path):
    tok = tool_chat_tokenizer()
    tok.response_template = None
    with pytest.raises(ConfigError, match="no response_template"):
        GRPOTrainer(
            tool_chat_model(tok), len, config(tmp_path), conversations("x"), processing_class=tok, tools=[multiply]
        )


def qwen3_tokenizer():
    """The tiny tokenizer with TRL 1.16's copy of Qwen3's chat template (not prefix-preserving: it renders an
    assistant turn's thinking by what follows it) and no response_template, as a Qwen3 checkpoint loads."""
    import importlib.resources

    trl = pytest.importorskip("trl")
    tok = tool_chat_tokenizer()
    tok.chat_template = (importlib.resources.files(trl) / "chat_templates" / "qwen3.jinja").read_text()
    tok.response_template = None
    return tok


def test_a_qwen3_script_runs_with_trl_s_template_helpers_called_in_the_script(monkeypatch, tmp_path):
    # TRL's GRPOTrainer sets the response_template of the chat templates it knows and renders episodes with its
    # prefix-preserving training template. rlhfkit never imports TRL: the script calls the same two helpers.
    from trl.chat_template_utils import add_response_schema, get_training_chat_template

    tok = qwen3_tokenizer()
    qwen_call = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>' + END

    def script(text):
        return f"12{END}" if "<tool_response>" in text else qwen_call

    monkeypatch.setattr(sampling_completions, "generate", scripted_generate(tok, script))
    add_response_schema(tok)
    tok.chat_template = get_training_chat_template(tok)
    template = {"enable_thinking": False}
    args = config(
        tmp_path, max_steps=1, max_prompt_length=800, max_completion_length=200, chat_template_kwargs=template
    )
    trainer = GRPOTrainer(
        tool_chat_model(tok),
        alternating_reward(),
        args,
        conversations("a", "b"),
        processing_class=tok,
        tools=[multiply],
    )  # fmt: skip (Qwen3's tool prompt: 759 characters)
    trainer.train()
    (row,) = [r for r in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "loss" in r]
    assert row["tools/call_frequency"] == 1.0 and row["tools/failure_frequency"] == 0.0


def test_a_qwen3_tokenizer_as_it_loads_trains_with_tools(monkeypatch, tmp_path):
    # As a TRL script gives it, no helpers called: rlhfkit recognises the template's tool-call format (ChatML with
    # <tool_call> JSON) and sets its response_template; the template renders the tool-call turn differently once
    # results follow (an empty <think> block), which does not matter: the turn stays as sampled, and the tool
    # results are the template's tokens after its end-of-turn token.
    tok = qwen3_tokenizer()
    qwen_call = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>' + END
    texts = []

    def script(text):
        texts.append(text)
        return f"12{END}" if "<tool_response>" in text else qwen_call

    monkeypatch.setattr(sampling_completions, "generate", scripted_generate(tok, script))
    args = config(tmp_path, max_steps=1, max_prompt_length=800, max_completion_length=200)
    trainer = GRPOTrainer(tool_chat_model(tok), alternating_reward(), args, conversations("a", "b"),
                          processing_class=tok, tools=[multiply])  # fmt: skip
    assert tok.response_template["start_anchor"] == "<|im_start|>assistant\n"
    trainer.train()
    (row,) = [r for r in read_jsonl(os.path.join(args.output_dir, "metrics.jsonl")) if "loss" in r]
    assert row["tools/call_frequency"] == 1.0 and row["tools/failure_frequency"] == 0.0
    # the second turn read: the sampled call as sampled (no <think> block inserted), then the result and a new turn
    second = next(t for t in texts if "<tool_response>" in t)
    assert (
        qwen_call + "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        in second
    )


def test_a_tool_call_format_rlhfkit_does_not_recognise_is_refused_with_the_fix(tmp_path):
    tok = qwen3_tokenizer()
    tok.chat_template = tok.chat_template.replace("<tool_call>", "<call>").replace("</tool_call>", "</call>")
    with pytest.raises(
        ConfigError, match="no response_template.*nor a chat template whose tool-call format rlhfkit recognises"
    ):
        GRPOTrainer(tool_chat_model(tok), len, config(tmp_path, max_prompt_length=None), conversations("x"),
                    processing_class=tok, tools=[multiply])  # fmt: skip


def test_padding_to_a_multiple_keeps_the_tool_results_out_of_the_loss(scripted, tmp_path):
    masks = []
    for multiple in (None, 64):
        trainer = scripted_trainer(
            scripted, tmp_path / str(multiple), alternating_reward(), pad_to_multiple_of=multiple
        )
        batch = trainer.generation.generate_and_score(list(range(len(FIRST_TURNS))))
        masks.append(batch.loss_mask)
    assert masks[1].shape[1] % 64 == 0 and masks[1].shape[1] > masks[0].shape[1]
    assert torch.equal(masks[1][:, : masks[0].shape[1]], masks[0]) and not masks[1][:, masks[0].shape[1] :].any()


def test_dynamic_sampling_merges_episodes_with_their_tool_masks(scripted, tmp_path):
    calls = itertools.count()

    def first_round_flat(completions, **kwargs):  # round 1: no spread anywhere, so a second round is drawn
        first = next(calls) == 0
        return [0.0 if first else float(i % 2) for i in range(len(completions))]

    trainer = scripted_trainer(scripted, tmp_path, first_round_flat, dynamic_sampling=True)
    prompts = list(range(len(FIRST_TURNS)))
    batch = trainer.generation.generate_and_score(prompts, iter([prompts]))
    assert batch.rounds == 2
    real = batch.attention_mask[:, batch.prompt_width :]
    big = batch.prompts.index([{"role": "user", "content": "big"}])
    tool_tokens = real & ~batch.loss_mask
    assert tool_tokens.any(1).sum() == len(batch.prompts) - 2 and not tool_tokens[big].any()
    for r in range(len(batch.prompts)):  # every tool result lies in the completion, between the policy's turns
        text = scripted.decode(batch.completion_ids[r][tool_tokens[r]])
        assert text == "" or text.startswith("<|im_start|>user\n<tool_response>")


TWO_PROCESS_SCRIPT = """
import sys
from pathlib import Path

from rlhfkit import GRPOTrainer
from rlhfkit.sampling import completions
from tests.tool_chat import scripted_generate, tool_chat_model, tool_chat_tokenizer
from tests.trainers import test_grpo_tools as t

tok = tool_chat_tokenizer()
completions.generate = scripted_generate(tok, t.script)
prompts = list(t.FIRST_TURNS)
args = t.config(
    Path(sys.argv[1]), per_device_train_batch_size=len(prompts), max_steps=1, max_completion_length=800,
    max_tool_calling_iterations=2,
)
trainer = GRPOTrainer(
    tool_chat_model(tok), lambda completions, **kw: [0.0] * len(completions), args, t.conversations(*prompts),
    processing_class=tok, tools=t.TOOLS,
)
trainer.episodes.toolbox.timeout_s = 0.2
trainer.train()
t.release.set()
"""


@pytest.mark.slow
def test_two_processes_pool_the_tool_metrics(tmp_path):
    # 9 prompts x 2 completions, 9 on each process (a group may span them): the same numbers as one process's.
    script = tmp_path / "train_with_tools.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    config = os.path.join(REPO, "examples", "accelerate_configs", "cpu_2proc.yaml")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, str(script), str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    (row,) = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert row["tools/call_frequency"] == pytest.approx(20 / 18)
    assert row["tools/failure_frequency"] == pytest.approx(10 / 20)
    assert row["tools/multiply/failure_frequency"] == pytest.approx(2 / 8)
    assert row["tools/max_turns"] == 3 and row["tools/turn_cap_ratio"] == pytest.approx(2 / 18)
