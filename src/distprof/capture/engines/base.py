"""One small interface over a rollout engine's profiler, and what every adapter shares (HTTP, the file scan).

An adapter never hangs and never trusts the engine: every request has a timeout, a reply is read up to
``REPLY_LIMIT`` bytes and only its status is believed, and a trace is taken only when it is a regular file
directly inside the folder the engine was told (or is known) to write to, whose name is one of the engine's
trace names (capture/engines/contract.py).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import urllib.error
import urllib.request
from typing import Any

from distprof.capture.engines.contract import CONTRACTS, parse_ranks
from distprof.config.engine import EngineConfig

logger = logging.getLogger(__name__)

__all__ = ["REPLY_LIMIT", "EngineAdapter", "EngineError"]

REPLY_LIMIT = 64 << 10  # bytes of a reply read at most


class EngineError(Exception):
    """The engine refused, failed or did not answer in time (one line: what and why)."""


class EngineAdapter:
    """start(window, out_dir); stop(); wait_flush(timeout_s) -> files; describe() -> {engine, version, replica}.

    Over HTTP when ``config.url`` is set, else through ``handle`` (an object with ``start_profile()`` /
    ``stop_profile()``, e.g. ``vllm.LLM``). Subclasses say how a start is asked (:meth:`_start_body`,
    :meth:`_start_kwargs`) and where the files go (:meth:`out_dir_for`)."""

    kind = ""

    def __init__(self, config: EngineConfig, handle: Any = None, replica: int = 0):
        if config.url is None and handle is None:
            raise ValueError(f"engine {config.kind}: neither url nor an attached handle; set engine.url or call "
                             "distprof.capture.engines.attach(profiler, handle)")
        self.config, self.handle, self.replica = config, handle, replica
        self.contract = CONTRACTS[self.kind]
        self._session: _Session | None = None
        self._version: str | None = config.version

    # ---- the interface ------------------------------------------------------------------------------------
    def start(self, window: tuple[int, int], out_dir: str, timeout_s: float | None = None) -> _Session:
        """Ask the engine to start profiling into ``out_dir``; the request may take ``timeout_s`` (default
        ``request_timeout_s``). Returns the window's session (for :meth:`stop` and :meth:`wait_flush`)."""
        os.makedirs(out_dir, exist_ok=True)
        self._session = _Session(out_dir, set(_names(out_dir)))
        if self.config.url is not None:
            if self._version is None:
                self._version = self._query_version()
            status, body = self._request(self.contract.start_path, self._start_body(out_dir),
                                         timeout_s or self.config.request_timeout_s)
            if status != 200:
                raise EngineError(f"{self.kind} {self.contract.start_path} answered {status}: {_shown(body)}")
        else:
            try:
                self.handle.start_profile(**self._start_kwargs(out_dir))
            except Exception as e:  # the engine's own failure, in one line
                raise EngineError(f"{self.kind} start_profile() failed: {type(e).__name__}: {_shown(str(e))}") from None
        return self._session

    def stop(self, session: _Session | None = None) -> _Session | None:
        """Ask the engine to stop and write its traces, on a daemon thread: returns at once, with the window's
        session (for :meth:`wait_flush`, when the next window may start before this one's flush ends).
        ``session``: the window's, as :meth:`start` returned it (default: the last one started)."""
        sess = session or self._session
        if sess is not None:
            threading.Thread(target=self._stop, args=(sess,), name=f"distprof-{self.kind}-stop", daemon=True).start()
        return sess

    def wait_flush(self, timeout_s: float, session: _Session | None = None) -> list[str]:
        """The traces the engine wrote for the window (absolute paths) once it has stopped; EngineError when it
        failed, or did not finish within ``timeout_s`` seconds. ``session``: what :meth:`stop` returned (default:
        the last window)."""
        sess = session or self._session
        if sess is None:
            raise EngineError(f"{self.kind}: no profiling was started")
        if not sess.done.wait(timeout_s):
            raise EngineError(f"{self.kind} did not finish writing its traces within {timeout_s:g} s "
                              "(engine.flush_timeout_s)")
        if sess.error is not None:
            raise EngineError(sess.error)
        return self._new_files(sess)

    def describe(self) -> dict[str, Any]:
        return {"engine": self.kind, "version": self._version, "replica": self.replica}

    # ---- per engine -----------------------------------------------------------------------------------------
    def out_dir_for(self, window: tuple[int, int], default_root: str) -> str:
        raise NotImplementedError

    def _start_body(self, out_dir: str) -> dict[str, Any] | None:
        return None

    def _start_kwargs(self, out_dir: str) -> dict[str, Any]:
        return {}

    def _version_of(self, reply: Any) -> str | None:
        return reply.get("version") if isinstance(reply, dict) and isinstance(reply.get("version"), str) else None

    # ---- shared ---------------------------------------------------------------------------------------------
    def _stop(self, sess: _Session) -> None:
        try:
            if self.config.url is not None:
                # the wait in wait_flush is what bounds the flush; the request outlives it, so a slow flush reads
                # as one (flush_timeout), not as a failed request
                status, body = self._request(self.contract.stop_path, None,
                                             self.config.flush_timeout_s + self.config.request_timeout_s)
                if status != 200 and not (self.config.iterations and self._new_files(sess)):
                    sess.error = f"{self.kind} {self.contract.stop_path} answered {status}: {_shown(body)}"
            else:
                self.handle.stop_profile()
        except EngineError as e:
            sess.error = str(e)
        except Exception as e:  # an in-process engine's own failure
            sess.error = f"{self.kind} stop_profile() failed: {type(e).__name__}: {_shown(str(e))}"
        finally:
            sess.done.set()

    def _new_files(self, sess: _Session) -> list[str]:
        out, d = [], sess.out_dir
        for name in sorted(set(_names(d)) - sess.before):
            path = os.path.join(d, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if parse_ranks(self.kind, name) is None:
                continue  # the vLLM front end's trace, SGLang's merged file, a memory snapshot: not a rank's trace
            if not stat.S_ISREG(st.st_mode):
                logger.warning("distprof: %s trace %r in %s is not a regular file (a link?); not taken",
                               self.kind, name, d)
                continue
            out.append(path)
        return out

    def _request(self, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.config.url}{path}", data=data, method=self.contract.method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read(REPLY_LIMIT)
        except urllib.error.HTTPError as e:
            try:
                text = e.read(REPLY_LIMIT)
            except Exception:
                text = b""
            return e.code, text
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise EngineError(f"{self.kind} at {self.config.url}{path}: {_shown(str(reason))}") from None

    def _query_version(self) -> str | None:
        try:
            req = urllib.request.Request(f"{self.config.url}{self.contract.version_path}", method="GET")
            with urllib.request.urlopen(req, timeout=self.config.request_timeout_s) as r:
                return self._version_of(json.loads(r.read(REPLY_LIMIT)))
        except Exception:  # no version route, garbage, a timeout: the version stays unknown
            return None


class _Session:
    """One window's profiling: where the engine writes, what was there before, how its stop ended."""

    def __init__(self, out_dir: str, before: set[str]):
        self.out_dir, self.before = out_dir, before
        self.done = threading.Event()
        self.error: str | None = None


def _names(d: str) -> list[str]:
    try:
        return os.listdir(d)
    except OSError:
        return []


def _shown(text: Any, limit: int = 160) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else "?" for c in str(text).strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."
