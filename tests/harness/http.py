# SPDX-License-Identifier: GPL-3.0-or-later
"""HTTP servers for tests: answers from a table of routes, and a fake vLLM /metrics."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHTTP:
    """A local HTTP server (a thread) answering GETs from `routes`: {path: body}, where body is
    text, a (status, text) pair, or a callable taking the request handler and returning either.
    Unknown paths answer 404.  ``url``, ``port``, ``requests`` (paths asked, in order); use as a
    context manager or call close()."""

    def __init__(self, routes=None, host="127.0.0.1"):
        self.routes = dict(routes or {})
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                answer = outer.routes.get(self.path, (404, ""))
                if callable(answer):
                    answer = answer(self)
                status, body = answer if isinstance(answer, tuple) else (200, answer)
                body = body if isinstance(body, bytes) else str(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.server_address = self.httpd.server_address
        self.port = self.server_address[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class MetricsServer(FakeHTTP):
    """A fake vLLM: /metrics answers the texts of `texts` in turn, the last one for good (a list
    the test may replace at any time, here or on `source`, an object with a `texts` attribute);
    /health answers 200."""

    def __init__(self, texts=("",), host="127.0.0.1", source=None):
        self.texts = list(texts)
        self.source = source if source is not None else self
        super().__init__({"/metrics": self._next, "/health": ""}, host)

    def _next(self, _handler):
        texts = self.source.texts
        return texts.pop(0) if len(texts) > 1 else texts[0]
