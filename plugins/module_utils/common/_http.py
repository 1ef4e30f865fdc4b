# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bounded HTTP: how every module of this collection asks a server something.

Three rules, in one place, for ``vllm_metrics_info`` (``/metrics``), ``vllm_load_test``
(``/v1/models``, streamed ``/v1/completions``, ``/metrics``) and ``node_readiness_info``
(``/health``, ``/v1/models``):

* Only ``http://`` and ``https://`` URLs, refused before anything is opened: a ``file://`` or
  ``ftp://`` URL is never read (and so never echoed back in an error).
* One overall deadline per request, on the monotonic clock: each socket operation waits at most
  the time left, the clock is checked between reads, and a watchdog shuts the connection down
  when the deadline passes, so a server that drips a byte every few seconds (in its headers or
  its body) cannot hold the caller past it.  (Name resolution is the resolver's own, bounded by
  its configuration.)
* A limit on what is read: an answer whose ``Content-Length`` is above it is refused before its
  body is read, one that grows past it is refused at the limit; nothing larger is ever held.

Proxies from the environment are not used (these are node-local or in-cluster addresses), and
compressed answers are not asked for (``Accept-Encoding: identity``).
Standard library only, no Ansible.
"""

from __future__ import annotations

import http.client
import math
import socket
import ssl
import threading
import time
from urllib.parse import urljoin, urlsplit

SCHEMES = ("http", "https")
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5
_CHUNK = 64 * 1024


def argument_spec(timeout, max_bytes=DEFAULT_MAX_BYTES):
    """The HTTP options a module exposes (``timeout``, ``max_bytes``, ``validate_certs``), for its
    argument_spec: one declaration of their types, the defaults given by the module."""
    return {
        "timeout": {"type": "float", "default": timeout},
        "max_bytes": {"type": "int", "default": max_bytes},
        "validate_certs": {"type": "bool", "default": True},
    }


class HttpError(Exception):
    """Nothing usable came back: a refused URL, a connection error, the deadline, the size limit."""

    def __init__(self, url, what):
        super().__init__(f"{url}: {what}")
        self.url = url
        self.what = what


def check_limits(timeout, max_bytes):
    """ValueError naming the option unless ``timeout`` is a finite positive number of seconds and
    ``max_bytes`` a positive count."""
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a finite number of seconds above 0, got {timeout!r}")
    if not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive number of bytes, got {max_bytes!r}")


def check_url(url):
    """``(scheme, host, port, path with query)`` of an http(s) URL; HttpError for anything else.

    Nothing is opened: a ``file://`` URL is refused by its name, never read."""
    try:
        parts = urlsplit(str(url))
        port = parts.port
    except ValueError as exc:
        raise HttpError(url, f"not a URL ({exc}): give http://HOST[:PORT]/PATH") from None
    if parts.scheme.lower() not in SCHEMES:
        raise HttpError(
            url,
            f"only http:// and https:// URLs are fetched, not {parts.scheme or 'a URL without a scheme'}"
            "://: give the server's http(s) address, for example http://127.0.0.1:8000",
        )
    if not parts.hostname:
        raise HttpError(url, "the URL has no host: give http://HOST[:PORT]/PATH")
    scheme = parts.scheme.lower()
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80), path


class Deadline:
    """Seconds left of one overall budget, on the monotonic clock."""

    def __init__(self, seconds, clock=time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.end = clock() + seconds

    def left(self):
        return max(0.0, self.end - self.clock())

    def expired(self):
        return self.clock() >= self.end


class Response:
    """An open answer: ``status``, ``reason``, ``headers`` (names lowercased), ``url``; its body
    is read with ``read()`` or ``lines()``, both bounded by the deadline and ``max_bytes``."""

    def __init__(self, url, conn, resp, deadline, max_bytes, watchdog):
        self.url, self._conn, self._resp = url, conn, resp
        self._deadline, self._max_bytes, self._watchdog = deadline, max_bytes, watchdog
        self.status, self.reason = resp.status, resp.reason
        self.headers = {k.lower(): v for k, v in resp.getheaders()}
        self._read = 0
        length = self.headers.get("content-length", "").strip()
        if length.isdigit() and int(length) > max_bytes:
            self.close()
            raise HttpError(
                url,
                f"the answer is {int(length)} bytes, above the limit of {max_bytes} bytes (max_bytes): refused unread",
            )

    def _count(self, data):
        self._read += len(data)
        if self._read > self._max_bytes:
            self.close()
            raise HttpError(self.url, f"the answer grew past the limit of {self._max_bytes} bytes (max_bytes): refused")
        return data

    def _step(self, read):
        if self._deadline.expired():
            self.close()
            raise _expired(self.url, self._deadline)
        sock = self._conn.sock
        if sock is not None:
            sock.settimeout(max(0.001, self._deadline.left()))
        try:
            return read()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close()
            raise _failure(self.url, exc, self._deadline) from None

    def _end(self):
        """At the end of the body: an error when it was not the answer's own end."""
        if self._watchdog.fired.is_set() or self._deadline.expired():
            self.close()
            raise _expired(self.url, self._deadline)
        missing = self._resp.length
        if missing:  # http.client's read1 and readline return b"" on a short body
            self.close()
            raise HttpError(self.url, f"the answer ended {missing} bytes short of its Content-Length")

    def read(self):
        """The whole body (bytes)."""
        parts = []
        while True:
            data = self._step(lambda: self._resp.read1(_CHUNK))
            if not data:
                self._end()
                return b"".join(parts)
            parts.append(self._count(data))

    def lines(self):
        """The body line by line (bytes, with their ends), as it streams."""
        while True:
            line = self._step(lambda: self._resp.readline(self._max_bytes - self._read + 1))
            if not line:
                self._end()
                return
            yield self._count(line)

    def close(self):
        self._watchdog.cancel()
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _expired(url, deadline):
    return HttpError(
        url,
        f"no complete answer within {deadline.seconds:g} s (the overall deadline, timeout): "
        "the server is overloaded, hung, or sending too slowly",
    )


def _failure(url, exc, deadline):
    if deadline.expired():
        return _expired(url, deadline)
    return HttpError(url, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class _Watchdog(threading.Timer):
    """Shuts the connection down when the deadline passes; ``fired`` says it did."""

    def __init__(self, deadline, conn):
        super().__init__(deadline.left(), self._fire, (conn,))
        self.daemon = True
        self.fired = threading.Event()

    def _fire(self, conn):
        self.fired.set()
        _shut(conn)


def _shut(conn):
    """End any read in progress on the connection (TLS too: the raw socket under it)."""
    sock = conn.sock
    if sock is not None:
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass


def request(
    method,
    url,
    body=None,
    headers=None,
    timeout=10.0,
    max_bytes=DEFAULT_MAX_BYTES,
    validate_certs=True,
    follow_redirects=False,
):
    """Send one request; return its open ``Response`` (any status: the caller judges it).

    ``timeout`` is the overall deadline of the whole exchange (connect, headers, body, and the
    redirects followed with ``follow_redirects``, GET only). Raises HttpError.
    """
    check_limits(timeout, max_bytes)
    deadline = Deadline(timeout)
    for _hop in range(_MAX_REDIRECTS + 1):
        scheme, host, port, path = check_url(url)
        if scheme == "https":
            context = ssl.create_default_context()
            if not validate_certs:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(host, port, timeout=max(0.001, deadline.left()), context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=max(0.001, deadline.left()))
        watchdog = _Watchdog(deadline, conn)
        watchdog.start()
        try:
            conn.request(method, path, body=body, headers=dict({"User-Agent": "gpufleet.node"}, **(headers or {})))
            if conn.sock is not None:
                conn.sock.settimeout(max(0.001, deadline.left()))
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            watchdog.cancel()
            conn.close()
            raise _failure(url, exc, deadline) from None
        answer = Response(url, conn, resp, deadline, max_bytes, watchdog)
        location = answer.headers.get("location")
        if not (follow_redirects and method == "GET" and answer.status in _REDIRECTS and location):
            return answer
        answer.close()
        url = urljoin(url, location)
    raise HttpError(url, f"more than {_MAX_REDIRECTS} redirects")


def get(url, headers=None, timeout=10.0, max_bytes=DEFAULT_MAX_BYTES, validate_certs=True, follow_redirects=False):
    """``(status, body bytes)`` of a GET, bounded as ``request`` is. Raises HttpError."""
    with request(
        "GET",
        url,
        headers=headers,
        timeout=timeout,
        max_bytes=max_bytes,
        validate_certs=validate_certs,
        follow_redirects=follow_redirects,
    ) as answer:
        return answer.status, answer.read()


def get_text(url, headers=None, timeout=10.0, max_bytes=DEFAULT_MAX_BYTES, validate_certs=True):
    """The body of a GET that must answer 200, as text (UTF-8, undecodable bytes replaced);
    HttpError otherwise, naming the status."""
    status, body = get(url, headers=headers, timeout=timeout, max_bytes=max_bytes, validate_certs=validate_certs)
    if status != 200:
        raise HttpError(url, f"it answered HTTP {status}, not 200")
    return body.decode("utf-8", "replace")
