"""One Perfetto / chrome://tracing trace from many ranks and roles, written as it is read.

Each input file becomes its own process track(s), named ``{role} rank {R}``; timestamps are moved
onto one clock (absolute time, relative to the earliest file's start); flow ids are made unique per
file so arrows never join events of different ranks. Only one input is in memory at a time.
"""

from __future__ import annotations

import gzip
import logging
from typing import Any, Callable

import msgspec

from .reader import Event, find_traces, read_trace

logger = logging.getLogger(__name__)

__all__ = ["merge_traces"]

_enc = msgspec.json.Encoder()
PID_STRIDE = 1000  # output pid = file index * PID_STRIDE + the file's own pid index


class _MetaArgs(msgspec.Struct):
    name: str | None = None


def _label(role: str | None, rank: int | None, path: str) -> str:
    who = f"rank {rank}" if rank is not None else path.rsplit("/", 1)[-1]
    return f"{role} {who}" if role else who


def merge_traces(path: str, out: str, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    files = find_traces(path)
    # Order tracks by role then rank; the clock base is the earliest first event over all files, found
    # from each file's first timestamps without keeping the files.
    metas = []
    for f, mr, role in files:
        t = read_trace(f, manifest_rank=mr, role=role)
        first = min((e.ts for e in t.events if e.ph in ("X", "i", "s", "f", "B")), default=0.0)
        metas.append((role or t.role or "", -1 if t.rank is None else t.rank, f, mr, role, first + t.offset_us))
        del t
    metas.sort(key=lambda m: (m[0], m[1], m[2]))
    base = min((m[5] for m in metas), default=0.0)
    opener = gzip.open if out.endswith(".gz") else open
    events_out = 0
    with opener(out, "wb") as w:
        w.write(b'{"displayTimeUnit":"ms","distprofMerge":' + _enc.encode(
            {"base_time_us": base, "files": [m[2] for m in metas]}) + b',"traceEvents":[')
        sep = b""
        for i, (_, _, f, mr, role, _) in enumerate(metas):
            t = read_trace(f, manifest_rank=mr, role=role)
            label = _label(role or t.role, t.rank, f)
            shift = t.offset_us - base
            pids: dict[Any, int] = {}
            chunk = []
            for e in t.events:
                pid = pids.get(e.pid)
                if pid is None:
                    pid = pids[e.pid] = i * PID_STRIDE + len(pids)
                chunk.append(_encode(e, pid, shift, i, label))
                if len(chunk) >= 20000:
                    w.write(sep + b",".join(chunk))
                    sep, events_out, chunk = b",", events_out + len(chunk), []
            for orig, pid in pids.items():  # name and order every track of this file
                chunk.append(_enc.encode({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                                          "args": {"sort_index": pid}}))
                if not any(e.ph == "M" and e.name == "process_name" and e.pid == orig for e in t.events):
                    chunk.append(_enc.encode({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                              "args": {"name": f"{label} ({orig})"}}))
            if chunk:
                w.write(sep + b",".join(chunk))
                sep, events_out = b",", events_out + len(chunk)
            if progress:
                progress(i + 1, len(metas))
            del t
        w.write(b"]}")
    return {"out": out, "files": len(metas), "events": events_out, "base_time_us": base}


def _encode(e: Event, pid: int, shift: float, file_index: int, label: str) -> bytes:
    d: dict[str, Any] = {"ph": e.ph, "name": e.name, "pid": pid, "tid": e.tid}
    if e.cat:
        d["cat"] = e.cat
    if e.ph != "M":
        d["ts"] = e.ts + shift
    if e.ph == "X" or e.dur:
        d["dur"] = e.dur
    if e.id is not None:
        d["id"] = f"{file_index}:{e.id}"  # flows stay within their own rank
    if e.bp is not None:
        d["bp"] = e.bp
    if e.s is not None:
        d["s"] = e.s
    if e.ph == "M" and e.name == "process_name":
        try:
            orig = msgspec.json.decode(e.args, type=_MetaArgs).name if e.args else None
        except msgspec.DecodeError:
            orig = None
        d["args"] = {"name": f"{label} / {orig}" if orig else label}
    elif e.args:
        d["args"] = e.args
    return _enc.encode(d)
