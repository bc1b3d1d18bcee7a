"""A parallel map over trace files: one compact result per file comes back, never the events.

Files are read in a process pool (``workers``), in this process (``workers=1``), or as Ray tasks
(``ray_address``; "local" starts a loopback cluster). One file alone (the common case of a single rank
profiled with heavy flags) is read in this process with a :class:`SplitPool`: its events list is cut into
runs that the pool's workers decode and reduce while this process inflates and cuts the stream. Results come
back **in file order**, whatever finishes first, so every analysis sees the same input for any number of
workers. A file that cannot
be read is one error (path and message), not a failure of the rest; any other exception is a bug and
propagates.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, fields, is_dataclass
from itertools import islice
from typing import Any

from distprof.rundir.layout import is_url
from distprof.trace.listing import TraceFile
from distprof.trace.source import TraceError
from distprof.trace.splitpool import SplitPool
from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = ["Progress", "SplitPool", "map_files", "share_strings", "unreadable"]


@dataclass
class Progress:
    """Where reading stands: files finished, and bytes read (compressed bytes for .gz files)."""
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


def unreadable(path: str, message: str) -> Problem:
    """The :class:`~distprof.util.problem.Problem` of a file that could not be read: ``message`` is the whole line
    (a ``TraceError``'s, which starts with the path)."""
    return Problem.at(path, message.removeprefix(f"{path}: "), text=message)


_counter = None  # in pool workers: the shared count of bytes read, set by _init_worker
_seen: dict[str, str] = {}  # in pool workers: the strings of the results sent so far (share_strings)
_SEEN_MAX = 1 << 17



def _init_worker(counter) -> None:
    global _counter
    _counter = counter


def _count(n: int) -> None:
    counter = _counter
    if counter is None:  # not a pool worker (_in_pool passes _count only in one)
        return
    with counter.get_lock():
        counter.value += n


def _in_pool(fn: Callable, files: list[TraceFile]) -> list[tuple[bool, Any]]:
    """A few files read one after the other in a worker: per file (True, its result) or (False, the TraceError's
    line). One task for several files: the driver's own work per task (pickling it, waking up, unpickling the
    answer) is serial, and at a thousand ranks it adds up.

    The results' strings are shared here (:func:`share_strings`, with what this worker sent before), so a task's
    files name each kernel with one object, pickled once: the driver unpickles one copy per task, not per file, and
    does no walk of its own (that walk was a third of its serial work at a thousand ranks)."""
    out = []
    if len(_seen) > _SEEN_MAX:
        _seen.clear()
    for f in files:
        try:
            got = fn(f, _count if _counter is not None else None)
            out.append((True, share_strings(got, _seen)))
        except TraceError as e:
            out.append((False, str(e)))
    return out


def _tasks(n: int, workers: int) -> list[list[int]]:
    """The files' indices (0..n-1, in order) as the pool's tasks: up to _CHUNK_MAX files each, at least
    _CHUNKS_PER_WORKER tasks per worker where there are files enough."""
    size = max(1, min(_CHUNK_MAX, n // (workers * _CHUNKS_PER_WORKER)))
    return [list(range(k, min(k + size, n))) for k in range(0, n, size)]


def _or_error(fn: Callable, f: TraceFile) -> tuple[bool, Any]:
    try:
        return True, fn(f, None)
    except TraceError as e:
        return False, str(e)


_SCALARS = frozenset((int, float, bool, type(None)))


def share_strings(obj: Any, seen: dict[str, str]) -> Any:
    """``obj`` with every string equal to one seen before replaced by that one (dict keys, values, tuples, lists
    and dataclass fields, in place where it can). Results unpickled from workers hold their own copy of every
    kernel and op name; a thousand ranks name the same few hundred, so sharing them halves what the driver
    holds per rank. It runs on the driver for every rank's result (serial work), so numbers are passed over
    where they stand (no call per number) and a dataclass's field names are looked up once per type."""
    t = type(obj)
    if t is str:
        return seen.setdefault(obj, obj)
    if t in _SCALARS:
        return obj
    if t is dict:
        return {(seen.setdefault(k, k) if type(k) is str else k):
                (v if type(v) in _SCALARS else seen.setdefault(v, v) if type(v) is str else share_strings(v, seen))
                for k, v in obj.items()}
    if t is tuple:  # most are rows of numbers: left as they are (rebuilding them would cost more than the walk)
        if _SCALARS.issuperset(map(type, obj)):
            return obj
        return tuple([v if type(v) in _SCALARS else seen.setdefault(v, v) if type(v) is str else share_strings(v, seen)
                      for v in obj])
    if t is list:
        obj[:] = [v if type(v) in _SCALARS else seen.setdefault(v, v) if type(v) is str else share_strings(v, seen)
                  for v in obj]
        return obj
    names = _FIELDS.get(t, _UNKNOWN)
    if names is _UNKNOWN:
        names = _FIELDS[t] = tuple(f.name for f in fields(t)) if is_dataclass(t) else ()
    for name in names:
        setattr(obj, name, share_strings(getattr(obj, name), seen))
    return obj


_IN_FLIGHT = 4  # tasks submitted per worker ahead of the results (map_files)
_CHUNKS_PER_WORKER = 16  # map_files: files go to the workers in tasks of up to _CHUNK_MAX files, at least this many
_CHUNK_MAX = 8  # tasks per worker (the last tasks of a run balance the workers' loads)
_FIELDS: dict[type, Any] = {}  # a dataclass's field names, by type (other types: none)
_UNKNOWN = object()


def _size(path: str) -> int:
    try:
        if is_url(path):
            from distprof.rundir.netfs import url_to_fs

            fs, p = url_to_fs(path)
            return int(fs.size(p) or 0)
        return os.path.getsize(path.removeprefix("file://"))
    except (OSError, ValueError):
        return 0  # unreadable files are reported when read


def _map_ray(fn: Callable, files: Sequence[TraceFile], address: str, done: Callable[[int], None]) -> list:
    """Per-file tasks on a Ray cluster. A file listed on a node (``TraceFile.node``, by
    :func:`distprof.analysis.rayfiles.find_traces_on_nodes`) is read by a task pinned to that node, and a node lost
    before its files are read is one Problem per file naming it; other files (a shared path, an fsspec URL) are
    read anywhere, one CPU each.

    Pinned reads claim no CPU from Ray: the job's own actors may hold every CPU of the node that has the files
    (logically), and a read needing one would wait for the job to end. Instead the driver keeps at most as many
    reads in flight per node as the node has CPUs (at least one)."""
    import collections

    import ray

    from distprof.analysis.rayfiles import ray_session
    from distprof.util.raynodes import node_lost, node_name, node_table, pinned

    with ray_session(address):
        anywhere, here = ray.remote(num_cpus=1)(_or_error), ray.remote(num_cpus=0)(_or_error)
        table = node_table() if any(f.node for f in files) else {}
        queued: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        for k, f in enumerate(files):
            if f.node:
                queued[f.node].append(k)
        pending = {anywhere.remote(fn, f): k for k, f in enumerate(files) if not f.node}
        seen: dict[str, str] = {}

        def submit(node: str) -> None:
            k = queued[node].popleft()
            pending[here.options(scheduling_strategy=pinned(node)).remote(fn, files[k])] = k

        for node in list(queued):
            for _ in range(min(len(queued[node]), max(1, table.get(node, {}).get("cpus", 1)))):
                submit(node)
        out: list = [None] * len(files)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(ready[0])
            holder = files[k].node
            if holder and queued[holder]:
                submit(holder)
            try:
                ok, value = ray.get(ready[0])
            except Exception as e:
                if not (holder and node_lost(e)):
                    raise  # fn's own exception: a bug, as in a process pool
                ok, value = False, (f"{files[k].path}: {node_name(holder, table)}, which holds this file, "
                                    f"is gone ({type(e).__name__}); not read")
            out[k] = share_strings(value, seen) if ok else unreadable(files[k].path, value)
            done(k)
        return out


def map_files(fn: Callable[..., Any], files: Sequence[TraceFile],
              workers: int | None = None, progress: Callable[[Progress], None] | None = None,
              ray_address: str | None = None, split: bool = False) -> list[Any]:
    """``fn(file, on_read)`` for every file; a list in file order of its results or, for a file that
    cannot be read, a :class:`~distprof.util.problem.Problem` (:func:`unreadable`).

    ``fn`` must be picklable (a module-level function or a ``functools.partial`` of one); ``on_read(n)``
    is to be called as bytes are read. ``progress`` is called with a :class:`Progress` as files finish
    and, locally, as bytes are read (so one big file still shows movement). ``split``: ``fn`` takes a
    ``pool`` keyword (a :class:`SplitPool`), given when one file is read locally with more than one worker.
    """
    if split and len(files) == 1 and not ray_address and (workers or os.cpu_count() or 1) > 1:
        with SplitPool(workers or os.cpu_count() or 1) as pool:
            return map_files(functools.partial(fn, pool=pool), files, workers=1, progress=progress)
    workers = workers or min(len(files), os.cpu_count() or 1)
    sizes = [_size(f.path) for f in files]
    state = Progress(0, len(files), 0, sum(sizes))

    def file_done(k: int) -> None:  # Ray: bytes read on the cluster are not seen here, so count whole files
        state.files_done += 1
        state.bytes_done += sizes[k]
        if progress:
            progress(state)

    def bytes_read(n: int) -> None:  # never show over 100% (a reduction may read a file twice)
        state.bytes_done = min(state.bytes_done + n, state.bytes_total)
        if progress:
            progress(state)

    if not files:
        return []
    if ray_address:
        return _map_ray(fn, files, ray_address, file_done)
    out: list = [None] * len(files)
    if workers <= 1 or len(files) == 1:
        for k, f in enumerate(files):
            try:
                out[k] = fn(f, bytes_read)
            except TraceError as e:
                out[k] = unreadable(f.path, str(e))

            state.files_done += 1
            if progress:
                progress(state)
        return out
    counter = multiprocessing.get_context().Value("q", 0)
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(counter,)) as executor:
        # A few tasks (of a few files each) per worker in flight, the next submitted as one finishes: waiting on
        # every file at once made each wake-up cost one lock per file still pending (a million at 1,024 ranks,
        # seconds of the driver's serial time).
        queue = iter(_tasks(len(files), workers))
        pending: dict = {}

        def fill() -> None:
            for ks in islice(queue, max(0, _IN_FLIGHT * workers - len(pending))):
                pending[executor.submit(_in_pool, fn, [files[k] for k in ks])] = ks

        fill()
        while pending:
            # Wake up now and then to show bytes read by the workers, not only finished files.
            done, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for fut in done:
                ks = pending.pop(fut)
                for k, (ok, got) in zip(ks, fut.result(), strict=True):
                    out[k] = got if ok else unreadable(files[k].path, got)
                state.files_done += len(ks)
            state.bytes_done = min(counter.value, state.bytes_total)
            if progress:
                progress(state)
            fill()
    return out
