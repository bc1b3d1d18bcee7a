"""The element cutter: the bytes of a ``traceEvents`` list, a batch at a time, into events, salvaging what it can.

The fast path decodes a batch typed in one call, cut at the last event boundary; only where that fails are the
elements walked one by one (past the malformed one msgspec pointed at), each that is not an event skipped and
counted by reason, and malformed JSON jumped over to where the next event starts (see :mod:`.salvage`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import msgspec

from distprof.trace.events import UNREAD_EVENT, Event, LeanEvent, event_decoder, raw_list_decoder
from distprof.trace.jsonscan import Malformed, failure, is_utf8, reason, skip_sep, skip_ws, value_end
from distprof.trace.salvage import ReadReport, Skipped

__all__ = ["Cutter"]

# A `}` that may end an event: a comma or the array's end follows (or, mid-stream, nothing yet: whitespace
# after the last event is then dropped as it arrives). At the end of the file the document's own `}` is no candidate.
_CUT = re.compile(rb"\}(?=[ \t\r\n]*(?:[,\]]|\Z))")
_CUT_LAST = re.compile(rb"\}(?=[ \t\r\n]*[,\]])")
_NEXT_EVENT = re.compile(rb",[ \t\r\n]*\{")  # where an event may start after a malformed one
_AFTER_EVENT = re.compile(rb"[ \t\r\n]*(?:[,\]]|\Z)")
_RESYNC_TRIES = 10_000  # places tried to find the next event after a malformed one


class Cutter:
    """One pass's cutter of an events list into events (:meth:`take`); what it skips goes to ``report``
    (``events_skipped``), ``skips`` (by reason) and ``jumped`` (the stretches of malformed JSON).

    ``list_decoder`` and ``one_decoder`` decode a list of events and one event of one type; ``lean``: an element
    that does not fit that type is still an event when it decodes as a whole :class:`Event` (an unread phase).
    ``is_object``: the document is an object, so the events list's ``]`` is followed by keys or the object's end.
    """

    def __init__(self, list_decoder: msgspec.json.Decoder, one_decoder: msgspec.json.Decoder, lean: bool,
                 is_object: bool, report: ReadReport, skips: Counter, jumped: Skipped) -> None:
        self._list, self._one, self.lean, self.is_object = list_decoder, one_decoder, lean, is_object
        self.report, self.skips, self.jumped = report, skips, jumped

    def _skip(self, e: Exception) -> None:
        self.report.events_skipped += 1
        why = reason(e)
        if why in self.skips or len(self.skips) < 32:  # a bounded set of reasons, whatever the file holds
            self.skips[why] += 1
        else:
            self.skips["other"] += 1

    def _event(self, raw) -> Event | LeanEvent | None:
        """One element as an event, or None (skipped and counted)."""
        try:
            try:
                ev = self._one.decode(raw)
            except msgspec.ValidationError:
                if not self.lean:
                    raise
                event_decoder.decode(raw)  # a phase a table does not read, or none: still an event if this passes
                ev = UNREAD_EVENT
            if not (raw.isascii() if isinstance(raw, bytes) else bytes(raw).isascii()):
                str(raw if isinstance(raw, bytes) else bytes(raw), "utf-8")  # args stay raw: check them here
            return ev
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
            self._skip(e)
            return None

    def _decode_run(self, buf: bytes, start: int, end: int) -> tuple[str, Any]:
        """The events of the whole elements ``buf[start:end]``: ``("ok", events)``, or why not (see :func:`failure`).

        The fast path is one typed decode; a run holding elements that are not events (or invalid UTF-8) is
        decoded as raw elements and converted one by one, skipping and counting those that do not fit.
        """
        data = b"".join((b"[", memoryview(buf)[start:end], b"]"))  # one copy
        try:
            events = self._list.decode(data)
            if data.isascii() or is_utf8(data):
                return "ok", events
        except (msgspec.ValidationError, UnicodeDecodeError):
            pass
        except (msgspec.DecodeError, RecursionError) as e:
            return failure(e, buf, start, end)
        try:
            raws = raw_list_decoder.decode(data)
        except (msgspec.DecodeError, RecursionError) as e:
            return failure(e, buf, start, end)
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
        if not self.is_object:
            return True
        j = skip_ws(buf, k + 1)
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
                end = value_end(buf, s, deep=False)
            except Malformed:
                continue
            if end is None:
                return None
            try:
                ev = event_decoder.decode(memoryview(buf)[s:end])
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
                continue
            if ev.ph and _AFTER_EVENT.match(buf, end):
                return s
        return None

    def _walk(self, buf: bytes, i: int, until: int | None, final: bool
              ) -> tuple[list[Event | LeanEvent], int, bool, bool]:
        """The slow path: elements one by one from ``i``, until past ``until`` (None: as far as the bytes go).

        Returns the events, where the rest starts, whether the events list ended, and whether to go on (the fast
        path takes the rest). A malformed element is skipped up to where the next event starts.
        """
        out: list[Event | LeanEvent] = []
        n = len(buf)
        while True:
            if until is not None and i > until:
                return out, i, False, True
            i = skip_sep(buf, i)
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
                    end = value_end(buf, i)
                except Malformed as e:
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
            self.jumped.add(nxt - i)
            i = nxt

    def take(self, buf: bytes, final: bool) -> tuple[list[Event | LeanEvent], int, bool]:
        """The events of the whole elements at the front of ``buf`` (which starts at an element, or at the
        list's end), where the unread rest starts, and whether the events list's ``]`` was reached.

        Fast path first; where it fails, the elements are walked one by one only as far as needed (past the
        malformed one msgspec pointed at), then the fast path takes the rest.
        """
        out: list[Event | LeanEvent] = []
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
