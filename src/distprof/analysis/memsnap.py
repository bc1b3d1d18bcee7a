"""Reading CUDA allocator snapshots (``torch.cuda.memory._snapshot()`` pickles: the ``cuda_memory`` backend's
``stepA-B.memory.pickle`` window files and ``oom-*.memory.pickle`` OOM files) as untrusted input.

A pickle can run code when loaded: :func:`load` uses the C unpickler with a ``find_class`` that refuses every global
(a snapshot holds only dicts, lists, tuples, str, int, float, bool and None; torch writes nothing else), refuses
persistent ids and out-of-band buffers, and refuses a file larger than ``max_bytes`` before reading it. Anything
wrong with the file is a :class:`SnapshotError`, one line naming the file (the verbs list it under ``errors``: exit 1,
or 2 when nothing could be read).

Why the C unpickler and not a streaming walk (``pickletools.genops`` building one trace entry at a time): on a
synthetic 200 MB snapshot (``benchmarks/bench_memsnap.py``; docs/analysis.md, "Memory", has the figures), merely
iterating the opcodes with genops, before building anything, took 12x as long as the C unpickler's whole load
(59 s against 4.9 s), and a walk that gives the answers must also emulate the memo (torch's pickles share frame
dicts and key strings through it). The price is memory: the load peaks at about 8x the file (+1.57 GB for 200 MB),
so the file-size limit (:data:`MAX_SNAPSHOT_BYTES`, 2 GiB) is what bounds it; the trace lists are consumed as they
are converted, so parsing adds nothing to that peak.

The format is torch's (``tests/jobs/memsnap_standin.py`` cites the sources): :func:`parse` turns the loaded object
into :class:`DeviceHistory` records, checking every field it uses; an entry of the wrong shape is skipped and
counted, never a traceback.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from dataclasses import dataclass, field
from typing import Any

from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = ["MAX_SNAPSHOT_BYTES", "SUFFIX", "DeviceHistory", "SnapshotError", "load", "parse", "read"]

SUFFIX = ".memory.pickle"
MAX_SNAPSHOT_BYTES = 2 << 30  # a bigger file is refused before it is read (its load needs about 8x in memory)

# Allocator actions and what they change: allocated (alloc / free_completed) or reserved (segment_*).
ALLOC, FREE, SEG_ALLOC, SEG_FREE, OOM, OTHER = range(6)
_ACTIONS = {"alloc": ALLOC, "free_completed": FREE, "segment_alloc": SEG_ALLOC, "segment_map": SEG_ALLOC,
            "segment_free": SEG_FREE, "segment_unmap": SEG_FREE, "oom": OOM, "free_requested": OTHER,
            "snapshot": OTHER}
_LIVE_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free"})


class SnapshotError(ValueError):
    """A snapshot file that cannot be read: the message is one line naming the file."""

    def problem(self) -> Problem:
        return Problem.at(getattr(self, "path", ""), str(self), text=str(self))


class _Refusing(pickle.Unpickler):
    """The C unpickler, refusing every global (no class is ever imported or called) and persistent ids."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refers to {str(module)[:60]}.{str(name)[:60]}, which a memory snapshot "
                                     f"never does; not loaded")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("holds a persistent id, which a memory snapshot never does; not loaded")


def _error(path: str, reason: str) -> SnapshotError:
    e = SnapshotError(f"{path}: {reason}")
    e.path = path  # type: ignore[attr-defined]
    return e


def load(path: str, max_bytes: int = MAX_SNAPSHOT_BYTES) -> Any:
    """The object pickled in ``path``, loaded without importing or calling anything; :class:`SnapshotError` when it
    cannot be (too large, not a pickle, a global or persistent id in it, truncated)."""
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise _error(path, f"{size} bytes, over the {max_bytes}-byte limit for a memory snapshot; not read")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise _error(path, f"cannot be read ({e.strerror or e})") from None
    return loads(data, path)


def loads(data: bytes, path: str = "<bytes>") -> Any:
    """:func:`load` of bytes already read."""
    try:
        return _Refusing(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise _error(path, f"not a memory snapshot ({str(e)[:200]})") from None
    except MemoryError:
        raise _error(path, "does not fit in memory") from None
    except RecursionError:
        raise _error(path, "nested too deeply for a memory snapshot") from None
    except Exception as e:  # EOFError (truncated), ValueError/TypeError/IndexError/KeyError (malformed opcodes) ...
        raise _error(path, f"not a memory snapshot ({type(e).__name__}: {str(e)[:200]})") from None


@dataclass(slots=True)
class Entry:
    """One allocator trace entry, as the answers use it."""
    action: int
    addr: int
    size: int
    time_us: float
    frames: Any  # the entry's frames list (shared between entries with one stack); [] when none
    device_free: int | None = None


@dataclass(slots=True)
class Block:
    """A block live when the snapshot was taken."""
    addr: int
    size: int
    frames: Any


@dataclass
class DeviceHistory:
    """One device's part of a snapshot: its trace entries in time order, its live blocks and segments' sizes at the
    end, its annotations ``(time_us, stage, name)`` in time order, and how many entries were of the wrong shape."""
    device: int
    entries: list[Entry] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    reserved_end: int = 0
    annotations: list[tuple[float, str, str]] = field(default_factory=list)
    skipped: int = 0

    @property
    def allocated_end(self) -> int:
        return sum(b.size for b in self.blocks)


def _int(v: Any) -> int | None:
    """An int field, None when it is not one or lies past 64 bits (no allocator writes such; numpy could not
    hold it)."""
    return v if type(v) is int and -(2**63) <= v < 2**63 else None


def _entry(e: Any) -> Entry | None:
    if not isinstance(e, dict):
        return None
    name = e.get("action")
    action = _ACTIONS.get(name) if isinstance(name, str) else None
    size = _int(e.get("size"))
    if action is None or size is None or size < 0:
        return None
    t = e.get("time_us", 0)
    if type(t) not in (int, float) or not -1e18 < t < 1e18:  # NaN, inf and past 64 bits: the wrong shape
        return None
    frames = e.get("frames")
    frames = frames if isinstance(frames, list) else []
    if action == OOM:
        return Entry(OOM, 0, size, float(t), frames, _int(e.get("device_free")))
    addr = _int(e.get("addr"))
    return None if addr is None else Entry(action, addr, size, float(t), frames)


def parse(obj: Any, path: str = "<snapshot>") -> list[DeviceHistory]:
    """The devices of a loaded snapshot (those with a trace or a segment), checked field by field. The
    ``device_traces`` lists are consumed (emptied) as their entries are converted."""
    if not isinstance(obj, dict) or not isinstance(obj.get("segments", []), list) or \
            not isinstance(obj.get("device_traces", []), list) or \
            ("segments" not in obj and "device_traces" not in obj):
        raise _error(path, "not a memory snapshot (no segments / device_traces lists)")
    devices: dict[int, DeviceHistory] = {}

    def dev(d: int) -> DeviceHistory:
        return devices.setdefault(d, DeviceHistory(d))

    _traces(obj.get("device_traces", []), dev)
    for seg in obj.get("segments", []):
        if isinstance(seg, dict):
            d = _int(seg.get("device"))
            _segment(seg, dev(d if d is not None and d >= 0 else 0))
    notes = obj.get("external_annotations")
    for a in notes if isinstance(notes, list) else []:
        if not isinstance(a, dict):
            continue
        t, stage, name, d = a.get("time_us"), a.get("stage"), a.get("name"), _int(a.get("device"))
        if isinstance(t, (int, float)) and type(t) is not bool and t == t and stage in ("START", "END") \
                and isinstance(name, str):
            for h in (list(devices.values()) if d is None else [dev(d)]):
                h.annotations.append((float(t), stage, name[:200]))
    for h in devices.values():
        h.annotations.sort(key=lambda a: a[0])
    return [devices[d] for d in sorted(devices)]


def _traces(traces: list, dev: Any) -> None:
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            dev(d).skipped += 1
            continue
        if not trace:
            continue
        h = dev(d)
        trace.reverse()
        while trace:  # consumed as it is converted: each entry's dict is freed once its Entry exists (peak memory)
            x = _entry(trace.pop())
            if x is None:
                h.skipped += 1
            else:
                h.entries.append(x)
        h.entries.sort(key=lambda x: x.time_us)  # (stable: torch writes them in order already)


def _segment(seg: dict, h: DeviceHistory) -> None:
    total = _int(seg.get("total_size"))
    if total is not None and total >= 0:
        h.reserved_end += total
    blocks = seg.get("blocks")
    for b in blocks if isinstance(blocks, list) else []:
        if not isinstance(b, dict) or b.get("state") not in _LIVE_STATES:
            continue
        size, addr = _int(b.get("size")), _int(b.get("address"))
        if size is None or size < 0:
            h.skipped += 1
            continue
        frames = b.get("frames")
        h.blocks.append(Block(addr if addr is not None else -1, size, frames if isinstance(frames, list) else []))


def read(path: str, max_bytes: int = MAX_SNAPSHOT_BYTES) -> list[DeviceHistory]:
    """:func:`load` and :func:`parse` of one file."""
    return parse(load(path, max_bytes), path)
