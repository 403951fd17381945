"""A local chat-completions endpoint (stdlib http.server) whose replies the test chooses, for the
OpenAI-backend and LLM-mutator tests. Not a test module (no test_ prefix)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Callable[[str, dict, int], tuple[int, Any]]


class ChatServer:
    """Answers every POST with `reply(path, body, seen)` -> (HTTP status, JSON payload); `seen`
    counts the requests with this one's messages and model so far, this one included (a
    "fail once, then answer" model needs it). Keeps each request's body and headers, in order.
    """

    def __init__(self, reply: Reply) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    seen = sum(1 for r in server.requests
                               if r.get("messages") == body.get("messages") and r.get("model") == body.get("model"))
                status, payload = reply(self.path, body, seen)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
