"""Read Kineto / Chrome-trace JSON (plain or gzipped, local or fsspec URL) into compact typed events.

Decoding uses msgspec typed structs with ``gc=False`` (no cyclic-GC pressure,
the dominant cost of dict-based parsing) and keeps ``args`` undecoded
(``msgspec.Raw``) until an analysis asks for them. Both the object form
(``{"traceEvents": [...]}``) and the bare-list form are accepted, and both time
bases: old absolute-µs ``ts``, and new ``ts`` relative to
``baseTimeNanoseconds``. ``RankTrace.offset_us`` turns any ``ts`` into absolute
epoch µs so ranks from different hosts line up.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

logger = logging.getLogger(__name__)

__all__ = ["Event", "RankTrace", "TraceError", "read_trace", "find_traces", "rank_from_name"]


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw(b"")  # decoded only when an analysis needs it
    id: int | str | None = None
    bp: str | None = None
    s: str | None = None  # instant-event scope


class _TraceDoc(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    baseTimeNanoseconds: int | None = None
    distprof: dict[str, Any] | None = None


_doc_decoder = msgspec.json.Decoder(_TraceDoc)
_list_decoder = msgspec.json.Decoder(list[Event])


class TraceError(ValueError):
    """A file that cannot be read as a trace; the message names the file and what is wrong."""


@dataclass
class RankTrace:
    path: str
    events: list[Event]
    rank: int | None
    rank_source: str  # distributedInfo | manifest | name | none
    offset_us: float = 0.0  # add to ts for absolute epoch µs
    distributed_info: dict[str, Any] | None = None
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    role: str | None = None
    salvaged: bool = False


_RANK_PATTERNS = [re.compile(p) for p in (r"rank[-_]?(\d+)", r"worker[-_]?(\d+)", r"(?:^|[^a-z])r(\d+)(?:[^0-9]|$)")]


def rank_from_name(path: str) -> int | None:
    """``rank-3``, ``rank00003``, ``worker3`` (the last path component that names one wins)."""
    for part in reversed(path.replace("\\", "/").split("/")):
        low = part.lower()
        for pat in _RANK_PATTERNS[:2]:
            m = pat.search(low)
            if m:
                return int(m.group(1))
    return None


def _read_bytes(path: str) -> bytes:
    if "://" in path and not path.startswith("file://"):
        import fsspec

        with fsspec.open(path, "rb") as f:
            raw = f.read()
    else:
        with open(path.removeprefix("file://"), "rb") as f:
            raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, zlib.error, OSError):
            return _gunzip_partial(raw, path)
    return raw


def _gunzip_partial(raw: bytes, path: str) -> bytes:
    """Whatever a truncated gzip stream still holds (the JSON is then salvaged or refused)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw)
    except zlib.error as e:
        raise TraceError(f"{path}: not a readable gzip file ({e})") from None
    logger.warning("%s: gzip stream is truncated; reading the %d bytes it holds", path, len(out))
    return out


def _salvage(data: bytes) -> bytes | None:
    """Close a trace cut off mid-array: keep every complete event."""
    start = data.find(b"[", data.find(b'"traceEvents"') if b'"traceEvents"' in data else 0)
    if start < 0:
        return None
    cut = data.rfind(b"}", start)
    while cut > start:
        candidate = data[start:cut + 1] + b"]"
        try:
            msgspec.json.decode(candidate, type=list[Event])
            return candidate
        except msgspec.DecodeError:
            cut = data.rfind(b"}", start, cut)
    return None


def read_trace(path: str, rank: int | None = None, manifest_rank: int | None = None, role: str | None = None) -> RankTrace:
    """Read one trace. Rank: ``rank`` if given, else distributedInfo.rank, else the manifest's, else the file name."""
    try:
        data = _read_bytes(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e})") from None
    if not data.strip():
        raise TraceError(f"{path}: empty file")
    salvaged = False
    first = data.lstrip()[:1]
    try:
        if first == b"[":
            doc = _TraceDoc(traceEvents=_list_decoder.decode(data))
        elif first == b"{":
            doc = _doc_decoder.decode(data)
        else:
            raise TraceError(f"{path}: not JSON (starts with {data[:16]!r})")
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: not a Chrome/Kineto trace ({e})") from None
    except msgspec.DecodeError as e:
        events = _salvage(data)
        if events is None:
            raise TraceError(f"{path}: not valid JSON and nothing could be salvaged ({e})") from None
        logger.warning("%s: trace is truncated (%s); salvaged the complete events", path, e)
        doc = _TraceDoc(traceEvents=_list_decoder.decode(events))
        head = data[: data.find(b'"traceEvents"')] if b'"traceEvents"' in data else b""
        m = re.search(rb'"baseTimeNanoseconds"\s*:\s*(\d+)', data)
        doc.baseTimeNanoseconds = int(m.group(1)) if m else None
        m = re.search(rb'"distributedInfo"\s*:\s*(\{[^{}]*\})', head)
        if m:
            try:
                doc.distributedInfo = msgspec.json.decode(m.group(1))
            except msgspec.DecodeError:
                pass
        salvaged = True

    info = doc.distributedInfo or {}
    if rank is not None:
        source = "given"
    elif isinstance(info.get("rank"), int):
        rank, source = info["rank"], "distributedInfo"
    elif manifest_rank is not None:
        rank, source = manifest_rank, "manifest"
    else:
        rank = rank_from_name(path)
        source = "name" if rank is not None else "none"
    offset = doc.baseTimeNanoseconds / 1000.0 if doc.baseTimeNanoseconds else 0.0
    role = role or (doc.distprof or {}).get("role")
    return RankTrace(path=path, events=doc.traceEvents, rank=rank, rank_source=source, offset_us=offset,
                     distributed_info=doc.distributedInfo, device_properties=doc.deviceProperties or [],
                     role=role, salvaged=salvaged)


_TRACE_NAME = re.compile(r"\.json(\.gz)?$")


def find_traces(path: str) -> list[tuple[str, int | None, str | None]]:
    """Trace files under ``path`` (a file, a folder of traces, or a distprof run directory).

    Returns ``(file, manifest_rank, role)``; hidden temporaries and distprof's own JSON files are skipped.
    """
    if os.path.isfile(path) or ("://" in path and _TRACE_NAME.search(path)):
        return [(path, None, None)]
    if not os.path.isdir(path):
        raise TraceError(f"{path}: no such file or directory")
    found = []
    for d, dirs, names in os.walk(path):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        manifest_rank, role = None, None
        m = re.search(r"rank(\d{5})$", d)
        if m and os.path.exists(os.path.join(d, "manifest.jsonl")):
            manifest_rank = int(m.group(1))
            role = os.path.relpath(os.path.dirname(d), path).replace(os.sep, "/")
        for n in sorted(names):
            if n.startswith(".") or n in ("run.json", "role.json") or not _TRACE_NAME.search(n):
                continue
            if n.endswith((".speedscope.json", ".chrometrace.json")):
                continue  # py-spy outputs are not Kineto traces
            found.append((os.path.join(d, n), manifest_rank, role))
    return found
