"""What a salvaged read lost: :class:`ReadReport` (one file's account), and where the bytes were not JSON, how many
events a skipped stretch held, estimated (:class:`Skipped`).

The reader (:mod:`.reader`) jumps over malformed JSON to where the next event starts. One broken event and a
23 MB corrupt region are both one such place; the bytes jumped over are counted exactly, and the events they
held are estimated from the mean size of the elements that were read (never fewer than one per place), and
the note says it is an estimate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReadReport", "Skipped"]


@dataclass
class ReadReport:
    """What reading one file lost (all zero/empty for a file read whole)."""
    truncated: bool = False  # the file ended before the events array or the document closed
    events_skipped: int = 0  # elements of traceEvents that are not events (see :mod:`.reader`)
    bytes_unread: int = 0  # decoded bytes after the last usable element that could not be used (truncated files)
    notes: list[str] = field(default_factory=list)  # one short line per problem
    bytes_skipped: int = 0  # malformed JSON jumped over to the next event (each place one of events_skipped)
    events_lost_estimate: int = 0  # the events those bytes held, estimated from the mean event size (:class:`Skipped`)

    @property
    def salvaged(self) -> bool:
        """True when anything was lost: the file was read only in part."""
        return self.truncated or self.events_skipped > 0 or self.bytes_unread > 0 or bool(self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {"truncated": self.truncated, "events_skipped": self.events_skipped, "bytes_unread": self.bytes_unread,
                "notes": list(self.notes), "bytes_skipped": self.bytes_skipped,
                "events_lost_estimate": self.events_lost_estimate}



class Skipped:
    """The stretches of malformed JSON one read jumped over, and the decoded bytes of that read."""

    __slots__ = ("bytes", "decoded", "places")

    def __init__(self) -> None:
        self.places = 0
        self.bytes = 0
        self.decoded = 0

    def add(self, nbytes: int) -> None:
        """One place of malformed JSON, ``nbytes`` long up to where the next event starts."""
        self.places += 1
        self.bytes += max(int(nbytes), 0)

    def counted(self, chunks: Generator[bytes, None, None]) -> Generator[bytes, None, None]:
        """``chunks`` (the read's decoded bytes), their length added to :attr:`decoded`."""
        with contextlib.closing(chunks):
            for c in chunks:
                self.decoded += len(c)
                yield c

    def estimate(self, elements: int) -> tuple[int, int | None]:
        """(the events the skipped bytes held, estimated; the mean bytes per element it used, None without any).
        ``elements``: the elements read or skipped one by one (the places not included)."""
        if not self.places:
            return 0, None
        if elements <= 0 or self.decoded <= self.bytes:
            return self.places, None
        mean = max((self.decoded - self.bytes) / elements, 1.0)
        return max(self.places, round(self.bytes / mean)), round(mean)

    def summary(self, elements: int) -> tuple[int, str] | None:
        """(:meth:`estimate`'s events; the salvage note: the bytes skipped, in how many places, and the events
        they held, as an estimate), None when nothing was skipped."""
        if not self.places:
            return None
        n, mean = self.estimate(elements)
        where = "1 place" if self.places == 1 else f"{self.places:,} places"
        basis = f"{mean:,} bytes per event read" if mean is not None else "one per place"
        return n, (f"{self.bytes:,} bytes that are not valid JSON skipped ({where}): about {n:,} "
                   f"event{'s' if n != 1 else ''} lost (an estimate, at {basis})")
