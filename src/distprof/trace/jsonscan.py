"""Scanning JSON without trusting it: where a value ends, the members of the top object, why a value failed.

The reader (:mod:`.reader`) and its element cutter (:mod:`.cutter`) ask these where a value ends in bytes that
may be cut off, malformed or nested too deep: msgspec answers at C speed and its answer is checked; a value too
deep for msgspec is scanned with a counter, never recursion, and a fixed amount of work
(:class:`Malformed` past it).
"""

from __future__ import annotations

import re

import msgspec

from distprof.trace.events import HEAD_KEYS

__all__ = ["WS", "Malformed", "failure", "is_utf8", "members", "reason", "skip_sep", "skip_ws", "value_end", "what"]

WS = b" \t\r\n"
_SKIP_WS = re.compile(rb"[ \t\r\n]*")
_SKIP_SEP = re.compile(rb"[ \t\r\n,]*")  # between members or elements (a stray comma is tolerated)
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)  # one whole JSON string, escapes included
_TOKEN = re.compile(rb'[\[{]+|[\]}]+|"|,')  # what the tolerant scanner looks at: runs of brackets, strings, commas
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_BYTE = re.compile(r"\(byte (\d+)\)")
_raw_decoder = msgspec.json.Decoder(msgspec.Raw)
_SCAN_BUDGET = 1_000_000  # tokens the tolerant scanner takes for one value (about a second) before giving up


def skip_ws(buf: bytes, i: int) -> int:
    """Where the whitespace from ``i`` ends."""
    m = _SKIP_WS.match(buf, i)
    return m.end() if m else i


def skip_sep(buf: bytes, i: int) -> int:
    """Where the whitespace and commas from ``i`` end (between members or elements a stray comma is tolerated)."""
    m = _SKIP_SEP.match(buf, i)
    return m.end() if m else i


class Malformed(Exception):
    """The JSON value being scanned is malformed; ``at`` is where msgspec (or the scanner) gave up."""

    def __init__(self, at: int):
        super().__init__(at)
        self.at = at


def _scan_value(buf: bytes, i: int) -> int | None:
    """Where the JSON value starting at ``i`` ends (only strings and brackets are tracked), or None if the bytes
    end inside it. For values msgspec cannot place because they nest too deep: nesting is a counter here, never
    recursion, and a run of brackets is one step. Raises :class:`Malformed` past a fixed amount of work."""
    depth = 0
    for _ in range(_SCAN_BUDGET):
        m = _TOKEN.search(buf, i)
        if m is None:
            return None
        s, e = m.span()
        c = buf[s]
        if c == 0x22:  # "
            sm = _STRING.match(buf, s)
            if sm is None:
                return None
            i = sm.end()
            if depth == 0:
                return i
        elif c == 0x2C:  # ,
            if depth == 0:
                return s  # a scalar ends before the comma
            i = e
        elif c in b"[{":
            depth += e - s
            i = e
        else:
            if e - s >= depth:
                return s + depth  # the value's last closer (or, for a scalar, the enclosing array's)
            depth -= e - s
            i = e
    raise Malformed(i)


def value_end(buf: bytes, i: int, deep: bool = True, final: bool = False) -> int | None:
    """Where the JSON value starting at ``i`` ends, or None if the bytes end inside it; raises
    :class:`Malformed` when it is not JSON.

    msgspec finds the end at C speed (it reports the trailing characters after a whole value), and its
    answer is checked; a value too deep for msgspec goes to :func:`_scan_value` (unless ``deep`` is False).
    ``final``: no bytes follow ``buf`` (a number at its end is whole).
    """
    view = memoryview(buf)[i:]
    try:
        _raw_decoder.decode(view)
    except msgspec.DecodeError as e:
        msg = str(e)
        m = _TRAILING.search(msg)
        if m:
            end = min(int(m.group(1)) - 1, len(view))  # the trailing byte (msgspec counts from 1 here)
            while end > 0 and view[end - 1] in WS:
                end -= 1
            try:
                _raw_decoder.decode(view[:end])
                return i + end
            except (msgspec.DecodeError, RecursionError):
                raise Malformed(i) from None
        if "truncated" in msg:
            return None
        m = _BYTE.search(msg)
        raise Malformed(i + int(m.group(1)) if m else i) from None
    except RecursionError:
        if not deep:
            raise Malformed(i) from None
        return _scan_value(buf, i)
    # The rest is one whole value: a container or string is complete; a number may go on in the next bytes.
    end = len(view)
    while end > 0 and view[end - 1] in WS:
        end -= 1
    return i + end if end and (final or view[end - 1] in b'}]"') else None


def what(first: int) -> str:
    """The kind of JSON value that starts with byte ``first`` (for messages)."""
    if first == 0x7B:
        return "an object"
    if first == 0x5B:
        return "a list"
    if first == 0x22:
        return "a string"
    if first in b"-0123456789":
        return "a number"
    if first in b"tf":
        return "a boolean"
    if first == 0x6E:
        return "null"
    return "not JSON"


def members(buf: bytes, i: int, header: bool, final: bool = False) -> tuple[str, int, list[tuple[str, bytes]]]:
    """The complete ``"key": value`` members of the top object from ``i``: (state, position, used members).

    States: ``more`` (the bytes end inside the member starting at position), ``closed`` (the object ended
    just before position), ``events`` (header: traceEvents opens its list; position is just after the
    ``[``), ``notlist`` (header: traceEvents is not a list; position is its value), ``bad`` (not JSON at
    position). Keys and values are scanned, not trusted: a nested ``traceEvents`` or one inside a string
    is never taken for the top-level key. Only the keys reading uses are returned (with their value bytes).
    """
    found: list[tuple[str, bytes]] = []
    n = len(buf)
    while True:
        i = skip_sep(buf, i)
        if i >= n:
            return "more", i, found
        c = buf[i]
        if c == 0x7D:  # }
            return "closed", i + 1, found
        if c != 0x22:
            return "bad", i, found
        m = _STRING.match(buf, i)
        if m is None:
            return "more", i, found
        key_raw = buf[i + 1:m.end() - 1]
        j = skip_ws(buf, m.end())
        if j >= n:
            return "more", i, found
        if buf[j] != 0x3A:  # :
            return "bad", j, found
        j = skip_ws(buf, j + 1)
        if j >= n:
            return "more", i, found
        key = key_raw.decode("utf-8", "replace") if b"\\" not in key_raw else _unescape(key_raw)
        if header and key == "traceEvents":
            return ("events", j + 1, found) if buf[j] == 0x5B else ("notlist", j, found)
        try:
            end = value_end(buf, j, final=final)
        except Malformed as e:
            return "bad", e.at, found
        if end is None:
            return "more", i, found
        if end <= j:
            return "bad", j, found
        if key in HEAD_KEYS:
            found.append((key, buf[j:end]))
        i = max(end, j + 1)


def _unescape(key_raw: bytes) -> str:
    try:
        return msgspec.json.decode(b'"' + key_raw + b'"', type=str)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return ""


def reason(e: Exception) -> str:
    """A short reason an element is not an event, from msgspec's message."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, Malformed):
        return "not valid JSON"
    if isinstance(e, UnicodeDecodeError):
        return "invalid UTF-8"
    msg = str(e)
    if not isinstance(e, msgspec.ValidationError):
        return "not valid JSON"
    text, _, where = msg.partition(" - at `")
    where = where.rstrip("`")
    text = text[:1].lower() + text[1:]
    if where in ("$", ""):
        return f"not an event object ({text})"
    return f"`{where.removeprefix('$.').removeprefix('$')}`: {text}"


def is_utf8(data) -> bool:
    try:
        str(data, "utf-8")
        return True
    except UnicodeDecodeError:
        return False


def failure(e: Exception, buf: bytes, start: int, end: int) -> tuple[str, int | None]:
    """Why decoding ``[`` + ``buf[start:end]`` + ``]`` failed: ``("end", k)`` the events list closed at ``buf[k]``
    (the keys after the events follow), ``("bad", at)`` malformed JSON at about ``buf[at]`` (None: somewhere),
    ``("cut", None)`` ``end`` is not a boundary between events."""
    if isinstance(e, RecursionError):
        return "bad", None
    msg = str(e)
    m = _TRAILING.search(msg)
    if m:
        k = start + int(m.group(1)) - 3  # msgspec's byte (from 1) of the trailing character, less the "[", one back
        while start <= k < end and buf[k] in WS:
            k -= 1
        return ("end", k) if start <= k < end and buf[k] == 0x5D else ("bad", None)
    m = _BYTE.search(msg)
    if "truncated" in msg or not m:
        return "cut", None
    at = start + int(m.group(1)) - 1
    return ("cut", None) if at >= end else ("bad", at)  # at our closing "]": a cut inside an event
