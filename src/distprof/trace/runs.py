"""Deferred runs: a stretch of one file's events list, cut where one event ends and the next begins, handed to
another core to decode (``TraceStream.batches(defer=True)``, :func:`decode_run`).

A run is the JSON list of its events (bytes) or, for a plain local file, a :class:`Span` of the file that the
worker reads itself. A run that does not decode whole (a cut inside a string, malformed JSON, an unknown phase)
is no answer: the file is then read again on the path that salvages element by element.
"""

from __future__ import annotations

import re
from collections import deque
from typing import NamedTuple

import msgspec

from distprof.trace.events import lean_list_decoder
from distprof.trace.jsonscan import is_utf8
from distprof.trace.source import TraceError, read_span

__all__ = ["RUN_END", "Span", "Tail", "decode_run", "last_run_end", "run_bytes"]

# Where one event ends and the next begins: `}`, a comma, `{`. Stricter than the cutter's cut (a `}` before `]` or
# the end is no run's end), so that a run never reaches into the keys after the events list.
RUN_END = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*(?=\{)")


def last_run_end(buf: bytes) -> tuple[int, int]:
    """Where the last whole event in ``buf`` whose successor has begun ends, and where that successor starts;
    (0, 0) if there is none.

    A candidate inside a string or nested in an event's args is not a boundary; the run cut there then fails
    to decode whole (an unterminated string or object), which :func:`decode_run` reports."""
    w = 1 << 16
    while True:
        lo = max(0, len(buf) - w)
        tail = deque(RUN_END.finditer(buf, lo), maxlen=1)  # the last match
        if tail:
            return tail[0].start() + 1, tail[0].end()
        if lo == 0:
            return 0, 0
        w *= 8


class Tail(NamedTuple):
    """The last events of a file as one run (the JSON list of them), cut where the native decoder found the events
    list's end: reduced where the file is read (it is short, and a small file never starts a pool's workers)."""
    data: bytes


class Span(NamedTuple):
    """A run of whole events in a plain local file, by offsets (``TraceStream.batches(defer=True)``)."""
    path: str
    start: int
    end: int
    ident: tuple[int, int] | None = None  # the file's (device, inode): a file replaced since is not read


def run_bytes(data: bytes | bytearray | Span) -> bytes | bytearray | None:
    """A run's JSON list: the bytes given, or a :class:`Span` read from its file between brackets (None when the
    file can no longer be read as it was)."""
    if not isinstance(data, Span):
        return data
    try:
        return read_span(data.path, data.start, data.end, brackets=True, ident=data.ident)
    except TraceError:
        return None


def decode_run(data: bytes | bytearray | Span, decoder: msgspec.json.Decoder = lean_list_decoder) -> list | None:
    """A run of whole events (``TraceStream.batches(defer=True)``: the JSON list of them, or a :class:`Span` of
    the file) as lean events (or as ``decoder``, a list decoder, decodes them: merge's); None unless all of it
    decodes typed in one call (the file is then read again on the path that salvages element by element)."""
    whole = run_bytes(data)
    if whole is None:
        return None
    try:
        events = decoder.decode(whole)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    return events if whole.isascii() or is_utf8(whole) else None
