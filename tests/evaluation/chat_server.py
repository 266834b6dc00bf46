"""A local OpenAI-compatible chat-completions endpoint (standard library only) for judge tests. Loopback only."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "test-key"


def shown_completions(request: dict) -> tuple[str, str]:
    """(first, second) completion texts as the judge showed them in the user message."""
    user = request["messages"][-1]["content"]
    first = user.split("## Response 0\n", 1)[1].split("\n\n## Response 1\n", 1)[0]
    second = user.split("## Response 1\n", 1)[1].split("\n\n", 1)[0]
    return first, second


class ChatServer:
    """POST /v1/chat/completions answers `reply(request_json)` as the assistant's content (None = null content).

    Requests are recorded in `requests`. A wrong bearer token gets OpenAI's 401 error body; other paths get 404.
    """

    def __init__(self, reply: Callable[[dict], str | None]) -> None:
        self.reply = reply
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects; we always send Content-Length

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                    error = {"message": "Incorrect API key provided.", "type": "invalid_request_error"}
                    return self._send(401, {"error": {**error, "code": "invalid_api_key"}})
                with server._lock:
                    server.requests.append(body)
                content = server.reply(body)
                message = {"role": "assistant", "content": content}
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(server.requests)}",
                        "object": "chat.completion",
                        "created": 1700000000,
                        "model": body["model"],
                        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
                    },
                )

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # keep test output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
