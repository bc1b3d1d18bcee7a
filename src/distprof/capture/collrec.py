"""distprof's own record of each process's collectives (``hang: {enabled: true}``), kept without torch.profiler.

:func:`install` wraps the collectives of ``torch.distributed`` (``dist.all_reduce``, ``dist.barrier``, ...; the
names in :data:`COLLECTIVES`) once per process. Each call through a wrapper notes, for its process group, a
sequence number (this process's count of collectives on that group, from 1), the collective's name and the wall
time it was entered; when the call returns, the time it completed. Every rank issues a group's collectives in
the same order (torch requires it), so the numbers match across ranks: the first number some rank entered and
another never did is where the job stands. No collective is added, nothing is sent, and the cost per call is two
clock reads and a few list updates (docs/hang.md gives the measured figure).

Limits, said in the docs: calls that bypass ``torch.distributed.<name>`` (DDP's and FSDP's own bucket
all-reduces from C++, ``from torch.distributed import all_reduce`` done before :func:`install`, point-to-point
send/recv, whose numbers do not match across ranks) are not seen; torch's Flight Recorder sees those
(capture/hang.py dumps it). An ``async_op=True`` call counts as completed when it returns (issued); the Flight
Recorder's ``retired`` says whether its work finished.
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["COLLECTIVES", "GroupRecord", "install", "installed", "position", "snapshot", "uninstall"]

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "gather", "gather_object", "scatter",
               "scatter_object_list")

_lock = threading.Lock()
_groups: dict[Any, GroupRecord] = {}  # process group (None: the default one) -> its record
_history = 32
_installed = False
_now = time.time


class GroupRecord:
    """One process group's collectives as this process saw them: the last entered and completed, and the
    ``history`` most recent (seq, name, entered, completed or None)."""

    __slots__ = ("completed", "completed_t", "entered", "entered_name", "entered_t", "last", "name", "recent")

    def __init__(self, name: str, history: int) -> None:
        self.name = name
        self.entered = self.completed = 0
        self.entered_name = ""
        self.entered_t = self.completed_t = 0.0
        self.recent: collections.deque[list[Any]] = collections.deque(maxlen=history)
        self.last: list[Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.name, "entered": self.entered, "entered_name": self.entered_name,
                "entered_t": round(self.entered_t, 6), "completed": self.completed,
                "completed_t": round(self.completed_t, 6),
                "recent": [{"seq": s, "name": n, "entered_t": round(t0, 6),
                            "completed_t": None if t1 is None else round(t1, 6)} for s, n, t0, t1 in list(self.recent)]}


def _group_name(group: Any) -> str:
    """The group's name as torch and its Flight Recorder call it (``"0"`` for the default group)."""
    try:
        import torch.distributed as dist  # function-local: this module is imported without torch (hang off)

        pg = dist.group.WORLD if group is None else group
        name = getattr(pg, "group_name", None)
        return str(name) if name else "default"
    except Exception:  # a group torch no longer knows (destroyed): still record, under a stable name
        return f"group@{id(group):x}"


def _record(group: Any) -> GroupRecord:
    rec = _groups.get(group)
    if rec is None:
        with _lock:
            rec = _groups.get(group)
            if rec is None:
                rec = _groups[group] = GroupRecord(_group_name(group), _history)
    return rec


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    params = list(inspect.signature(fn).parameters)
    at = params.index("group") if "group" in params else -1

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group", args[at] if 0 <= at < len(args) else None)
        try:
            rec = _record(group)
        except TypeError:  # an unhashable group argument: torch will say what is wrong with it
            return fn(*args, **kwargs)
        seq = rec.entered + 1
        t = _now()
        entry = [seq, name, t, None]
        rec.entered, rec.entered_name, rec.entered_t = seq, name, t
        rec.recent.append(entry)
        out = fn(*args, **kwargs)
        t = _now()
        entry[3] = t
        rec.completed, rec.completed_t = seq, t
        return out

    recorded.__distprof_recorded__ = fn  # type: ignore[attr-defined]
    return recorded


def install(history: int = 32) -> bool:
    """Wrap ``torch.distributed``'s collectives in this process (once; later calls only widen ``history``).
    False when torch.distributed is not available."""
    global _installed, _history
    _history = max(_history, history)
    if _installed:
        return True
    try:
        import torch.distributed as dist  # function-local: only a job with hang evidence on imports it here
    except Exception:
        return False
    if not dist.is_available():
        return False
    with _lock:
        if _installed:
            return True
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None and not hasattr(fn, "__distprof_recorded__"):
                setattr(dist, name, _wrap(name, fn))
        _installed = True
    return True


def uninstall() -> None:
    """Put torch.distributed's own functions back and forget the records (tests)."""
    global _installed
    import torch.distributed as dist  # function-local: as in install()

    with _lock:
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None and hasattr(fn, "__distprof_recorded__"):
                setattr(dist, name, fn.__distprof_recorded__)
        _groups.clear()
        _installed = False


def installed() -> bool:
    return _installed


def snapshot() -> list[dict[str, Any]]:
    """Every group's record, as plain data (read from the watchdog thread: a torn read costs one entry)."""
    with _lock:
        recs = list(_groups.values())
    return [r.as_dict() for r in recs]


def position() -> tuple[tuple[int, int], ...]:
    """Every group's (entered, completed) numbers: what the watchdog compares between ticks, without a copy of
    the history."""
    with _lock:
        recs = list(_groups.values())
    return tuple((r.entered, r.completed) for r in recs)
