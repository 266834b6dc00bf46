"""The built-in agent task (tasks/agent.py, chat_tokenizer.py, agent_build.py): the checker, the calculator's safety
against hostile expressions, the chat template's round trip through transformers' response parsing, the SFT data and
a test-preset build."""

import builtins
import json
import random

import pytest
from transformers import AutoTokenizer

from rlhfkit.agents import ToolBox
from rlhfkit.agents.episodes import ToolEpisodes
from rlhfkit.tasks import TASKS, build_tiny, load_task
from rlhfkit.tasks.agent import TASK, AgentTask, calculator, check, correctness, final_answer, tool_calls
from rlhfkit.tasks.agent_build import AgentPreset, conversation, encode_conversation, is_longest, sft_examples
from rlhfkit.tasks.chat_tokenizer import END, build_chat_tokenizer

PROMPT = [{"role": "user", "content": "1234*567"}]


def call_message(expression: str = "1234*567") -> dict:
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def episode(answer: str) -> list[dict]:
    return [call_message(), {"role": "tool", "name": "calculator", "content": "699678"}, answer_message(answer)]


def answer_message(text: str) -> dict:
    return {"role": "assistant", "content": text}


# --- the checker and rewards ------------------------------------------------------------------------------------


def test_check_reads_the_last_assistant_message():
    assert 1234 * 567 == 699678
    assert check(PROMPT, episode("699678")) and check(PROMPT, [answer_message(" 699678 ")])
    assert check("1234*567", episode("699678"))  # the user's message alone is a prompt too
    assert not check(PROMPT, episode("699679"))
    assert not check(PROMPT, [answer_message("699678"), answer_message("1")])  # the last message counts
    assert not check(PROMPT, episode("699678")[:1])  # ended on a call: no answer
    assert not check(PROMPT, episode("699678")[:2])  # ended on the tool's result
    assert not check(PROMPT, [])


def test_check_of_an_episodes_decoded_text_reads_its_last_line():
    """The trainers' task_success reads an episode's decoded text (special tokens kept with tools, removed without):
    the last turn is its last line."""
    tok = build_chat_tokenizer()
    messages = PROMPT + episode("699678")
    ids = tok.apply_chat_template(messages, tools=[calculator], tokenize=True, return_dict=False)
    head = tok.apply_chat_template(
        PROMPT, tools=[calculator], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text = tok.decode(ids[len(head) :], skip_special_tokens=True)
    assert check(PROMPT, text) and final_answer(text) == "699678"
    kept = tok.decode(ids[len(head) :], skip_special_tokens=False)  # GRPO's and PPO's texts of episodes
    assert (
        kept.endswith("699678<|im_end|>\n") and check(PROMPT, kept) and not check(PROMPT, kept.replace("678<", "67<"))
    )
    assert not check(PROMPT, text.replace("\n699678", "\n699670"))
    assert not check(PROMPT, text.rpartition("\nassistant")[0])  # cut before the answer
    assert check(PROMPT, "699678") and not check(PROMPT, "69967")


def test_answer_is_rederived_and_foreign_prompts_are_refused():
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = TASK.make_example(rng)
        a, b = prompt.split("*")
        assert answer == str(int(a) * int(b)) and 3 <= len(a) <= 4 and 2 <= len(b) <= 3
        assert TASK.answer([{"role": "user", "content": prompt}]) == answer
    for bad in ["sort 123=", "12+3", "__import__('os')*2", [{"role": "system", "content": "1*2"}]]:
        with pytest.raises(ValueError):
            TASK.answer(bad)


def test_rewards_take_trl_conversational_completions():
    assert correctness([PROMPT, PROMPT], [episode("699678"), [answer_message("7")]]) == [1.0, 0.0]
    assert tool_calls(episode("1")) == 1 and tool_calls([answer_message("1")]) == 0


def test_registered_and_loaded_with_its_tools(tmp_path):
    assert isinstance(TASKS["agent"], AgentTask) and TASKS["agent"].tools == (calculator,)
    meta = {"name": "agent", "check": TASK.refs["check"], "reward_funcs": {"correctness": TASK.refs["correctness"]}}
    (tmp_path / "task.json").write_text(json.dumps(meta))
    task = load_task(tmp_path)
    assert isinstance(task, AgentTask) and task.tools == (calculator,) and task.check is check


# --- the calculator ----------------------------------------------------------------------------------------------


def test_calculator_computes_exactly():
    assert calculator("1234*567") == "699678"
    assert calculator(" 12 + 30 ") == "42" and calculator("3-50") == "-47"
    assert calculator("999999999999*999999999999") == str(999999999999**2)


@pytest.mark.parametrize(
    "hostile",
    [
        "9" * 13 + "*2",  # a huge number
        "9" * 5000,
        "2**99999999",  # exponentiation (would be huge)
        "((((((1))))))*2",  # nested parentheses
        "(1+2)*3",
        "1*2*3",  # more than one operator
        "__import__('os').system('true')",  # names, calls, dunders
        "().__class__.__bases__[0]",
        "x*y",
        "1e9*2",
        "1_000*2",
        "١٢*3",  # digits outside ASCII
        "1*2; import os",
        "",
    ],
)
def test_calculator_refuses_hostile_expressions(hostile, monkeypatch):
    """Refused with a ValueError, never evaluated: eval, exec and compile are booby-trapped for the call."""

    def trap(*args, **kwargs):
        raise AssertionError("the calculator evaluated its input")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, trap)
    with pytest.raises(ValueError):
        calculator(hostile)


def test_calculator_refusals_become_bounded_tool_errors():
    """Through the trainers' ToolBox: a refused expression, a wrong argument type or name is an {'error': ...} tool
    message and a failure; the run goes on."""
    box = ToolBox([calculator])
    calls = [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "9" * 5000}}},
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": 12}}},
        {"type": "function", "function": {"name": "__import__", "arguments": {"name": "os"}}},
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}},
    ]
    results = box.run(calls)
    assert [r.failed for r in results] == [True, True, True, False]
    assert all("error" in r.content and len(r.content) < 700 for r in results[:3])
    assert results[3].content == "42"


# --- the chat template -------------------------------------------------------------------------------------------


def test_template_round_trip_through_parse_response(tmp_path):
    """A call turn rendered by the template parses back to the same call (after a save/load round trip, which must
    keep the response_template); the template is prefix-preserving and passes the trainers' template check."""
    build_chat_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.response_template is not None and tok.eos_token == END
    messages = PROMPT + episode("699678")
    full = tok.apply_chat_template(messages, tools=[calculator], tokenize=True, return_dict=False)
    head = tok.apply_chat_template(
        PROMPT, tools=[calculator], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert full[: len(head)] == head
    turn = full[len(head) : full.index(tok.eos_token_id, len(head)) + 1]
    parsed = tok.parse_response(turn, prefix=head, tools=[calculator])
    assert parsed["tool_calls"] == [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1234*567"}}}
    ]
    answer_turn = tok("699678" + END, add_special_tokens=False)["input_ids"]
    assert tok.parse_response(answer_turn, prefix=head, tools=[calculator])["content"].startswith("699678")
    text = tok.apply_chat_template(messages, tools=[calculator], tokenize=False)
    assert "Tools: calculator(expression)" in text and "<tool_response>699678</tool_response>" in text
    episodes = ToolEpisodes(tok, ToolBox([calculator]), 2, 96)  # refuses templates that drop calls or results
    assert tok.decode(episodes.suffix_ids([{"role": "tool", "name": "calculator", "content": "5"}])) == (
        "\n<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_call_turn_is_short():
    """The call's fixed JSON is one token each side: a call turn is its expression plus 5 tokens."""
    tok = build_chat_tokenizer()
    turn = '<tool_call>{"name": "calculator", "arguments": {"expression": "1234*567"}}</tool_call>' + END
    assert len(tok(turn, add_special_tokens=False)["input_ids"]) == len("1234*567") + 5
    assert tok.decode(tok(turn, add_special_tokens=False)["input_ids"]) == turn


# --- the SFT data ------------------------------------------------------------------------------------------------


def test_sft_conversation_trains_the_assistant_turns_only():
    tok = build_chat_tokenizer()
    ids, trained = encode_conversation(tok, conversation("1234*567", True), [calculator])
    taught = tok.decode([t for t, keep in zip(ids, trained) if keep])
    assert taught == (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1234*567"}}</tool_call><|im_end|>699678<|im_end|>'
    )
    ids, trained = encode_conversation(tok, conversation("1234*567", True), [calculator], decide=False)
    assert tok.decode([t for t, keep in zip(ids, trained) if keep]) == taught.removeprefix("<tool_call>")
    ids, trained = encode_conversation(tok, conversation("1234*567", False), [calculator])
    assert tok.decode([t for t, keep in zip(ids, trained) if keep]) == "699678<|im_end|>"
    messages = conversation("1234*567", True)
    assert messages[2] == {"role": "tool", "name": "calculator", "content": "699678"}  # the real tool's result


def test_sft_demonstrations_call_the_tool_by_class():
    """The share of demonstrations that decide to call is the class's; every prompt answered directly also gets a
    tool conversation whose decision token is not trained."""
    cfg = AgentPreset(tool_share_longest=0.8, tool_share_other=0.15)
    prompts = TASK.make_prompts(4000, random.Random(1))
    demos = sft_examples(prompts, cfg, random.Random(2))
    decided = {d.messages[0]["content"]: len(d.messages) > 2 for d in demos if d.decide}
    assert len(decided) == len(prompts)
    longest = [decided[p] for p in prompts if is_longest(p)]
    other = [decided[p] for p in prompts if not is_longest(p)]
    assert 0.75 < sum(longest) / len(longest) < 0.85 and 0.12 < sum(other) / len(other) < 0.18
    reading = [d for d in demos if not d.decide]
    assert len(reading) == len(prompts) - sum(decided.values()) and all(len(d.messages) == 4 for d in reading)
    assert is_longest("1234*567") and not is_longest("123*567") and not is_longest("1234*56")


def test_test_preset_build(tmp_path):
    from datasets import load_from_disk

    meta = build_tiny(tmp_path / "agent", preset="test", task="agent", log=lambda *a: None)
    assert meta["tools"] == ["rlhfkit.tasks.agent:calculator"] and "reward" not in meta
    assert 0.0 <= meta["sft"]["greedy_first_turn_tool_call_rate"] <= 1.0
    prompts = load_from_disk(str(tmp_path / "agent" / "prompts"))
    row = prompts["test"][0]
    assert row["prompt"][0]["role"] == "user" and check(row["prompt"], [answer_message(row["answer"])])
    task = load_task(tmp_path / "agent")
    assert isinstance(task, AgentTask) and task.tools == (calculator,)
    tok = AutoTokenizer.from_pretrained(tmp_path / "agent" / "sft")
    assert tok.response_template is not None
