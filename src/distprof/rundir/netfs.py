"""Opening an fsspec URL with bounded waits: an object store that accepts connections and never answers costs a
bounded time per call, never a hang.

Every place distprof reads or writes an fsspec URL gets its filesystem here: the profiler's uploads and its
``run.json`` (:mod:`.store`, on the upload thread), on-demand requests (:mod:`.trigger`), ``check``
(:mod:`.view`) and the analysis's listing and reader. For ``s3://`` (s3fs over botocore) each request waits at
most ``DISTPROF_STORE_TIMEOUT_S`` seconds (default :data:`DEFAULT_TIMEOUT_S`) to connect and as long for each
read of the answer, and is tried :data:`TRIES` times in all (botocore's retries; s3fs's own retry loop, which
multiplies them, is off): a request that gets no answer fails after about ``TRIES x timeout``. Keys the user set
in fsspec's own config (``fsspec.config.conf["s3"]["config_kwargs"]``, e.g. ``read_timeout``) win over these.
Other protocols keep their library's own timeouts.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from distprof.util.envvars import STORE_TIMEOUT

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_TIMEOUT_S", "TRIES", "describe", "is_timeout", "open_url", "timeout_s", "url_to_fs"]

DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 3600.0
TRIES = 2
_BOUNDED = ("s3", "s3a")  # protocols whose library takes the settings below
_TIMEOUT_NAMES = {"ReadTimeoutError", "ConnectTimeoutError", "ReadTimeout", "ConnectTimeout", "FSTimeoutError",
                  "ServerTimeoutError", "TimeoutError"}

_lock = threading.Lock()
_cache: dict[tuple[int, str], Any] = {}
_warned: set[str] = set()


def timeout_s() -> float:
    """Seconds one request may wait to connect, and for each read of its answer (``DISTPROF_STORE_TIMEOUT_S``).
    A value that is not a number in (0, 3600] is named in one warning, and the default is used."""
    raw = os.environ.get(STORE_TIMEOUT)
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if 0 < value <= MAX_TIMEOUT_S:
        return value
    if raw not in _warned:
        _warned.add(raw)
        logger.warning("distprof: %s=%r is not a number of seconds in (0, %g]; using %g", STORE_TIMEOUT, raw[:40],
                       MAX_TIMEOUT_S, DEFAULT_TIMEOUT_S)
    return DEFAULT_TIMEOUT_S


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url and "::" not in url else ""


def _options(protocol: str) -> dict[str, Any]:
    """The filesystem's options: fsspec's config for ``protocol`` with the bounded waits filled in."""
    import fsspec

    conf = dict(fsspec.config.conf.get(protocol, {}))
    conf.pop("skip_instance_cache", None)  # our instances are never fsspec's shared ones (see url_to_fs)
    t = timeout_s()
    conf["config_kwargs"] = {"connect_timeout": t, "read_timeout": t, "retries": {"total_max_attempts": TRIES},
                             **(conf.get("config_kwargs") or {})}
    return conf


def url_to_fs(url: str, fresh: bool = False) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs(url)``, with bounded waits for the protocols that take them (see the module).

    ``fresh``: forget what the filesystem remembers of listings under ``url`` first. Instances live as long as the
    process (fsspec's and ours), and so do their listings: without it, a second ``check`` or analysis in one
    process (a notebook, a driver checking its run after each step) would list files deleted or written since the
    first. Every verb's first look at its folder asks for it; the reads that follow share that one listing."""
    import fsspec

    protocol = _protocol(url)
    if protocol not in _BOUNDED:
        fs, path = fsspec.core.url_to_fs(url)
        if fresh:
            _forget(fs, path)
        return fs, path
    options = _options(protocol)
    key = (os.getpid(), protocol + json.dumps(options, sort_keys=True, default=repr))
    with _lock:
        fs = _cache.get(key)
        if fs is None:
            # An instance of our own (not fsspec's shared one): its retry count is changed below.
            fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
            fs.retries = 1  # s3fs's retry loop around botocore's: off (TRIES counts botocore's attempts)
            if len(_cache) > 64:
                _cache.clear()
            _cache[key] = fs
    path = fs._strip_protocol(url)
    if fresh:
        _forget(fs, path)
    return fs, path


def _forget(fs: Any, path: str) -> None:
    """Drop ``fs``'s cached listings of ``path``, its parents and everything under it (fsspec's
    ``invalidate_cache`` forgets a folder and its parents, not the folders inside it)."""
    fs.invalidate_cache(path)
    cache = getattr(fs, "dircache", None)
    if cache:
        inside = path.rstrip("/") + "/"
        for key in [k for k in list(cache) if isinstance(k, str) and k.startswith(inside)]:
            cache.pop(key, None)


def open_url(url: str, mode: str = "rb"):
    """An open file for ``url`` (see :func:`url_to_fs`)."""
    fs, path = url_to_fs(url)
    return fs.open(path, mode)


def is_timeout(e: BaseException | None) -> bool:
    """A request that got no answer in time (botocore's, aiohttp's, fsspec's or the socket's own timeout)."""
    seen, cur = 0, e
    while cur is not None and seen < 8:
        if any(c.__name__ in _TIMEOUT_NAMES for c in type(cur).__mro__):
            return True
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return False


def describe(e: BaseException) -> str:
    """One line for a failed store call: a timeout says how long was waited and how to wait longer."""
    if is_timeout(e):
        return (f"the object store did not answer within {timeout_s():g} s, tried {TRIES} times; set "
                f"{STORE_TIMEOUT} to wait longer")
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
