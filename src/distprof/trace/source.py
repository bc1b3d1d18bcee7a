"""A trace's bytes, opened without trusting the path or the stream: the lowest layer of reading.

Only regular files are opened (a FIFO or a device named like a trace is refused, never waited on);
local paths and fsspec URLs alike; gzip is inflated on the fly, member after member, in bounded pieces
(a gzip bomb streams instead of inflating at once), and a cut-off or corrupt stream yields what it holds
and says why.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
import zlib
from collections.abc import Callable, Generator, Iterator

from isal import isal_zlib

from distprof.rundir.layout import is_url

logger = logging.getLogger(__name__)

__all__ = ["TraceError", "byte_chunks", "file_kind", "open_local", "plain_file", "read_span", "size_at_open"]

_GZIP_FEED = 1 << 16  # compressed bytes per inflate call


class TraceError(ValueError):
    """A file that cannot be read as a trace; the message names the file and what is wrong."""


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_local(path: str):
    """A local regular file, opened without blocking: a FIFO (or a device) is refused, never waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TraceError(f"{path}: not a regular file ({file_kind(mode)})")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _open(path: str):
    if is_url(path):
        from distprof.rundir.netfs import describe, is_timeout, open_url

        try:
            return open_url(path)  # bounded waits: a store that never answers fails (rundir/netfs.py)
        except Exception as e:
            if is_timeout(e):
                raise TraceError(f"{path}: cannot be read ({describe(e)})") from None
            if isinstance(e, (TraceError, OSError, ValueError)):
                raise
            # a storage library's own errors (botocore's NoCredentialsError ...): the input's
            raise TraceError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    return open_local(path.removeprefix("file://"))


def plain_file(path: str) -> tuple[int, tuple[int, int]] | None:
    """The size and identity (device, inode) of a local regular file that is not gzip (its bytes are the JSON, at
    their own offsets), else None."""
    if is_url(path):
        return None
    try:
        with open_local(path.removeprefix("file://")) as f:
            if f.read(2) == b"\x1f\x8b":
                return None
            st = os.fstat(f.fileno())
            return st.st_size, (st.st_dev, st.st_ino)
    except (TraceError, OSError, ValueError):
        return None  # reading it the usual way says what is wrong


def _same_file(f, path: str, ident: tuple[int, int] | None) -> None:
    """Refuse a file opened again by path that is no longer the one first opened (replaced while read): its
    offsets would be another file's."""
    if ident is not None:
        st = os.fstat(f.fileno())
        if (st.st_dev, st.st_ino) != tuple(ident):
            raise TraceError(f"{path}: read failed (the file was replaced while it was read)")


def read_span(path: str, start: int, end: int, brackets: bool = False,
              ident: tuple[int, int] | None = None) -> bytes | bytearray:
    """Bytes ``start:end`` of a local regular file (a run of events another process found the bounds of);
    ``brackets``: between ``[`` and ``]``, read in place (no copy to make them a JSON list); ``ident``: the
    file's (device, inode) when first opened (see :func:`plain_file`), checked."""
    try:
        with open_local(path.removeprefix("file://")) as f:
            _same_file(f, path, ident)
            if not brackets:
                return os.pread(f.fileno(), end - start, start)
            buf = bytearray(end - start + 2)
            buf[0], buf[-1] = 0x5B, 0x5D
            got = os.preadv(f.fileno(), [memoryview(buf)[1:-1]], start)
            if got != end - start:
                raise TraceError(f"{path}: read failed (file shrank: {got} of {end - start} bytes at {start})")
            return buf
    except OSError as e:
        raise TraceError(f"{path}: read failed ({e})") from None


def byte_chunks(path: str, size: int, on_read: Callable[[int], None] | None, problem: list[str],
                offset: int = 0, ident: tuple[int, int] | None = None, end: int | None = None
                ) -> Generator[bytes, None, None]:
    """The file's bytes in chunks of at most ``size``, gunzipped on the fly when it is gzip.

    Only the bytes the file had when it was opened are read (``end``: that size, when known from an earlier
    open, see :func:`plain_file`): a file that keeps growing is never followed, and one that grew while it
    was read gets one line in ``problem`` saying so (its events after that size are not read).
    ``offset``: start there (plain files only: see :func:`plain_file`, whose ``ident`` is then checked).
    ``on_read`` is told how many bytes of the file (compressed, for gzip) each read took. A gzip stream
    that is cut off or corrupt yields what it holds and appends why to ``problem`` (the JSON is then
    salvaged). Concatenated gzip members are read in turn; bytes after the last member that are not a
    gzip member are ignored. Output is bounded per call (``max_length``), so a gzip bomb streams.
    """
    f = _open_or_fail(path)
    note = on_read or (lambda n: None)
    pos, counted = [0], [0]  # where the file is read, and how far its bytes were told to on_read
    stop = [size_at_open(f) if end is None else end, False]  # the size when opened; whether its growth was told

    def read(n: int) -> bytes:
        if stop[0] is not None:
            n = min(n, stop[0] - pos[0])
            if n <= 0:
                if not stop[1]:
                    stop[1] = True
                    _grew(f, path, stop[0], problem)
                return b""
        try:
            data = f.read(n)
        except OSError as e:
            raise TraceError(f"{path}: read failed ({e})") from None
        pos[0] += len(data)
        if pos[0] > counted[0]:  # bytes read again (zlib taking over from ISA-L at 0) are not counted twice
            note(pos[0] - counted[0])
            counted[0] = pos[0]
        return data

    with f:
        if ident is not None:
            _same_file(f, path, ident)
        if offset:
            try:
                f.seek(offset)
            except (OSError, ValueError) as e:
                raise TraceError(f"{path}: read failed ({e})") from None
            pos[0] = counted[0] = offset
        first = read(size)
        if offset or first[:2] != b"\x1f\x8b":
            while first:
                yield first
                first = read(size)
            return
        # ISA-L inflates about 4x faster than zlib, which is a third of the time of reading a gzipped trace.
        # It cannot copy a stream's state, which salvaging a corrupt stream needs: on an error or a cut stream
        # the file is read again from the start with zlib, skipping what was already yielded.
        produced = 0
        try:
            for out in _gunzip(isal_zlib, isal_zlib.error, first, read, size, path, problem):
                produced += len(out)
                yield out
            return
        except _Corrupt:
            logger.debug("%s: ISA-L found the gzip stream corrupt after %d bytes; reading it again with zlib", path,
                         produced)
        again = None
        try:
            f.seek(0)
        except (OSError, ValueError):  # a stream that cannot seek back (HTTP without a length): opened again
            f = again = _open_or_fail(path)
        with again or contextlib.nullcontext():
            pos[0] = 0
            skip = produced
            for out in _gunzip(zlib, zlib.error, read(size), read, size, path, problem):
                if skip:
                    out, skip = out[skip:], max(0, skip - len(out))
                    if not out:
                        continue
                yield out


def size_at_open(f) -> int | None:
    """The size of an open file (a local one's, or what an fsspec file says), None when unknown."""
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        size = getattr(f, "size", None)
        return size if isinstance(size, int) and size >= 0 else None


def _grew(f, path: str, size: int, problem: list[str]) -> None:
    """After reading the ``size`` bytes a file had when opened: one line in ``problem`` if it holds more now."""
    try:
        grown = os.fstat(f.fileno()).st_size > size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return  # an object in a store does not grow in place
    if grown:
        logger.info("%s: the file grew while it was read; read up to its size when opened", path)
        problem.append(f"the file grew while it was read: only the {size:,} bytes it had when opened were read")


def _open_or_fail(path: str):
    try:
        return _open(path)
    except TraceError:
        raise
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: not a regular file (a directory)") from None
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: cannot be read ({e})") from None


class _Corrupt(Exception):
    """ISA-L met a corrupt byte or a cut stream: zlib, which can replay from a saved state, takes over."""


def _gunzip(lib, error, first: bytes, read, size: int, path: str, problem: list[str]) -> Iterator[bytes]:
    """Inflate gzip members with ``lib`` (zlib, or ISA-L's zlib-compatible module, which raises
    :class:`_Corrupt` instead of salvaging)."""
    salvage = lib is zlib
    d = lib.decompressobj(16 + zlib.MAX_WBITS)
    raw, at, produced, member_out, fed = first, 0, 0, 0, False
    while True:
        if at >= len(raw):
            raw, at = read(max(size // 4, 1)), 0
            if not raw:
                break
        # Small pieces in: a corrupt stream raises with the output of the whole call lost, so keep it small.
        piece = memoryview(raw)[at:at + _GZIP_FEED]
        at += len(piece)
        fed = True
        saved, piece_out = (d.copy() if salvage else None), 0
        try:
            for out in _inflate(d, piece, size):
                produced += len(out)
                member_out += len(out)
                piece_out += len(out)
                yield out
        except error as e:
            if produced and not member_out:  # not another member: padding or garbage after the last one
                logger.info("%s: bytes after the last gzip member ignored (%s)", path, e)
                return
            if not salvage:
                raise _Corrupt() from None
            # The failing call's output is lost with the exception: replay the piece in small steps from
            # before it, to keep what precedes the corrupt byte (less what was already yielded).
            skip = piece_out
            for out in _replay(saved, piece):
                out, skip = out[skip:], max(0, skip - len(out))
                if out:
                    produced += len(out)
                    yield out
            if not produced:
                raise TraceError(f"{path}: not a readable gzip file ({e})") from None
            problem.append(f"gzip stream corrupt after {produced:,} bytes ({e})")
            return
        if d.eof:  # a file may hold several members: read the next one, if any
            raw, at, member_out, fed = d.unused_data + raw[at:], 0, 0, False
            d = lib.decompressobj(16 + zlib.MAX_WBITS)
    if fed and not d.eof:
        if not salvage:  # ISA-L may hold back output of a cut stream, and waits on a short garbage tail
            raise _Corrupt()
        if not produced:
            raise TraceError(f"{path}: gzip stream ends before any data")
        problem.append(f"gzip stream ends early, after {produced:,} bytes")


def _inflate(d, data, size: int) -> Iterator[bytes]:
    """Decompress ``data`` in outputs of at most ``size`` bytes (a gzip bomb never inflates at once)."""
    out = d.decompress(data, size)
    while True:
        if out:
            yield out
        tail = d.unconsumed_tail
        if not tail or d.eof or not out:  # (no output with input left would be no progress: stop)
            return
        out = d.decompress(tail, size)


def _replay(d, data) -> Iterator[bytes]:
    """Decompress ``data`` up to its first corrupt byte: 512 bytes a step (at most ~0.5 MB out: deflate expands
    1032:1 at most), then byte by byte within the step that fails."""
    for k in range(0, len(data), 512):
        before = d.copy()
        try:
            yield d.decompress(data[k:k + 512])
            continue
        except zlib.error:
            d = before
        for j in range(k, min(k + 512, len(data))):
            try:
                yield d.decompress(data[j:j + 1])
            except zlib.error:
                return
        return
