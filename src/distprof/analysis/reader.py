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
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import msgspec

logger = logging.getLogger(__name__)

__all__ = ["Event", "RankTrace", "TraceStream", "TraceFile", "TraceError", "open_trace", "read_trace",
           "find_traces", "rank_from_name"]

BATCH_BYTES = 4 << 20  # decoded JSON per batch: large enough to amortise, small enough to be cheap to hold


class Event(msgspec.Struct, gc=False):
    """One trace event: every field of the Trace Event Format (other per-event keys are not kept)."""
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")  # decoded only when an analysis needs it
    id: int | str | None = None  # flow / async / object id
    bp: str | None = None  # flow binding point
    s: str | None = None  # instant-event scope
    tts: float | None = None  # thread clock
    tdur: float | None = None
    id2: msgspec.Raw = msgspec.Raw(b"")  # {"local": ...} or {"global": ...}
    scope: str | None = None
    cname: str | None = None
    sf: int | str | None = None  # stack frame ids (the trace's stackFrames are not kept)
    esf: int | str | None = None
    stack: msgspec.Raw = msgspec.Raw(b"")
    estack: msgspec.Raw = msgspec.Raw(b"")
    bind_id: int | str | None = None  # flow v2
    flow_in: bool | None = None
    flow_out: bool | None = None


class _Head(msgspec.Struct, gc=False):
    """The document's keys other than traceEvents (before or after the array)."""
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    baseTimeNanoseconds: int | None = None
    distprof: dict[str, Any] | None = None


_head_decoder = msgspec.json.Decoder(_Head)
_list_decoder = msgspec.json.Decoder(list[Event])
_ARRAY_OPEN = re.compile(rb"\s*:\s*\[")
_COMMA = re.compile(rb"\s*,")


class TraceError(ValueError):
    """A file that cannot be read as a trace; the message names the file and what is wrong."""


class TraceFile(NamedTuple):
    """A trace found under a path, with what its run directory says about it."""
    path: str
    manifest_rank: int | None = None
    role: str | None = None
    window: dict[str, Any] | None = None  # the manifest record of the window that wrote this file


_RANK_PATTERNS = [re.compile(p) for p in (r"rank[-_]?(\d+)", r"worker[-_]?(\d+)")]


def rank_from_name(path: str) -> int | None:
    """``rank-3``, ``rank00003``, ``worker3`` (the last path component that names one wins)."""
    for part in reversed(path.replace("\\", "/").split("/")):
        low = part.lower()
        for pat in _RANK_PATTERNS:
            m = pat.search(low)
            if m:
                return int(m.group(1))
    return None


def _is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _open(path: str):
    if _is_remote(path):
        import fsspec

        return fsspec.open(path, "rb").open()
    return open(path.removeprefix("file://"), "rb")


def _byte_chunks(path: str, size: int, on_read: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The file's bytes in chunks of about ``size``, gunzipped on the fly when it is gzip.

    ``on_read`` is told how many bytes of the file (compressed, for gzip) each read took. A gzip
    stream that ends early yields what it holds, with a warning (the JSON is then salvaged).
    """
    try:
        f = _open(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e})") from None
    note = on_read or (lambda n: None)
    with f:
        first = f.read(size)
        note(len(first))
        if first[:2] != b"\x1f\x8b":
            while first:
                yield first
                first = f.read(size)
                note(len(first))
            return
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        raw, produced = first, 0
        while raw:
            try:
                out = d.decompress(raw, size)
                while out:
                    produced += len(out)
                    yield out
                    out = d.decompress(d.unconsumed_tail, size) if d.unconsumed_tail else b""
            except zlib.error as e:
                if not produced:
                    raise TraceError(f"{path}: not a readable gzip file ({e})") from None
                logger.warning("%s: gzip stream is corrupt after %d bytes (%s); reading what it holds", path, produced, e)
                return
            if d.eof and d.unused_data:  # concatenated gzip members
                raw = d.unused_data
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                continue
            raw = f.read(size // 4)
            note(len(raw))
        if not d.eof:
            logger.warning("%s: gzip stream is truncated; reading the %d bytes it holds", path, produced)


class TraceStream:
    """One trace file, read batch by batch by :meth:`batches`.

    ``rank``, ``role``, ``distributed_info`` and ``device_properties`` are known once the header is
    read (on the first batch); ``offset_us``, ``event_count`` and ``salvaged`` once the stream is exhausted.
    Rank: ``rank`` if given, else distributedInfo.rank, else the manifest's, else the file name.
    """

    def __init__(self, path: str, rank: int | None = None, manifest_rank: int | None = None,
                 role: str | None = None, window: dict[str, Any] | None = None, batch_bytes: int = BATCH_BYTES,
                 on_read: Callable[[int], None] | None = None):
        self.path = path
        self._on_read = on_read
        self.window = window
        self.rank: int | None = None
        self.rank_source = "none"
        self.role = role
        self.offset_us = 0.0
        self.distributed_info: dict[str, Any] | None = None
        self.device_properties: list[dict[str, Any]] = []
        self.salvaged = False
        self.event_count = 0
        self._given_rank = rank
        self._manifest_rank = manifest_rank
        self._batch = batch_bytes
        self._resolve_rank()

    # ---- metadata ------------------------------------------------------------------------------------
    def _apply_head(self, text: bytes) -> None:
        try:
            head = _head_decoder.decode(text)
        except msgspec.ValidationError as e:
            raise TraceError(f"{self.path}: not a Chrome/Kineto trace ({e})") from None
        except msgspec.DecodeError as e:
            raise TraceError(f"{self.path}: not valid JSON around traceEvents ({e})") from None
        if head.distributedInfo is not None:
            self.distributed_info = head.distributedInfo
        if head.deviceProperties:
            self.device_properties = head.deviceProperties
        if head.baseTimeNanoseconds:
            self.offset_us = head.baseTimeNanoseconds / 1000.0
        if self.role is None and head.distprof:
            self.role = head.distprof.get("role")
        self._resolve_rank()

    def _resolve_rank(self) -> None:
        info = self.distributed_info or {}
        if self._given_rank is not None:
            self.rank, self.rank_source = self._given_rank, "given"
        elif isinstance(info.get("rank"), int):
            self.rank, self.rank_source = info["rank"], "distributedInfo"
        elif self._manifest_rank is not None:
            self.rank, self.rank_source = self._manifest_rank, "manifest"
        else:
            self.rank = rank_from_name(self.path)
            self.rank_source = "name" if self.rank is not None else "none"

    # ---- events --------------------------------------------------------------------------------------
    def batches(self) -> Iterator[list[Event]]:
        """Lists of events in file order; each is safe to drop once reduced."""
        self.event_count, self.salvaged = 0, False
        try:
            for batch in self._batches():
                self.event_count += len(batch)
                yield batch
        except msgspec.ValidationError as e:
            raise TraceError(f"{self.path}: not a Chrome/Kineto trace ({e})") from None

    def _batches(self) -> Iterator[list[Event]]:
        chunks = _byte_chunks(self.path, self._batch, self._on_read)
        buf = b""
        for c in chunks:
            buf += c
            if buf.strip():
                break
        buf = buf.lstrip()
        if not buf:
            raise TraceError(f"{self.path}: empty file")
        is_object = buf[:1] == b"{"
        if buf[:1] == b"[":
            buf = buf[1:]
        elif is_object:
            key = buf.find(b'"traceEvents"')
            while key < 0 or len(buf) < key + 64:  # enough bytes to see the array open
                more = next(chunks, b"")
                if not more:
                    break
                buf += more
                key = buf.find(b'"traceEvents"')
            m = _ARRAY_OPEN.match(buf, key + len(b'"traceEvents"')) if key >= 0 else None
            if m is None:
                self._refuse_whole(buf, chunks)
            self._apply_head(b"{" + buf[1:key].rstrip().rstrip(b",") + b"}")
            buf = buf[m.end():]
        else:
            raise TraceError(f"{self.path}: not JSON (starts with {buf[:16]!r})")

        pending = [buf]
        size = len(buf)
        for c in chunks:
            pending.append(c)
            size += len(c)
            if size < self._batch:
                continue
            buf = b"".join(pending)
            cut = self._cut(buf)
            if cut is None:
                pending, size = [buf], len(buf)
                continue
            events, rest = cut
            pending, size = [buf[rest:]], len(buf) - rest
            yield events
        yield from self._finish(b"".join(pending), is_object)

    @staticmethod
    def _cut(buf: bytes, tries: int = 8, then_comma: bool = True) -> tuple[list[Event], int] | None:
        """The complete events at the front of ``buf`` (up to a ``}`` that closes an event), and where the rest starts.

        With ``then_comma`` only a ``}`` followed by ``,`` is a candidate (more events follow); without,
        any ``}`` is (salvaging a cut-off file). A candidate inside an event (nested args, or inside a
        string) leaves an unclosed object or string, which msgspec refuses; the next one to the left is
        tried then.
        """
        end = len(buf)
        while tries > 0:
            i = buf.rfind(b"}", 0, end)
            if i < 0:
                return None
            end = i
            m = _COMMA.match(buf, i + 1)
            if then_comma and m is None:
                continue
            tries -= 1
            try:
                return _list_decoder.decode(b"[" + buf[: i + 1] + b"]"), (m.end() if m else i + 1)
            except msgspec.DecodeError:
                continue
        return None

    def _finish(self, buf: bytes, is_object: bool) -> Iterator[list[Event]]:
        """The last events, the array's end and (object form) the keys after it; else salvage."""
        end, tries = len(buf), 16
        while tries > 0:
            i = buf.rfind(b"]", 0, end)
            if i < 0:
                break
            end = i
            tail = buf[i + 1:].strip()
            if not (tail[:1] in (b",", b"}") if is_object else tail == b""):
                continue
            tries -= 1
            try:
                events = _list_decoder.decode(b"[" + buf[:i] + b"]")
            except msgspec.DecodeError:
                continue
            if is_object and tail != b"}":
                self._apply_head(b"{" + tail[1:])
            yield events
            return
        # No closing bracket that parses: the file was cut off. Keep every complete event.
        cut = self._cut(buf, tries=64, then_comma=False)
        if cut is not None:
            logger.warning("%s: trace is truncated; salvaged the complete events", self.path)
            self.salvaged = True
            yield cut[0]
            return
        if self.event_count == 0 and buf.strip():
            raise TraceError(f"{self.path}: not valid JSON and nothing could be salvaged")
        if buf.strip() or self.event_count == 0:
            logger.warning("%s: trace is truncated; salvaged the complete events", self.path)
            self.salvaged = True

    def _refuse_whole(self, buf: bytes, chunks: Iterator[bytes]) -> None:
        """An object without a ``traceEvents`` array: decode it whole for the most precise message."""
        data = buf + b"".join(chunks)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise TraceError(f"{self.path}: not valid JSON and nothing could be salvaged ({e})") from None
        what = "no traceEvents key" if "traceEvents" not in doc else f"traceEvents is a {type(doc['traceEvents']).__name__}"
        raise TraceError(f"{self.path}: not a Chrome/Kineto trace ({what}, expected a list of events)")


def open_trace(path: str, rank: int | None = None, manifest_rank: int | None = None, role: str | None = None,
               window: dict[str, Any] | None = None, on_read: Callable[[int], None] | None = None) -> TraceStream:
    """A :class:`TraceStream` over one file (nothing is read until :meth:`TraceStream.batches` runs).

    ``on_read(n)`` is called as the file's bytes are read (for progress bars).
    """
    return TraceStream(path, rank=rank, manifest_rank=manifest_rank, role=role, window=window, on_read=on_read)


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
    salvaged: bool = False
    window: dict[str, Any] | None = None

    def batches(self) -> Iterator[list[Event]]:
        yield self.events


def read_trace(path: str, rank: int | None = None, manifest_rank: int | None = None, role: str | None = None,
               window: dict[str, Any] | None = None) -> RankTrace:
    """Read one whole trace into memory."""
    s = open_trace(path, rank=rank, manifest_rank=manifest_rank, role=role, window=window)
    events = [e for batch in s.batches() for e in batch]
    return RankTrace(path=path, events=events, rank=s.rank, rank_source=s.rank_source, offset_us=s.offset_us,
                     distributed_info=s.distributed_info, device_properties=s.device_properties, role=s.role,
                     salvaged=s.salvaged, window=window)


_TRACE_NAME = re.compile(r"\.json(\.gz)?$")


def _manifest_windows(fs, rank_dir: str) -> dict[str, dict[str, Any]]:
    """File name -> the manifest record of the window that published it."""
    out: dict[str, dict[str, Any]] = {}
    try:
        with fs.open(posixpath.join(rank_dir, "manifest.jsonl"), "rb") as f:
            for line in f:
                try:
                    rec = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    continue  # a torn last line; the files it named are still found on disk
                for entry in rec.get("files") or [{"path": rec.get("file")}]:
                    if entry.get("path"):
                        out[entry["path"].rsplit("/", 1)[-1]] = rec
    except OSError:
        pass
    return out


def find_traces(path: str) -> list[TraceFile]:
    """Trace files under ``path`` (a file, a folder of traces, or a distprof run directory; local or fsspec URL).

    Hidden files and folders, distprof's own JSON files and py-spy's outputs are skipped; in a run
    directory each file carries its role, its rank and its manifest window.
    """
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(path)
        is_file, is_dir = fs.isfile(root), (not fs.isfile(root)) and fs.isdir(root)
    except ImportError as e:  # e.g. s3:// without s3fs
        raise TraceError(f"{path}: cannot be read ({e})") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot be listed ({e})") from None
    if is_file:
        return [TraceFile(path)]
    if not is_dir:
        raise TraceError(f"{path}: no such file or directory")
    # Local paths stay plain paths; remote ones keep their protocol so workers can open them.
    name = (lambda p: p) if not _is_remote(path) else fs.unstrip_protocol
    found = []
    for d, dirs, names in fs.walk(root):
        rel = posixpath.relpath(d, root) if d != root else ""
        if any(part.startswith(".") for part in rel.split("/") if part):
            continue
        manifest_rank, role, windows = None, None, {}
        m = re.search(r"rank(\d{5})$", d)
        if m and "manifest.jsonl" in names:
            manifest_rank = int(m.group(1))
            windows = _manifest_windows(fs, d)
            # The manifest names the role; a folder name is the fallback (the role folder itself may be `path`).
            role = next((w["role"] for w in windows.values() if w.get("role")), None) or \
                posixpath.basename(posixpath.dirname(d.rstrip("/")))
        for n in sorted(names):
            if n.startswith(".") or n in ("run.json", "role.json") or not _TRACE_NAME.search(n):
                continue
            if n.endswith((".speedscope.json", ".chrometrace.json")):
                continue  # py-spy outputs are not Kineto traces
            found.append(TraceFile(name(posixpath.join(d, n)), manifest_rank, role, windows.get(n)))
    found.sort(key=lambda f: f.path)
    return found
