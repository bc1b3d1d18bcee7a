"""Read Kineto / Chrome-trace JSON (plain or gzipped, local or fsspec URL) as a stream of typed events.

A trace is read batch by batch: bytes arrive in chunks (gunzipped on the fly), each batch is cut at
an event boundary and decoded with msgspec into typed structs with ``gc=False`` (no cyclic-GC
pressure, the dominant cost of dict-based parsing). ``args`` stay undecoded (``msgspec.Raw``) until
an analysis asks for them. Analyses reduce each batch and drop it, so reading a trace takes a few
batches of memory, not several times the file's size.

Both the object form (``{"traceEvents": [...]}``) and the bare-list form are accepted, and both time
bases: old absolute-µs ``ts``, and new ``ts`` relative to ``baseTimeNanoseconds`` (which Kineto
writes *after* the events, so it is known once the stream is exhausted). ``offset_us`` turns any
``ts`` into absolute epoch µs so ranks from different hosts line up.

Traces come from other people's jobs, so nothing in one is trusted; what was lost is in
:class:`ReadReport` (``TraceStream.report``):

- A file cut off keeps every complete event, and the keys after the events array as far as they are
  complete (``truncated``, ``bytes_unread``).
- An element of ``traceEvents`` that is not an event (a wrong-typed field, a time whose ns overflow
  int64, invalid UTF-8, malformed JSON, nesting too deep to decode) is skipped and counted
  (``events_skipped``, one note per reason); every other event is kept. A batch is decoded typed in
  one call; only a batch that fails is split into elements, so a clean file pays nothing for this.
- Memory is bounded: at most :data:`SEARCH_LIMIT` decoded bytes are held while looking for the
  ``traceEvents`` array or for the end of an event (a gzip bomb is refused in one line), and
  whitespace between events is dropped as it arrives.
- Bytes come from :mod:`.source` (regular files only, gzip members inflated in bounded pieces); files
  are found by :mod:`.listing`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple, Union

import msgspec

from distprof.rundir.manifest import WindowRecord
from distprof.trace.listing import rank_from_name
from distprof.trace.salvage import Skipped
from distprof.trace.source import TraceError, byte_chunks, plain_file, read_span

logger = logging.getLogger(__name__)

__all__ = [
    "BATCH_BYTES",
    "SEARCH_LIMIT",
    "Complete",
    "Duration",
    "Event",
    "Int64",
    "LeanEvent",
    "Meta",
    "RankTrace",
    "ReadReport",
    "Time",
    "TraceError",
    "TraceStream",
    "Unread",
    "decode_run",
    "open_trace",
    "read_trace",
]

BATCH_BYTES = 1 << 20  # decoded JSON per batch: large enough to amortise, small enough to stay in cache (measured: 4 MB is ~15% slower)
SEARCH_LIMIT = 64 << 20  # decoded bytes held without finding the traceEvents array or the end of an event

# Times are µs; analyses and merge turn them into int64 ns, so anything at or beyond 9e15 µs is absurd.
Time = Annotated[float, msgspec.Meta(ge=-9e15, le=9e15)]
Duration = Annotated[float, msgspec.Meta(ge=0, le=9e15)]  # a negative duration is a broken event, not a figure
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # ids end up in numpy int64 columns


class Event(msgspec.Struct, gc=False):
    """One trace event: every field of the Trace Event Format (other per-event keys are not kept)."""
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: Time = 0.0
    dur: Duration = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")  # decoded only when an analysis needs it
    id: Int64 | str | None = None  # flow / async / object id
    bp: str | None = None  # flow binding point
    s: str | None = None  # instant-event scope
    tts: float | None = None  # thread clock
    tdur: float | None = None
    id2: msgspec.Raw = msgspec.Raw(b"")  # {"local": ...} or {"global": ...}
    scope: str | None = None
    cname: str | None = None
    sf: Int64 | str | None = None  # stack frame ids (the trace's stackFrames are not kept)
    esf: Int64 | str | None = None
    stack: msgspec.Raw = msgspec.Raw(b"")
    estack: msgspec.Raw = msgspec.Raw(b"")
    bind_id: Int64 | str | None = None  # flow v2
    flow_in: bool | None = None
    flow_out: bool | None = None


class _Head(msgspec.Struct, gc=False):
    """The document's keys other than traceEvents (before or after the array) that reading uses."""
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    baseTimeNanoseconds: Int64 | Annotated[float, msgspec.Meta(ge=-9.2e18, le=9.2e18)] | None = None
    distprof: dict[str, Any] | None = None


_HEAD_KEYS = frozenset(_Head.__struct_fields__)
_head_decoder = msgspec.json.Decoder(_Head)
_list_decoder = msgspec.json.Decoder(list[Event])
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_event_decoder = msgspec.json.Decoder(Event)


# ---- lean events: what an analysis table reads, and nothing else ----------------------------------------
class LeanEvent(msgspec.Struct, gc=False, tag_field="ph"):
    """A lean stream's events (``open_trace(..., lean=True)``): the class is the phase. Complete and
    metadata events carry what :class:`~distprof.trace.table.TraceTable` reads; every other phase is
    an empty placeholder whose fields the decoder skips instead of building (flows alone are a third of
    a Kineto trace), which makes decoding about a third faster."""


class Complete(LeanEvent, tag="X"):
    name: str = ""
    cat: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: Time = 0.0
    dur: Duration = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")


class Meta(LeanEvent, tag="M"):
    name: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    args: msgspec.Raw = msgspec.Raw(b"")


class Unread(LeanEvent, tag=""):
    """An event of a phase a table does not read (a valid event all the same: not skipped)."""


# Every other phase of the Trace Event Format; an event of a phase not listed (or without one) is decoded
# whole to tell a valid event from a broken one, then stands as Unread.
_UNREAD = tuple(msgspec.defstruct(f"Unread_{ord(p)}", [], bases=(LeanEvent,), tag=p) for p in "BEiICbnestfPONDRcSTpFVv()")
_LEAN = Union[(Complete, Meta, Unread, *_UNREAD)]  # type: ignore[valid-type]
_lean_list_decoder = msgspec.json.Decoder(list[_LEAN])
_lean_decoder = msgspec.json.Decoder(_LEAN)
_UNREAD_EVENT = Unread()
_raw_decoder = msgspec.json.Decoder(msgspec.Raw)

_WS = b" \t\r\n"
_SKIP_WS = re.compile(rb"[ \t\r\n]*")
_SKIP_SEP = re.compile(rb"[ \t\r\n,]*")  # between members or elements (a stray comma is tolerated)
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)  # one whole JSON string, escapes included
_TOKEN = re.compile(rb'[\[{]+|[\]}]+|"|,')  # what the tolerant scanner looks at: runs of brackets, strings, commas
# A `}` that may end an event: a comma or the array's end follows (or, mid-stream, nothing yet: whitespace
# after the last event is then dropped as it arrives). At the end of the file the document's own `}` is no candidate.
_CUT = re.compile(rb"\}(?=[ \t\r\n]*(?:[,\]]|\Z))")
_CUT_LAST = re.compile(rb"\}(?=[ \t\r\n]*[,\]])")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_BYTE = re.compile(r"\(byte (\d+)\)")
_NEXT_EVENT = re.compile(rb",[ \t\r\n]*\{")  # where an event may start after a malformed one
_AFTER_EVENT = re.compile(rb"[ \t\r\n]*(?:[,\]]|\Z)")
_SCAN_BUDGET = 1_000_000  # tokens the tolerant scanner takes for one value (about a second) before giving up
_RESYNC_TRIES = 10_000  # places tried to find the next event after a malformed one
_BOM = b"\xef\xbb\xbf"


@dataclass
class ReadReport:
    """What reading one file lost (all zero/empty for a file read whole)."""
    truncated: bool = False  # the file ended before the events array or the document closed
    events_skipped: int = 0  # elements of traceEvents that are not events (see the module docstring)
    bytes_unread: int = 0  # decoded bytes after the last usable element that could not be used (truncated files)
    notes: list[str] = field(default_factory=list)  # one short line per problem
    bytes_skipped: int = 0  # malformed JSON jumped over to the next event (each place one of events_skipped)
    events_lost_estimate: int = 0  # the events those bytes held, estimated from the mean event size (see .salvage)

    @property
    def salvaged(self) -> bool:
        """True when anything was lost: the file was read only in part."""
        return self.truncated or self.events_skipped > 0 or self.bytes_unread > 0 or bool(self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {"truncated": self.truncated, "events_skipped": self.events_skipped, "bytes_unread": self.bytes_unread,
                "notes": list(self.notes), "bytes_skipped": self.bytes_skipped,
                "events_lost_estimate": self.events_lost_estimate}


# ---- scanning JSON without trusting it -------------------------------------------------------------------
class _Malformed(Exception):
    """The JSON value being scanned is malformed; ``at`` is where msgspec (or the scanner) gave up."""

    def __init__(self, at: int):
        super().__init__(at)
        self.at = at


def _scan_value(buf: bytes, i: int) -> int | None:
    """Where the JSON value starting at ``i`` ends (only strings and brackets are tracked), or None if the bytes
    end inside it. For values msgspec cannot place because they nest too deep: nesting is a counter here, never
    recursion, and a run of brackets is one step. Raises :class:`_Malformed` past a fixed amount of work."""
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
    raise _Malformed(i)


def _value_end(buf: bytes, i: int, deep: bool = True, final: bool = False) -> int | None:
    """Where the JSON value starting at ``i`` ends, or None if the bytes end inside it; raises
    :class:`_Malformed` when it is not JSON.

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
            while end > 0 and view[end - 1] in _WS:
                end -= 1
            try:
                _raw_decoder.decode(view[:end])
                return i + end
            except (msgspec.DecodeError, RecursionError):
                raise _Malformed(i) from None
        if "truncated" in msg:
            return None
        m = _BYTE.search(msg)
        raise _Malformed(i + int(m.group(1)) if m else i) from None
    except RecursionError:
        if not deep:
            raise _Malformed(i) from None
        return _scan_value(buf, i)
    # The rest is one whole value: a container or string is complete; a number may go on in the next bytes.
    end = len(view)
    while end > 0 and view[end - 1] in _WS:
        end -= 1
    return i + end if end and (final or view[end - 1] in b'}]"') else None


def _what(first: int) -> str:
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


def _members(buf: bytes, i: int, header: bool, final: bool = False) -> tuple[str, int, list[tuple[str, bytes]]]:
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
        i = _SKIP_SEP.match(buf, i).end()
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
        j = _SKIP_WS.match(buf, m.end()).end()
        if j >= n:
            return "more", i, found
        if buf[j] != 0x3A:  # :
            return "bad", j, found
        j = _SKIP_WS.match(buf, j + 1).end()
        if j >= n:
            return "more", i, found
        key = key_raw.decode("utf-8", "replace") if b"\\" not in key_raw else _unescape(key_raw)
        if header and key == "traceEvents":
            return ("events", j + 1, found) if buf[j] == 0x5B else ("notlist", j, found)
        try:
            end = _value_end(buf, j, final=final)
        except _Malformed as e:
            return "bad", e.at, found
        if end is None:
            return "more", i, found
        if end <= j:
            return "bad", j, found
        if key in _HEAD_KEYS:
            found.append((key, buf[j:end]))
        i = max(end, j + 1)


def _unescape(key_raw: bytes) -> str:
    try:
        return msgspec.json.decode(b'"' + key_raw + b'"', type=str)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return ""


def _reason(e: Exception) -> str:
    """A short reason an element is not an event, from msgspec's message."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, _Malformed):
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


def _utf8(data) -> bool:
    try:
        str(data, "utf-8")
        return True
    except UnicodeDecodeError:
        return False


# Where one event ends and the next begins: `}`, a comma, `{`. Stricter than _CUT (a `}` before `]` or the end is no
# run's end), so that a run never reaches into the keys after the events list.
_RUN_END = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*(?=\{)")


def _last_run_end(buf: bytes) -> tuple[int, int]:
    """Where the last whole event in ``buf`` whose successor has begun ends, and where that successor starts;
    (0, 0) if there is none.

    A candidate inside a string or nested in an event's args is not a boundary; the run cut there then fails
    to decode whole (an unterminated string or object), which :func:`decode_run` reports."""
    w = 1 << 16
    while True:
        lo = max(0, len(buf) - w)
        last = None
        for last in _RUN_END.finditer(buf, lo):
            pass
        if last is not None:
            return last.start() + 1, last.end()
        if lo == 0:
            return 0, 0
        w *= 8


class Span(NamedTuple):
    """A run of whole events in a plain local file, by offsets (``TraceStream.batches(defer=True)``)."""
    path: str
    start: int
    end: int
    ident: tuple[int, int] | None = None  # the file's (device, inode): a file replaced since is not read


def decode_run(data: bytes | Span) -> list | None:
    """A run of whole events (``TraceStream.batches(defer=True)``: the JSON list of them, or a :class:`Span` of
    the file) as lean events; None unless all of it decodes typed in one call (the file is then read again on the
    path that salvages element by element)."""
    if isinstance(data, Span):
        try:
            data = read_span(data.path, data.start, data.end, brackets=True, ident=data.ident)
        except TraceError:
            return None
    whole = data
    try:
        events = _lean_list_decoder.decode(whole)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    return events if whole.isascii() or _utf8(whole) else None


def _failure(e: Exception, buf: bytes, start: int, end: int) -> tuple[str, int | None]:
    """Why decoding ``[`` + ``buf[start:end]`` + ``]`` failed: ``("end", k)`` the events list closed at ``buf[k]``
    (the keys after the events follow), ``("bad", at)`` malformed JSON at about ``buf[at]`` (None: somewhere),
    ``("cut", None)`` ``end`` is not a boundary between events."""
    if isinstance(e, RecursionError):
        return "bad", None
    msg = str(e)
    m = _TRAILING.search(msg)
    if m:
        k = start + int(m.group(1)) - 3  # msgspec's byte (from 1) of the trailing character, less the "[", one back
        while start <= k < end and buf[k] in _WS:
            k -= 1
        return ("end", k) if start <= k < end and buf[k] == 0x5D else ("bad", None)
    m = _BYTE.search(msg)
    if "truncated" in msg or not m:
        return "cut", None
    at = start + int(m.group(1)) - 1
    return ("cut", None) if at >= end else ("bad", at)  # at our closing "]": a cut inside an event


class TraceStream:
    """One trace file, read batch by batch by :meth:`batches`.

    ``rank``, ``role``, ``distributed_info`` and ``device_properties`` are known once the header is
    read (on the first batch); ``offset_us``, ``event_count`` and ``report`` once the stream is exhausted.
    Rank: ``rank`` if given, else distributedInfo.rank, else the manifest's, else the file name.
    """

    def __init__(self, path: str, rank: int | None = None, manifest_rank: int | None = None,
                 role: str | None = None, window: WindowRecord | None = None, batch_bytes: int = BATCH_BYTES,
                 on_read: Callable[[int], None] | None = None, search_limit: int = SEARCH_LIMIT, lean: bool = False,
                 decoders: tuple[msgspec.json.Decoder, msgspec.json.Decoder] | None = None):
        self.path = path
        self.lean = lean  # LeanEvents (what a TraceTable reads), not whole Events
        self._list, self._one = (_lean_list_decoder, _lean_decoder) if lean else (_list_decoder, _event_decoder)
        if decoders is not None:
            # Another event type (merge's): a list decoder and an element decoder of one type. ``lean`` then says
            # how an element that does not fit it is told from a broken one (see _event).
            self._list, self._one = decoders
        self._on_read = on_read
        self.window = window
        self.rank: int | None = None
        self.rank_source = "none"
        self.role = role
        self.offset_us = 0.0
        self.distributed_info: dict[str, Any] | None = None
        self.device_properties: list[dict[str, Any]] = []
        self.report = ReadReport()
        self.event_count = 0
        self._given_rank = rank
        self._given_role = role
        self._manifest_rank = manifest_rank
        self._batch = max(int(batch_bytes), 1)
        self._limit = max(int(search_limit), self._batch)
        self._skips: Counter = Counter()
        self._source_problems: list[str] = []
        self._is_object = True
        self._defer, self._deferred = False, 0
        self.needs_whole_read = False  # (defer) the stream met what only a read without defer can judge
        self._resolve_rank()

    @property
    def salvaged(self) -> bool:
        """The file was read only in part (see :attr:`report`)."""
        return self.report.salvaged

    # ---- metadata ------------------------------------------------------------------------------------
    def _apply_head(self, members: list[tuple[str, bytes]]) -> None:
        """Decode the document's keys reading uses one by one: a bad one is ignored (and noted), not fatal."""
        for key, value in members:
            try:
                head = _head_decoder.decode(b'{"' + key.encode() + b'":' + value + b"}")
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
                self.report.notes.append(f"key {key} ignored ({_reason(e)})")
                continue
            if head.distributedInfo is not None:
                self.distributed_info = head.distributedInfo
            if head.deviceProperties:
                self.device_properties = head.deviceProperties
            if head.baseTimeNanoseconds:
                self.offset_us = head.baseTimeNanoseconds / 1000.0
            if head.distprof and isinstance(head.distprof.get("role"), str) and self.role is None:
                self.role = head.distprof["role"]
        self._resolve_rank()

    def _resolve_rank(self) -> None:
        info = self.distributed_info or {}
        r = info.get("rank")
        if self._given_rank is not None:
            self.rank, self.rank_source = self._given_rank, "given"
        elif type(r) is int and 0 <= r < 2**31:
            self.rank, self.rank_source = r, "distributedInfo"
        elif self._manifest_rank is not None:
            self.rank, self.rank_source = self._manifest_rank, "manifest"
        else:
            self.rank = rank_from_name(self.path)
            self.rank_source = "name" if self.rank is not None else "none"

    # ---- events --------------------------------------------------------------------------------------
    def batches(self, defer: bool = False) -> Iterator[list[Event]]:
        """Lists of events in file order; each is safe to drop once reduced.

        Raises :class:`TraceError` (one line naming the file) when the file is not a trace or nothing
        in it could be read; what a partly read file lost is in :attr:`report` when the stream ends.

        ``defer`` (lean streams): full batches in the middle of the events list come as ``bytes`` instead, a run
        of whole events cut where an event ends and the next begins, for :func:`decode_run` to decode elsewhere
        (another core); the start, the end and anything the fast path cannot cut are decoded here as usual.
        Such runs are not counted in :attr:`event_count`, and are not checked: a run that does not decode
        whole means the file must be read again without ``defer``; so does :attr:`needs_whole_read` once the
        stream has ended (what was read past the runs depends on how many events they hold).
        """
        self.event_count, self.report, self._skips, self._source_problems = 0, ReadReport(), Counter(), []
        self._jumped = Skipped()  # the stretches of malformed JSON jumped over, and the bytes their estimate uses
        # What the document's keys said is read again too: a pass given up (a split read sent back to one
        # process) may have read keys that this pass ignores.
        self.offset_us, self.distributed_info, self.device_properties, self.role = 0.0, None, [], self._given_role
        self._resolve_rank()
        self._defer, self._deferred, self.needs_whole_read = defer and self.lean, 0, False
        for batch in self._batches():
            if batch:
                if isinstance(batch, list):
                    self.event_count += len(batch)
                yield batch
        self._close()

    def _close(self) -> None:
        r = self.report
        r.notes[:0] = self._source_problems
        for reason, n in self._skips.most_common(3):
            r.notes.append(f"{n:,} event{'s' if n != 1 else ''} skipped: {reason}")
        other = r.events_skipped - self._jumped.places - sum(n for _, n in self._skips.most_common(3))
        if (lost := self._jumped.summary(self.event_count + r.events_skipped - self._jumped.places)):
            r.bytes_skipped, (r.events_lost_estimate, note) = self._jumped.bytes, lost
            r.notes.append(note)
        if other > 0:
            r.notes.append(f"{other:,} more skipped for other reasons")
        if self._deferred:
            return  # the runs decoded elsewhere hold events: a file that fails them is read again, and judged then
        if self.event_count == 0 and r.events_skipped:
            raise TraceError(f"{self.path}: not a Chrome/Kineto trace (none of the {r.events_skipped:,} elements of "
                             f"its event list is an event: {(self._skips.most_common(1) or [('not valid JSON',)])[0][0]})")
        if self.event_count == 0 and r.truncated:
            why = f" ({self._source_problems[0]})" if self._source_problems else ""
            raise TraceError(f"{self.path}: cut off before its first complete event{why}; nothing could be salvaged")
        if r.salvaged:
            logger.info("%s: read in part (%s)", self.path, "; ".join(r.notes) or "truncated")

    def _skip(self, e: Exception) -> None:
        self.report.events_skipped += 1
        reason = _reason(e)
        if reason in self._skips or len(self._skips) < 32:  # a bounded set of reasons, whatever the file holds
            self._skips[reason] += 1
        else:
            self._skips["other"] += 1

    def _event(self, raw) -> Event | LeanEvent | None:
        """One element as an event, or None (skipped and counted)."""
        try:
            try:
                ev = self._one.decode(raw)
            except msgspec.ValidationError:
                if not self.lean:
                    raise
                _event_decoder.decode(raw)  # a phase a table does not read, or none: still an event if this passes
                ev = _UNREAD_EVENT
            if not (raw.isascii() if isinstance(raw, bytes) else bytes(raw).isascii()):
                str(raw if isinstance(raw, bytes) else bytes(raw), "utf-8")  # args stay raw: check them here
            return ev
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
            self._skip(e)
            return None

    def _decode_run(self, buf: bytes, start: int, end: int) -> tuple[str, Any]:
        """The events of the whole elements ``buf[start:end]``: ``("ok", events)``, or why not (see :func:`_failure`).

        The fast path is one typed decode; a run holding elements that are not events (or invalid UTF-8) is
        decoded as raw elements and converted one by one, skipping and counting those that do not fit.
        """
        data = b"".join((b"[", memoryview(buf)[start:end], b"]"))  # one copy
        try:
            events = self._list.decode(data)
            if data.isascii() or _utf8(data):
                return "ok", events
        except (msgspec.ValidationError, UnicodeDecodeError):
            pass
        except (msgspec.DecodeError, RecursionError) as e:
            return _failure(e, buf, start, end)
        try:
            raws = _raw_list_decoder.decode(data)
        except (msgspec.DecodeError, RecursionError) as e:
            return _failure(e, buf, start, end)
        return "ok", [ev for r in raws if (ev := self._event(r)) is not None]

    def _fast(self, buf: bytes, start: int, stop: int, final: bool) -> tuple[tuple | None, int | None]:
        """The events from ``start`` up to the last event boundary before ``stop``, in one decode:
        ``((events, rest, ended), None)``, or ``(None, at)`` with where malformed JSON was seen (if known)."""
        cut = _CUT_LAST if final else _CUT
        w = 1 << 16
        while True:  # the last few candidates, looked for in a window that grows from the end
            lo = max(start, stop - w)
            cuts = [m.end() for m in cut.finditer(buf, lo, stop)]
            if cuts or lo == start:
                break
            w *= 8
        for end in cuts[:-4:-1]:
            kind, value = self._decode_run(buf, start, end)
            if kind == "ok":
                return (value, end, False), None
            if kind == "bad":
                return None, value
            if kind == "end":  # the events list closes inside this run
                if self._closes(buf, value, final) is not True:
                    return None, None
                kind, events = self._decode_run(buf, start, value)
                return ((events, value + 1, True), None) if kind == "ok" else (None, None)
        return None, None

    def _closes(self, buf: bytes, k: int, final: bool) -> bool | None:
        """Whether the ``]`` at ``k`` ends the events list: in the object form, keys or the object's end follow
        (None: the bytes so far end there)."""
        if not self._is_object:
            return True
        j = _SKIP_WS.match(buf, k + 1).end()
        if j >= len(buf):
            return True if final else None
        return buf[j] in b",}"

    def _resync(self, buf: bytes, i: int) -> int | None:
        """After a malformed element: where the next well-formed event starts (a comma, then an object that decodes
        as an event with a ``ph``, then a comma or the list's end), or None if not within the bytes so far."""
        for k, m in enumerate(_NEXT_EVENT.finditer(buf, i)):
            if k >= _RESYNC_TRIES:
                return None
            s = m.end() - 1
            try:
                end = _value_end(buf, s, deep=False)
            except _Malformed:
                continue
            if end is None:
                return None
            try:
                ev = _event_decoder.decode(memoryview(buf)[s:end])
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
                continue
            if ev.ph and _AFTER_EVENT.match(buf, end):
                return s
        return None

    def _walk(self, buf: bytes, i: int, until: int | None, final: bool) -> tuple[list[Event], int, bool, bool]:
        """The slow path: elements one by one from ``i``, until past ``until`` (None: as far as the bytes go).

        Returns the events, where the rest starts, whether the events list ended, and whether to go on (the fast
        path takes the rest). A malformed element is skipped up to where the next event starts.
        """
        out = []
        n = len(buf)
        while True:
            if until is not None and i > until:
                return out, i, False, True
            i = _SKIP_SEP.match(buf, i).end()
            if i >= n:
                return out, n, False, False
            if buf[i] == 0x5D:  # ]
                closes = self._closes(buf, i, final)
                if closes is None:
                    return out, i, False, False
                if closes:
                    return out, i + 1, True, False
                bad = i
            else:
                try:
                    end = _value_end(buf, i)
                except _Malformed as e:
                    bad = e.at
                else:
                    if end is None:
                        return out, i, False, False
                    ev = self._event(buf[i:end])
                    if ev is not None:
                        out.append(ev)
                    i = max(end, i + 1)
                    continue
            nxt = self._resync(buf, max(bad, i + 1))
            if nxt is None:
                return out, i, False, False
            self.report.events_skipped += 1  # a place of malformed JSON: its bytes say what it held (see _close)
            self._jumped.add(nxt - i)
            i = nxt

    def _take(self, buf: bytes, final: bool) -> tuple[list[Event], int, bool]:
        """The events of the whole elements at the front of ``buf`` (which starts at an element, or at the
        list's end), where the unread rest starts, and whether the events list's ``]`` was reached.

        Fast path first; where it fails, the elements are walked one by one only as far as needed (past the
        malformed one msgspec pointed at), then the fast path takes the rest.
        """
        out: list[Event] = []
        pos = 0
        while True:
            got, at = self._fast(buf, pos, len(buf), final)
            if at is not None and at < pos:
                at = None
            if got is not None:
                events, pos, ended = got
                out += events
                if ended or not final:
                    return out, pos, ended
                at = None  # the end of the file: walk the last event and the list's end
            elif at is not None and at > pos:
                got, _ = self._fast(buf, pos, at, final)  # the whole events before the malformed one
                if got is not None:
                    events, pos, ended = got
                    out += events
                    if ended:
                        return out, pos, ended
            events, pos, ended, go_on = self._walk(buf, pos, at, final)
            out += events
            if not go_on:
                return out, pos, ended

    def _batches(self) -> Iterator[list[Event]]:
        problem = self._source_problems  # what the byte source finds wrong (a corrupt or cut-off gzip stream)
        plain = plain_file(self.path) if self._defer else None
        read = [0]
        chunks = self._jumped.counted(byte_chunks(self.path, self._batch, self._counted(read) if plain else
                                                  self._on_read, problem, ident=plain and plain[1], end=plain and plain[0]))
        buf, is_object = self._start(chunks)
        self._is_object = is_object
        if plain is not None:
            # A plain local file: runs are handed out as spans of the file (the worker reads them itself); the
            # bytes here are only looked at around each cut. The last stretch is read here as usual.
            last = None
            for last in self._spans(read[0] - len(buf), read[0], *plain):
                yield last
            if last is not None:
                chunks.close()
                chunks = self._jumped.counted(byte_chunks(self.path, self._batch, self._on_read, problem,
                                                          offset=last.end, ident=plain[1], end=plain[0]))
                buf = b""
        pending, size = ([buf], len(buf)) if buf else ([], 0)
        need = self._batch
        ended = False
        for c in chunks:
            if not size:
                c = c.lstrip(_WS + b",")  # whitespace between events is dropped, never held
                if not c:
                    continue
            pending.append(c)
            size += len(c)
            if size < need:
                continue
            buf = b"".join(pending)
            if self._defer and (cut := _last_run_end(buf))[0]:
                self._deferred += 1
                yield b"".join((b"[", memoryview(buf)[:cut[0]], b"]"))  # the copy a slice would make anyway
                buf = buf[cut[1]:]
                pending, size = ([buf], len(buf)) if buf else ([], 0)
                continue
            events, rest, ended = self._take(buf, final=False)
            yield events
            if ended:
                buf = buf[rest:]
                break
            if rest == 0 and not events:
                if self._deferred:
                    # An element longer than a batch after runs were handed out: whether its end is found before
                    # the search limit depends on where the batches fell, and giving up depends on the events
                    # the runs hold (uncounted here), so only the read without defer may judge it.
                    self.needs_whole_read = True
                    return
                if len(buf) > self._limit:
                    self._give_up(len(buf))
                    return
                # No boundary yet: try again when the bytes have doubled, so a long search stays linear.
                need = min(max(self._batch, 2 * len(buf)), self._limit + 1)
                pending, size = [buf], len(buf)
                continue
            need = self._batch
            buf = buf[rest:].lstrip(_WS + b",")
            pending, size = ([buf], len(buf)) if buf else ([], 0)
        else:
            buf = b"".join(pending)
            events, rest, ended = self._take(buf, final=True) if buf else ([], 0, False)
            yield events
            buf = buf[rest:]
            if not ended:
                self._cut_off(len(buf.strip(_WS)), "inside the events array")
                return
        if not is_object:
            if buf.strip(_WS):
                logger.info("%s: bytes after the events list ignored", self.path)
            return
        self._trailer(buf, chunks)

    def _counted(self, box: list[int]) -> Callable[[int], None]:
        def note(n: int) -> None:
            box[0] += n
            if self._on_read:
                self._on_read(n)
        return note

    def _spans(self, pos: int, counted: int, size: int, ident: tuple[int, int]) -> Iterator[Span]:
        """Runs of whole events from ``pos`` on, each about a batch long, cut where the file's bytes show an event
        end followed by the next one's start; stops within about a batch of the end (the events list's end and the
        keys after it are read here), or where no cut is seen. ``counted``: how far the file's bytes were told to
        ``on_read`` (the bytes read up to the events were); the last stretch is counted where it is read."""
        probe = 1 << 16
        while pos + self._batch + probe < size:
            at = pos + self._batch
            window = read_span(self.path, at, at + probe, ident=ident)
            m = _RUN_END.search(window)
            if m is None:
                return
            self._deferred += 1
            end = at + m.start() + 1
            if self._on_read and end > counted:
                self._on_read(end - counted)
                counted = end
            yield Span(self.path, pos, end, ident)
            pos = at + m.end()

    def _cut_off(self, unread: int, where: str) -> None:
        self.report.truncated = True
        self.report.bytes_unread += unread
        self.report.notes.append(f"file ends {where}")

    def _give_up(self, held: int) -> None:
        mb = self._limit >> 20
        if not self.event_count:
            raise TraceError(f"{self.path}: no event boundary in the first {mb} MB: not a trace")
        self.report.truncated = True
        self.report.bytes_unread += held
        self.report.notes.append(f"no event boundary in {mb} MB after event {self.event_count:,}: stopped reading")

    def _more(self, buf: bytes, chunks: Iterator[bytes]) -> tuple[bytes, bool]:
        """``buf`` with more bytes: until it has doubled (so rescanning a long member stays linear); and EOF."""
        want = max(self._batch, 2 * len(buf))
        parts, n = [buf], len(buf)
        while n < want:
            c = next(chunks, b"")
            if not c:
                return b"".join(parts), True
            parts.append(c)
            n += len(c)
        return b"".join(parts), False

    def _start(self, chunks: Iterator[bytes]) -> tuple[bytes, bool]:
        """Read up to the events: the bytes just after the list's ``[``, and whether the document is an object.

        The object's keys before ``traceEvents`` are scanned member by member (only an incomplete member is
        held, and the search stops at the search limit); the ones reading uses are applied.
        """
        buf, seen = b"", 0
        for c in chunks:
            if not seen:
                c = c.removeprefix(_BOM)  # a UTF-8 byte order mark is not content
            seen += len(c)
            buf = c.lstrip(_WS)
            if buf:
                break
            if seen > self._limit:
                raise TraceError(f"{self.path}: nothing but whitespace in the first {self._limit >> 20} MB: "
                                 "not a trace")
        if not buf:
            raise TraceError(f"{self.path}: empty file")
        if buf[:1] == b"[":
            return buf[1:].lstrip(_WS), False
        if buf[:1] != b"{":
            self._refuse(buf, chunks)
        i, dropped, head, eof = 1, 0, [], False
        while True:
            state, i, found = _members(buf, i, header=True)
            head += found
            if state == "events":
                self._apply_head(head)
                return buf[i:].lstrip(_WS), True
            if state == "notlist":
                raise TraceError(f"{self.path}: not a Chrome/Kineto trace (traceEvents is {_what(buf[i])}, "
                                 "expected a list of events)")
            if state == "closed":
                raise TraceError(f"{self.path}: not a Chrome/Kineto trace (an object without a traceEvents key)")
            if state == "bad":
                raise TraceError(f"{self.path}: not valid JSON (at byte {dropped + i:,}, before the traceEvents list)")
            if eof:
                raise TraceError(f"{self.path}: file ends before the traceEvents list; nothing could be salvaged")
            if dropped + len(buf) > self._limit:
                raise TraceError(f"{self.path}: no traceEvents list in the first {self._limit >> 20} MB: not a trace")
            buf, dropped, i = buf[i:], dropped + i, 0  # keep only the member still incomplete
            buf, eof = self._more(buf, chunks)

    def _refuse(self, buf: bytes, chunks: Iterator[bytes]) -> None:
        """A document that is neither an object nor a list: valid JSON of another kind, or not JSON."""
        what = _what(buf[0])
        if what != "not JSON":
            parts, n = [buf], len(buf)
            for c in chunks:
                parts.append(c)
                n += len(c)
                if n > self._limit:
                    break  # a scalar this long is not worth decoding
            else:
                try:
                    msgspec.json.decode(b"".join(parts))
                except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
                    pass
                else:
                    raise TraceError(f"{self.path}: not a Chrome/Kineto trace (the document is {what}, "
                                     "expected an object with traceEvents or a list of events)")
        raise TraceError(f"{self.path}: not JSON (starts with {buf[:16]!r})")

    def _trailer(self, buf: bytes, chunks: Iterator[bytes]) -> None:
        """The object's keys after the events (Kineto writes baseTimeNanoseconds there), kept as far as whole."""
        i, dropped, head, eof = 0, 0, [], False
        while True:
            state, i, found = _members(buf, i, header=False, final=eof)
            head += found
            if state == "bad":
                self.report.notes.append("the keys after the events are not valid JSON; the rest is ignored")
            if state != "more":
                break
            if eof:
                self._cut_off(len(buf) - i, "in the keys after the events")
                break
            if dropped + len(buf) > self._limit:
                self.report.notes.append(f"stopped reading the keys after the events after {self._limit >> 20} MB")
                break
            buf, dropped, i = buf[i:], dropped + i, 0
            buf, eof = self._more(buf, chunks)
        self._apply_head(head)


def open_trace(path: str, rank: int | None = None, manifest_rank: int | None = None, role: str | None = None,
               window: WindowRecord | None = None, on_read: Callable[[int], None] | None = None,
               lean: bool = False) -> TraceStream:
    """A :class:`TraceStream` over one file (nothing is read until :meth:`TraceStream.batches` runs).

    ``on_read(n)`` is called as the file's bytes are read (for progress bars). ``lean``: the events are
    :class:`LeanEvent` objects, what a :class:`~distprof.trace.table.TraceTable` reads (faster), not
    whole :class:`Event` objects.
    """
    return TraceStream(path, rank=rank, manifest_rank=manifest_rank, role=role, window=window, on_read=on_read,
                       lean=lean)


@dataclass
class RankTrace:
    """A whole trace in memory (small files, tests, interactive use). Analyses take it or a TraceStream."""
    path: str
    events: list[Event]
    rank: int | None
    rank_source: str  # given | distributedInfo | manifest | name | none
    offset_us: float = 0.0  # add to ts for absolute epoch µs
    distributed_info: dict[str, Any] | None = None
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    role: str | None = None
    report: ReadReport = field(default_factory=ReadReport)
    window: WindowRecord | None = None

    @property
    def salvaged(self) -> bool:
        return self.report.salvaged

    def batches(self) -> Iterator[list[Event]]:
        yield self.events


def read_trace(path: str, rank: int | None = None, manifest_rank: int | None = None, role: str | None = None,
               window: WindowRecord | None = None) -> RankTrace:
    """Read one whole trace into memory."""
    s = open_trace(path, rank=rank, manifest_rank=manifest_rank, role=role, window=window)
    events = [e for batch in s.batches() for e in batch]
    return RankTrace(path=path, events=events, rank=s.rank, rank_source=s.rank_source, offset_us=s.offset_us,
                     distributed_info=s.distributed_info, device_properties=s.device_properties, role=s.role,
                     report=s.report, window=window)
