"""One output file (plain JSON or ONE gzip member) made of parts written by several processes.

Each worker writes its part to a file of its own (:class:`PartWriter`); the driver joins the parts in order
(:class:`Joiner`), never holding more than a copy buffer. For ``.gz`` output each part is a raw deflate stream
ended with a sync flush (byte-aligned, no final block), so the parts concatenate into one deflate stream, as
pigz does; the driver adds the gzip header, its own small pieces (the JSON around the parts, each compressed
alone so no back-reference crosses into a part), the final empty block and the trailer (the parts' CRC-32s
combined, the total length). One member: gzip readers and browser viewers that read only the first member
still see everything. Compression is ISA-L's (``isal``: several times faster than zlib at its fast levels).
"""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass
from typing import BinaryIO

from isal import isal_zlib

__all__ = ["LEVEL", "Joiner", "Part", "PartWriter"]

LEVEL = 1  # ISA-L level 1: about the speed of level 0, a smaller file
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown


@dataclass
class Part:
    """One finished part: where it is, its uncompressed length and CRC-32 (for gzip)."""
    path: str
    length: int
    crc: int


class PartWriter:
    """Writes one part (``gz``: raw deflate, sync-flushed at the end; else the bytes as given)."""

    def __init__(self, path: str, gz: bool):
        self.path = path
        self.length = 0
        self.crc = 0
        self._f = open(path, "wb")
        self._z = isal_zlib.compressobj(LEVEL, isal_zlib.DEFLATED, -15) if gz else None

    def write(self, data: bytes | memoryview) -> None:
        self.length += len(data)
        if self._z is None:
            self._f.write(data)
            return
        self.crc = isal_zlib.crc32(data, self.crc)
        self._f.write(self._z.compress(data))

    def close(self) -> Part:
        try:
            if self._z is not None:
                self._f.write(self._z.flush(isal_zlib.Z_SYNC_FLUSH))
        finally:
            self._f.close()
        return Part(self.path, self.length, self.crc)


class Joiner:
    """Writes the output: :meth:`add` the driver's own bytes, :meth:`add_part` a worker's part, then :meth:`close`."""

    def __init__(self, f: BinaryIO, gz: bool):
        self._f = f
        self._gz = gz
        self.length = 0
        self.crc = 0
        if gz:
            f.write(_GZIP_HEADER)

    def add(self, data: bytes) -> None:
        if not data:
            return
        if self._gz:
            z = isal_zlib.compressobj(LEVEL, isal_zlib.DEFLATED, -15)  # alone: nothing refers across a part
            self._f.write(z.compress(data) + z.flush(isal_zlib.Z_SYNC_FLUSH))
            self.crc = isal_zlib.crc32(data, self.crc)
        else:
            self._f.write(data)
        self.length += len(data)

    def add_part(self, part: Part) -> None:
        """Copy a part in (and delete its file)."""
        with open(part.path, "rb") as src:
            shutil.copyfileobj(src, self._f, 1 << 20)
        os.unlink(part.path)
        if self._gz and part.length:
            self.crc = isal_zlib.crc32_combine(self.crc, part.crc, part.length)
        self.length += part.length

    def close(self) -> None:
        if self._gz:
            z = isal_zlib.compressobj(LEVEL, isal_zlib.DEFLATED, -15)
            self._f.write(z.flush(isal_zlib.Z_FINISH))  # the final (empty) block
            self._f.write(struct.pack("<II", self.crc & 0xFFFFFFFF, self.length & 0xFFFFFFFF))
