"""Reading a window's Ray task timeline (written by :mod:`distprof.integrations.ray.timeline`) as busy intervals
per (role, rank).

:func:`busy_intervals` turns one file into ``[{"role", "rank", "name", "start_us", "dur_us"}]``: every actor task
(method call) that ran on a worker of a profiled group, in **epoch µs**, the clock of ``steps``' ``start_us``
(:mod:`.steps` adds the trace's ``offset_us``, Kineto's ``baseTimeNanoseconds``, to its times; Ray's events are
Unix-time nanoseconds), cut to the window. ``name`` is the method (``Actor.update``). distprof's own RPCs
(``profile_step``, ``profile_export``, ... the file lists them) and the driver's own events (``submit_task``) are
not busy time. A worker is named by its Ray worker id, else by the actor id that every actor task's id ends with.

The file comes from another job: anything malformed is a :class:`TimelineError` (a ``ValueError``) naming it,
never a traceback; reading is bounded (:data:`LIMIT` bytes compressed and inflated).
"""

from __future__ import annotations

import gzip
import io
import math
from typing import Any

import msgspec

from distprof.rundir.layout import RAY_TIMELINE, is_ray_timeline

__all__ = ["LIMIT", "TimelineError", "busy_intervals", "is_ray_timeline", "load", "parse"]

LIMIT = 256 << 20  # bytes read at most, compressed or inflated
_ACTOR_ID_HEX = 32  # an ActorID is 16 bytes; an actor task's TaskID ends with it


class TimelineError(ValueError):
    """A Ray timeline file that cannot be used."""


def load(path: str) -> dict[str, Any]:
    """The file's JSON object, checked (:func:`parse`)."""
    try:
        with open(path, "rb") as f:
            data = f.read(LIMIT + 1)
    except OSError as e:
        raise TimelineError(f"{path}: cannot be read ({e.strerror or e})") from None
    return parse(data, path)


def parse(data: bytes, where: str = "Ray timeline") -> dict[str, Any]:
    """Decode a timeline file's bytes (gzipped or plain) into its object; :class:`TimelineError` if unusable."""
    if len(data) > LIMIT:
        raise TimelineError(f"{where}: larger than {LIMIT >> 20} MB; not read")
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as g:
                data = g.read(LIMIT + 1)
        except (OSError, EOFError) as e:
            raise TimelineError(f"{where}: not a whole gzip file ({e})") from None
        if len(data) > LIMIT:
            raise TimelineError(f"{where}: inflates past {LIMIT >> 20} MB; not read")
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:
        raise TimelineError(f"{where}: does not decode ({str(e)[:160]})") from None
    if not isinstance(doc, dict) or doc.get("kind") != RAY_TIMELINE or not isinstance(doc.get("traceEvents"), list):
        raise TimelineError(f"{where}: not a distprof Ray timeline (no kind {RAY_TIMELINE!r} with traceEvents)")
    if not isinstance(doc.get("workers", []), list):
        raise TimelineError(f"{where}: workers is not a list")
    return doc


def _num(x: Any) -> float | None:
    """A finite number, or None (NaN, infinities, an integer too big for a float, anything else)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def busy_intervals(source: str | bytes | dict[str, Any], clip: bool = True) -> list[dict[str, Any]]:
    """``[{"role", "rank", "name", "start_us", "dur_us"}]`` of one timeline (a path, its bytes or its object),
    sorted by role, rank and start; ``clip``: cut each interval to the file's window."""
    doc = source if isinstance(source, dict) else parse(source) if isinstance(source, bytes) else load(source)
    by_worker, by_actor = _workers(doc)
    own_methods = doc.get("own_methods")
    own = {m for m in own_methods if isinstance(m, str)} if isinstance(own_methods, list) else set()
    win = w if isinstance(w := doc.get("window"), dict) else {}
    lo, hi = _num(win.get("start_us")), _num(win.get("end_us"))
    out = []
    for e in doc["traceEvents"]:
        task = _task(e, own)
        if task is None:
            continue
        name, tid, task_id, ts, dur = task
        who = by_worker.get(tid.partition(":")[2])
        if who is None and isinstance(task_id, str) and len(task_id) > _ACTOR_ID_HEX:
            who = by_actor.get(task_id[-_ACTOR_ID_HEX:])
        if who is None:
            continue  # a task of no profiled group (collect's, the user's own)
        start, end = ts, ts + max(dur, 0.0)
        if clip and lo is not None and hi is not None:
            start, end = max(start, lo), min(end, hi)
            if end <= start:
                continue
        out.append({"role": who[0], "rank": who[1], "name": name, "start_us": start, "dur_us": end - start})
    out.sort(key=lambda r: (r["role"], r["rank"], r["start_us"]))
    return out


def _workers(doc: dict[str, Any]) -> tuple[dict[str, tuple[str, int]], dict[str, tuple[str, int]]]:
    """(role, rank) of each profiled worker, by its Ray worker id and by its actor id."""
    by_worker: dict[str, tuple[str, int]] = {}
    by_actor: dict[str, tuple[str, int]] = {}
    for w in doc.get("workers", []):
        if not isinstance(w, dict) or not isinstance(w.get("role"), str) or not isinstance(w.get("rank"), int):
            continue
        who = (w["role"], w["rank"])
        if isinstance(w.get("worker_id"), str):
            by_worker[w["worker_id"]] = who
        if isinstance(w.get("actor_id"), str):
            by_actor[w["actor_id"]] = who
    return by_worker, by_actor


def _task(e: Any, own: set[str]) -> tuple[str, str, Any, float, float] | None:
    """An actor task's event as (name, tid, task id, ts, dur), or None: not a task, malformed, or distprof's own."""
    if not isinstance(e, dict):
        return None
    cat, tid = e.get("cat"), e.get("tid")
    ts, dur = _num(e.get("ts")), _num(e.get("dur"))
    if not (isinstance(cat, str) and cat.startswith("task::") and isinstance(tid, str)) or ts is None or dur is None:
        return None
    args = a if isinstance(a := e.get("args"), dict) else {}
    method = args.get("name") if isinstance(args.get("name"), str) else cat.rsplit(".", 1)[-1]
    if method in own:
        return None
    return cat.removeprefix("task::"), tid, args.get("task_id"), ts, dur
