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
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from distprof.rundir.manifest import WindowRecord
from distprof.trace import native
from distprof.trace.cutter import Cutter
from distprof.trace.events import (
    Complete,
    Duration,
    Event,
    Int64,
    LeanEvent,
    Meta,
    Time,
    Unread,
    event_decoder,
    head_decoder,
    lean_decoder,
    lean_list_decoder,
    list_decoder,
)
from distprof.trace.jsonscan import WS, members, reason, what
from distprof.trace.listing import rank_from_name
from distprof.trace.runs import RUN_END, Span, Tail, decode_run, last_run_end
from distprof.trace.salvage import ReadReport, Skipped
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

# Decoded JSON per batch: large enough to amortise, small enough to stay in cache (measured: 4 MB is ~15% slower).
BATCH_BYTES = 1 << 20
SEARCH_LIMIT = 64 << 20  # decoded bytes held without finding the traceEvents array or the end of an event
_BOM = b"\xef\xbb\xbf"


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
        self._list: msgspec.json.Decoder[Any]
        self._one: msgspec.json.Decoder[Any]
        self._list, self._one = (lean_list_decoder, lean_decoder) if lean else (list_decoder, event_decoder)
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
                head = head_decoder.decode(b'{"' + key.encode() + b'":' + value + b"}")
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
                self.report.notes.append(f"key {key} ignored ({reason(e)})")
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
    def batches(self, defer: bool = False) -> Iterator[Any]:
        """Lists of events in file order; each is safe to drop once reduced.

        Raises :class:`TraceError` (one line naming the file) when the file is not a trace or nothing
        in it could be read; what a partly read file lost is in :attr:`report` when the stream ends.

        ``defer``: full batches in the middle of the events list come as ``bytes`` instead, a run
        of whole events cut where an event ends and the next begins, for :func:`decode_run` to decode elsewhere
        (another core); the start, the end and anything the fast path cannot cut are decoded here as usual.
        Such runs are not counted in :attr:`event_count`, and are not checked: a run that does not decode
        whole means the file must be read again without ``defer``; so does :attr:`needs_whole_read` once the
        stream has ended (what was read past the runs depends on how many events they hold: an element longer
        than a batch, or malformed JSON jumped over, whose lost events are estimated from the events read).
        """
        self.event_count, self.report, self._skips, self._source_problems = 0, ReadReport(), Counter(), []
        self._jumped = Skipped()  # the stretches of malformed JSON jumped over, and the bytes their estimate uses
        # What the document's keys said is read again too: a pass given up (a split read sent back to one
        # process) may have read keys that this pass ignores.
        self.offset_us, self.distributed_info, self.device_properties, self.role = 0.0, None, [], self._given_role
        self._resolve_rank()
        self._defer, self._deferred, self.needs_whole_read = defer, 0, False
        for batch in self._batches():
            if batch:
                if isinstance(batch, list):
                    self.event_count += len(batch)
                yield batch
        if self._deferred and self._jumped.places:
            # The events the skipped bytes held are estimated from the mean size of the events read, and the runs'
            # events are not counted here: only the read without defer gives the estimate a one-process read gives.
            self.needs_whole_read = True
        self._close()

    def _close(self) -> None:
        r = self.report
        r.notes[:0] = self._source_problems
        for why, n in self._skips.most_common(3):
            r.notes.append(f"{n:,} event{'s' if n != 1 else ''} skipped: {why}")
        other = r.events_skipped - self._jumped.places - sum(n for _, n in self._skips.most_common(3))
        if (lost := self._jumped.summary(self.event_count + r.events_skipped - self._jumped.places)):
            r.bytes_skipped, (r.events_lost_estimate, note) = self._jumped.bytes, lost
            r.notes.append(note)
        if other > 0:
            r.notes.append(f"{other:,} more skipped for other reasons")
        if self._deferred:
            return  # the runs decoded elsewhere hold events: a file that fails them is read again, and judged then
        if self.event_count == 0 and r.events_skipped:
            top = self._skips.most_common(1)
            raise TraceError(f"{self.path}: not a Chrome/Kineto trace (none of the {r.events_skipped:,} elements of "
                             f"its event list is an event: {top[0][0] if top else 'not valid JSON'})")
        if self.event_count == 0 and r.truncated:
            why = f" ({self._source_problems[0]})" if self._source_problems else ""
            raise TraceError(f"{self.path}: cut off before its first complete event{why}; nothing could be salvaged")
        if r.salvaged:
            logger.info("%s: read in part (%s)", self.path, "; ".join(r.notes) or "truncated")


    def _batches(self) -> Iterator[Any]:  # lists of events; with defer, runs (bytes or Span) too
        problem = self._source_problems  # what the byte source finds wrong (a corrupt or cut-off gzip stream)
        plain = plain_file(self.path) if self._defer else None
        read = [0]
        chunks = self._jumped.counted(byte_chunks(self.path, self._batch, self._counted(read) if plain else
                                                  self._on_read, problem, ident=plain and plain[1],
                                                  end=plain and plain[0]))
        buf, is_object = self._start(chunks)
        self._cut = Cutter(self._list, self._one, self.lean, is_object, self.report, self._skips, self._jumped)
        if plain is not None:
            chunks, buf = yield from self._span_runs(chunks, buf, read[0], plain)
        pending, size = ([buf], len(buf)) if buf else ([], 0)
        need = self._batch
        ended = False
        for c in chunks:
            if not size:
                c = c.lstrip(WS + b",")  # whitespace between events is dropped, never held
                if not c:
                    continue
            pending.append(c)
            size += len(c)
            if size < need:
                continue
            buf = b"".join(pending)
            if self._defer and (cut := last_run_end(buf))[0]:
                self._deferred += 1
                yield b"".join((b"[", memoryview(buf)[:cut[0]], b"]"))  # the copy a slice would make anyway
                buf = buf[cut[1]:]
                pending, size = ([buf], len(buf)) if buf else ([], 0)
                continue
            events, rest, ended = self._cut.take(buf, final=False)
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
            buf = buf[rest:].lstrip(WS + b",")
            pending, size = ([buf], len(buf)) if buf else ([], 0)
        else:
            buf = b"".join(pending)
            buf = yield from self._tail(buf)
            events, rest, ended = self._cut.take(buf, final=True) if buf else ([], 0, False)
            yield events
            buf = buf[rest:]
            if not ended:
                self._cut_off(len(buf.strip(WS)), "inside the events array")
                return
        if not is_object:
            if buf.strip(WS):
                logger.info("%s: bytes after the events list ignored", self.path)
            return
        self._trailer(buf, chunks)

    def _tail(self, buf: bytes) -> Generator[Tail, None, bytes]:
        """Where the native decoder finds the events list's end in the last bytes: its last events are one more
        run (the whole list, for a file smaller than a batch), and only what follows (returned) is read here."""
        end = native.list_end(buf) if self._defer else -1
        if end <= 0:
            return buf
        self._deferred += 1
        yield Tail(b"".join((b"[", memoryview(buf)[:end], b"]")))
        return buf[end:]

    def _span_runs(self, chunks: Generator[bytes, None, None], buf: bytes, read: int, plain: tuple[int, tuple[int, int]]
                   ) -> Generator[Span, None, tuple[Generator[bytes, None, None], bytes]]:
        """A plain local file: runs are handed out as spans of the file (the worker reads them itself); the bytes
        here are only looked at around each cut. Returns the chunks and bytes the last stretch is read from here,
        as usual (``read``: how far the file's bytes were read so far)."""
        last = None
        for last in self._spans(read - len(buf), read, *plain):
            yield last
        if last is None:
            return chunks, buf
        chunks.close()
        return self._jumped.counted(byte_chunks(self.path, self._batch, self._on_read, self._source_problems,
                                                offset=last.end, ident=plain[1], end=plain[0])), b""

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
            m = RUN_END.search(window)
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
            buf = c.lstrip(WS)
            if buf:
                break
            if seen > self._limit:
                raise TraceError(f"{self.path}: nothing but whitespace in the first {self._limit >> 20} MB: "
                                 "not a trace")
        if not buf:
            raise TraceError(f"{self.path}: empty file")
        if buf[:1] == b"[":
            return buf[1:].lstrip(WS), False
        if buf[:1] != b"{":
            self._refuse(buf, chunks)
        i, dropped, head, eof = 1, 0, [], False
        while True:
            state, i, found = members(buf, i, header=True)
            head += found
            if state == "events":
                self._apply_head(head)
                return buf[i:].lstrip(WS), True
            if state == "notlist":
                raise TraceError(f"{self.path}: not a Chrome/Kineto trace (traceEvents is {what(buf[i])}, "
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
        kind = what(buf[0])
        if kind != "not JSON":
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
                    raise TraceError(f"{self.path}: not a Chrome/Kineto trace (the document is {kind}, "
                                     "expected an object with traceEvents or a list of events)")
        raise TraceError(f"{self.path}: not JSON (starts with {buf[:16]!r})")

    def _trailer(self, buf: bytes, chunks: Iterator[bytes]) -> None:
        """The object's keys after the events (Kineto writes baseTimeNanoseconds there), kept as far as whole."""
        i, dropped, head, eof = 0, 0, [], False
        while True:
            state, i, found = members(buf, i, header=False, final=eof)
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
