"""The OpenAI-compatible judge against a chat-completions server on 127.0.0.1 (no other network)."""

import socket

import pytest

from rlhfkit.errors import JudgeError
from rlhfkit.evaluation import OpenAIJudge, Outcome, make_judge, parse_index, tally

from .chat_server import API_KEY, ChatServer, shown_completions


@pytest.fixture(autouse=True)
def _key_and_loopback(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # a proxy from the environment must not see loopback
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def prefers_good(request):
    """A perfect judge: answers the label of the shown completion that contains GOOD."""
    first, _ = shown_completions(request)
    return "0" if "GOOD" in first else "1"


def test_answers_are_mapped_back_through_the_random_order():
    n = 24
    prompts = [f"question {i}" for i in range(n)]
    # The model (A) has the good completion on even prompts, the baseline (B) on odd ones.
    a = [f"GOOD model {i}" if i % 2 == 0 else f"BAD model {i}" for i in range(n)]
    b = [f"BAD base {i}" if i % 2 == 0 else f"GOOD base {i}" for i in range(n)]
    with ChatServer(prefers_good) as server:
        verdicts = OpenAIJudge("judge-model", base_url=server.url, seed=0).judge(prompts, a, b)
    assert [v.outcome for v in verdicts] == [Outcome.A if i % 2 == 0 else Outcome.B for i in range(n)]
    # Both orders were used, and each verdict records the order the server really saw.
    shown_first = {shown_completions(r)[0]: r for r in server.requests}
    assert len(server.requests) == n
    for i, v in enumerate(verdicts):
        assert (a[i] in shown_first) == v.a_shown_first
    assert 0 < sum(v.a_shown_first for v in verdicts) < n
    assert all(v.raw in ("0", "1") for v in verdicts)


def test_position_bias_cancels_and_the_order_is_seeded():
    n = 32
    prompts, a, b = [f"q{i}" for i in range(n)], [f"a{i}" for i in range(n)], [f"b{i}" for i in range(n)]
    with ChatServer(lambda request: "0") as server:  # always picks whatever is shown first
        first = OpenAIJudge("m", base_url=server.url, seed=1).judge(prompts, a, b)
        again = OpenAIJudge("m", base_url=server.url, seed=1).judge(prompts, a, b)
        other = OpenAIJudge("m", base_url=server.url, seed=2).judge(prompts, a, b)
    assert [v.outcome is Outcome.A for v in first] == [v.a_shown_first for v in first]
    assert first == again
    assert [v.a_shown_first for v in other] != [v.a_shown_first for v in first]
    w = tally(first, "openai:m")
    assert (w.first_shown_picks, w.first_shown_decisive) == (n, n)  # the report exposes the bias
    assert 0.3 < w.rate < 0.7  # ...which the random order cancels: neither side is favoured


def test_request_carries_model_prompt_and_both_completions():
    with ChatServer(lambda request: "1") as server:
        OpenAIJudge("gpt-judge", base_url=server.url).judge(["What is 2+2?"], ["4"], ["5"])
    (request,) = server.requests
    assert request["model"] == "gpt-judge"
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert "What is 2+2?" in request["messages"][1]["content"]
    assert set(shown_completions(request)) == {"4", "5"}


def test_malformed_answers_are_counted_with_their_text():
    replies = {"p0": "1", "p1": "Response 1 is better.", "p2": "**0**", "p3": "", "p4": None, "p5": "2", "p6": " 0.\n"}

    def reply(request):
        return replies[request["messages"][1]["content"].split("## Prompt\n", 1)[1].split("\n", 1)[0]]

    prompts = list(replies)
    with ChatServer(reply) as server:
        verdicts = OpenAIJudge("m", base_url=server.url).judge(prompts, [f"x{i}" for i in range(7)], ["y"] * 7)
    malformed = [v.raw for v in verdicts if v.outcome is Outcome.MALFORMED]
    assert malformed == ["Response 1 is better.", "", "", "2"]
    w = tally(verdicts, "openai:m")
    assert (w.judged, w.malformed, w.total) == (3, 4, 7)
    assert w.malformed_examples == ("Response 1 is better.", "", "")


@pytest.mark.parametrize(
    ("answer", "index"), [("0", 0), ("1", 1), (" 1\n", 1), ("**0**", 0), ("'1'.", 1), ("01", None), ("one", None)]
)
def test_parse_index(answer, index):
    assert parse_index(answer) == index


def test_identical_completions_tie_without_asking():
    with ChatServer(prefers_good) as server:
        verdicts = OpenAIJudge("m", base_url=server.url).judge(["p", "q"], ["same", "GOOD"], ["same", "BAD"])
    assert [v.outcome for v in verdicts] == [Outcome.TIE, Outcome.A]
    assert len(server.requests) == 1


def test_unreachable_server_names_the_url():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    judge = OpenAIJudge("m", base_url=url, max_retries=0, timeout=5)
    with pytest.raises(JudgeError, match=f"could not reach the judge at {url}.*--judge_base_url"):
        judge.judge(["p"] * 20, ["a"] * 20, ["b"] * 20)


def test_rejected_key_and_unknown_route_are_clear(monkeypatch):
    with ChatServer(prefers_good) as server:
        monkeypatch.setenv("MY_JUDGE_KEY", "wrong")
        judge = OpenAIJudge("m", base_url=server.url, api_key_env="MY_JUDGE_KEY", max_retries=0)
        with pytest.raises(JudgeError, match="refused the API key from \\$MY_JUDGE_KEY \\(HTTP 401"):
            judge.judge(["p"], ["a"], ["b"])
        no_v1 = OpenAIJudge("m", base_url=server.url[: -len("/v1")], max_retries=0)
        with pytest.raises(JudgeError, match="answered 404 for model 'm'.*/v1"):
            no_v1.judge(["p"], ["a"], ["b"])


def test_missing_key_variable_names_it_and_the_flag(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(JudgeError, match="OPENAI_API_KEY, which is not set.*--judge_api_key_env"):
        make_judge("openai:gpt-4o-mini", task_dir=lambda: None, base_url="http://127.0.0.1:9/v1")
