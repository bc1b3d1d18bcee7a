"""What a salvaged read lost where the bytes were not JSON: how many events a skipped stretch held, estimated.

The reader (:mod:`.reader`) jumps over malformed JSON to where the next event starts. One broken event and a
23 MB corrupt region are both one such place; the bytes jumped over are counted exactly, and the events they
held are estimated from the mean size of the elements that were read (never fewer than one per place), and
the note says it is an estimate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["Skipped"]


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

    def counted(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
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
