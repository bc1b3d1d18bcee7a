"""Showing a trace in the Perfetto UI: ``distprof open PATH`` (:mod:`distprof.cli_open`) and the report's links to it.

Why here: handing a finished trace to a viewer is presentation, the job of ``report/``, and the report's findings
name the same command (:func:`open_command`); the server itself needs only the standard library, so it adds no
import to any layer.

The flow is Perfetto's own ``tools/open_trace_in_ui`` (google/perfetto): serve the file on ``127.0.0.1:9001`` (the
only loopback origin the UI's Content-Security-Policy lets it fetch from, ``ui/src/frontend/index.ts``) with
``Access-Control-Allow-Origin`` set to the UI's origin, and open
``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/NAME&referrer=...``; the UI fetches the URL
(``ui/src/core/trace_stream.ts``: one ``fetch``, its ``Content-Length`` for progress) and the server stops once
the file has been sent. :class:`TraceServer` adds what a browser may also ask for:

- byte ranges (``Range: bytes=a-b``, ``a-``, ``-n``: 206 with ``Content-Range``; unsatisfiable: 416; several
  ranges: the whole file, as RFC 9110 allows), and ``HEAD``;
- the CORS preflight (``OPTIONS``), including Chrome's Private Network Access
  (``Access-Control-Allow-Private-Network``: a public page fetching from loopback);
- a content type by suffix, never ``Content-Encoding`` (the UI inflates ``.gz`` itself).

It serves that one file and nothing else: any other path is 404 (the request path is never mapped to the file
system), only ``GET``/``HEAD``/``OPTIONS`` are answered, and a request whose ``Host`` is not the loopback address
it listens on is refused (403: DNS rebinding). It stops by itself once every byte of the file has been sent (one
whole response, or ranges that together cover it), after ``timeout_s``, or when :meth:`TraceServer.stop` is called
(Ctrl-C in the CLI).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import stat
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["DEFAULT_PORT", "UI_ORIGIN", "TraceServer", "open_command", "ui_link"]

logger = logging.getLogger(__name__)

UI_ORIGIN = "https://ui.perfetto.dev"
DEFAULT_PORT = 9001  # the port the UI may fetch from (its CSP), as tools/open_trace_in_ui uses
HOST = "127.0.0.1"
_CHUNK = 1 << 20
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_TYPES = ((".json", "application/json"), (".gz", "application/gzip"), (".tar", "application/x-tar"))


def ui_link(url: str, origin: str = UI_ORIGIN) -> str:
    """The address that opens the trace at ``url`` in the Perfetto UI at ``origin``."""
    return f"{origin.rstrip('/')}/#!/?url={quote(url, safe=':/')}&referrer=distprof"


def open_command(path: str, ranks: Iterable[Any] = (), steps: Iterable[Any] = (), role: str | None = None,
                 out: str = "finding.tar") -> str:
    """The shell command that opens ``path`` in Perfetto: ``distprof open PATH`` for one trace file, else the
    traces of ``role``, ``ranks`` and ``steps`` archived (``merge --format perfetto``) and opened."""
    q = shlex.quote
    if os.path.isfile(path.removeprefix("file://")):
        return f"distprof open {q(path)}"
    sel = []
    if role:
        sel.append(f"--roles {q(role)}")
    rk = sorted({int(r) for r in ranks if isinstance(r, int) or str(r).isdigit()})
    if rk:
        sel.append("--ranks " + ",".join(map(str, rk)))
    st = sorted({int(s) for s in _flat(steps)})
    if st:
        sel.append("--steps " + ",".join(map(str, st)))
    return " ".join(["distprof merge", q(path), *sel, "--format perfetto -o", q(out), "&& distprof open", q(out)])


def _flat(steps: Iterable[Any]) -> Iterable[int]:
    for s in steps:
        if isinstance(s, (list, tuple)) and len(s) == 2 and all(isinstance(x, int) for x in s):
            yield from range(s[0], min(s[1], s[0] + 64) + 1)  # a window's steps (bounded: a command line, not a list)
        elif isinstance(s, int):
            yield s


def _content_type(name: str) -> str:
    return next((t for suffix, t in _TYPES if name.endswith(suffix)), "application/octet-stream")


class _Covered:
    """Which bytes of the file have been sent, as merged intervals; ``full`` once they cover all of it."""

    def __init__(self, size: int):
        self.size, self.spans = size, []  # type: ignore[var-annotated]
        self.lock = threading.Lock()

    def add(self, start: int, end: int) -> bool:
        with self.lock:
            spans = sorted([*self.spans, (start, end)])
            merged = [spans[0]]
            for a, b in spans[1:]:
                if a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            self.spans = merged
            return merged[0][0] <= 0 and merged[0][1] >= self.size


class TraceServer:
    """Serves the one regular file ``path`` on ``127.0.0.1:port`` to pages of ``origin`` (see the module's
    docstring). ``start()`` binds (OSError when the port is taken), ``wait()`` blocks until it is done and says why
    (``"fetched"``, ``"timeout"``, ``"stopped"``); ``stop()`` ends it. ``port=0`` takes a free port."""

    def __init__(self, path: str, port: int = DEFAULT_PORT, origin: str = UI_ORIGIN, timeout_s: float = 600.0):
        path = os.path.abspath(path.removeprefix("file://"))
        try:
            st = os.stat(path)
        except OSError as e:
            raise ValueError(f"{path}: cannot open ({e.strerror or e}); give a trace file or a merged archive") \
                from None
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file; give one trace file or archive (merge a folder first: "
                             f"distprof merge {shlex.quote(path)} --format perfetto -o merged.tar)")
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--origin {origin}: not an http(s) origin; give one such as {UI_ORIGIN}")
        self.path, self.size = path, st.st_size
        self.name = os.path.basename(path)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        # --timeout 1e300 or inf: as long as the platform can wait (Event.wait overflows past TIMEOUT_MAX)
        self.port = port
        self.timeout_s = timeout_s if timeout_s < threading.TIMEOUT_MAX else threading.TIMEOUT_MAX
        self.requests = 0
        self.reason: str | None = None
        self._covered = _Covered(self.size)
        self._done = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._fd: int | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/{quote(self.name)}"

    @property
    def link(self) -> str:
        return ui_link(self.url, self.origin)

    def start(self) -> TraceServer:
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self._httpd = _Server((HOST, self.port), _handler(self))
        except OSError:
            os.close(self._fd)
            self._fd = None
            raise
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="distprof-open", daemon=True)
        self._thread.start()
        return self

    def wait(self) -> str:
        """Block until the file was fetched whole, ``timeout_s`` passed, or :meth:`stop`; shut down; say which."""
        try:
            if not self._done.wait(self.timeout_s):
                self.reason = self.reason or "timeout"
        finally:
            self.stop()
        return self.reason or "stopped"

    def stop(self, reason: str = "stopped") -> None:
        self.reason = self.reason or reason
        self._done.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _sent(self, start: int, end: int) -> None:
        if self._covered.add(start, end):
            self.reason = self.reason or "fetched"
            self._done.set()

    def _read(self, offset: int, n: int) -> bytes:
        fd = self._fd
        if fd is None:
            return b""
        return os.pread(fd, n, offset)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-body (the UI cancelled, a tab closed) or a request that breaks a handler is
        logged, never a traceback on the terminal (socketserver's default prints one to stderr)."""
        logger.debug("request from %s failed", client_address, exc_info=True)


def _handler(server: TraceServer) -> type[BaseHTTPRequestHandler]:
    want = "/" + quote(server.name)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "distprof-open"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s " + format, self.address_string(), *args)

        def _cors(self) -> None:
            self.send_header("Access-Control-Allow-Origin", server.origin)
            self.send_header("Vary", "Origin")
            self.send_header("Access-Control-Expose-Headers", "Content-Length, Content-Range, Accept-Ranges")
            self.send_header("Cache-Control", "no-cache")

        def _refuse(self, code: int, why: str) -> None:
            body = (why + "\n").encode()
            self.send_response(code)
            self._cors()
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _checked(self) -> bool:
            server.requests += 1
            port = server.port  # the port bound (start() sets it)
            if self.headers.get("Host", "") not in (f"{HOST}:{port}", f"localhost:{port}"):
                self._refuse(403, "wrong host")
                return False
            if urlsplit(self.path).path != want:
                self._refuse(404, "not found")
                return False
            return True

        def do_OPTIONS(self) -> None:
            if not self._checked():
                return
            self.send_response(204)
            self._cors()
            self.send_header("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "Range")
            if self.headers.get("Access-Control-Request-Private-Network") == "true":
                self.send_header("Access-Control-Allow-Private-Network", "true")
            self.send_header("Access-Control-Max-Age", "600")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            if not self._checked():
                return
            size = server.size
            start, end, code = 0, size, 200
            got = self.headers.get("Range")
            if got and "," not in got:
                m = _RANGE.match(got.strip())
                span = _span(m, size) if m else None
                if span is None:
                    self.send_response(416)
                    self._cors()
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                (start, end), code = span, 206
            self.send_response(code)
            self._cors()
            self.send_header("Content-Type", _content_type(server.name))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start))
            if code == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.end_headers()
            if self.command == "HEAD":
                return
            pos = start
            while pos < end:
                data = server._read(pos, min(_CHUNK, end - pos))
                if not data:  # the file shrank, or the server stopped: the client sees a short body
                    return
                self.wfile.write(data)
                pos += len(data)
            self.wfile.flush()
            server._sent(start, end)

        def _unsupported(self) -> None:
            self._refuse(405, "only GET, HEAD and OPTIONS")

        do_POST = do_PUT = do_DELETE = do_PATCH = _unsupported

    return Handler


def _span(m: re.Match[str], size: int) -> tuple[int, int] | None:
    """The half-open byte span of one ``bytes=a-b`` range on a file of ``size`` bytes; None when unsatisfiable."""
    a, b = m.group(1), m.group(2)
    if not a and not b:
        return None
    if not a:  # the last b bytes
        n = _num(b)
        return (max(size - n, 0), size) if n and size else None
    start = _num(a)
    end = min(_num(b) + 1, size) if b else size
    if start >= size or end <= start:
        return None
    return start, end


def _num(digits: str) -> int:
    """A range's number; one of thousands of digits (past int()'s limit) as 2**62, past any file's end."""
    return int(digits) if len(digits) <= 18 else 2**62
