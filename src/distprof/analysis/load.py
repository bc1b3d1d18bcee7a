"""Read and reduce many ranks in parallel: one compact result per file comes back, never the events."""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

from .reader import TraceError, TraceFile, find_traces, open_trace

logger = logging.getLogger(__name__)

__all__ = ["map_traces", "Progress"]


@dataclass
class Progress:
    """Where reading stands: files finished, and bytes read (compressed bytes for .gz files)."""
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


_counter = None  # in pool workers: the shared count of bytes read, set by _init_worker


def _init_worker(counter) -> None:
    global _counter
    _counter = counter


def _count(n: int) -> None:
    with _counter.get_lock():
        _counter.value += n


def _one(args: tuple[TraceFile, Callable[[Any], Any]], on_read: Callable[[int], None] | None = None) -> Any:
    f, reduce = args
    return reduce(open_trace(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window, on_read=on_read))


def _one_in_pool(job) -> Any:
    return _one(job, _count if _counter is not None else None)


def _one_or_error(job):
    try:
        return True, _one(job)
    except TraceError as e:
        return False, str(e)


def _size(path: str) -> int:
    try:
        if "://" in path and not path.startswith("file://"):
            import fsspec

            fs, p = fsspec.core.url_to_fs(path)
            return int(fs.size(p) or 0)
        return os.path.getsize(path.removeprefix("file://"))
    except (OSError, ValueError):
        return 0  # unreadable files are reported when read


def _map_ray(jobs: list, address: str, report: Callable[[int], None]) -> tuple[list[Any], list[str]]:
    """Per-file tasks on a Ray cluster (the files must be readable there: a shared path or an fsspec URL)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local cluster stays on loopback
    import ray

    started = not ray.is_initialized()
    if started:
        if address == "local":
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        task = ray.remote(num_cpus=1)(_one_or_error)
        pending = {task.remote(j): k for k, j in enumerate(jobs)}
        results, errors = [], []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(ready[0])
            ok, value = ray.get(ready[0])
            (results if ok else errors).append(value)
            report(k)
        return results, errors
    finally:
        if started:
            ray.shutdown()


def map_traces(path: str, reduce: Callable[[Any], Any], workers: int | None = None,
               progress: Callable[[Progress], None] | None = None, ray_address: str | None = None
               ) -> tuple[list[Any], list[str]]:
    """Apply ``reduce`` (a module-level function of a TraceStream) to every trace under ``path``.

    Returns (results, errors). Files are read in a process pool (``workers``, default: CPU count,
    1 = in this process), or as Ray tasks with ``ray_address`` ("local" starts a loopback cluster);
    only the compact per-file results come back. A file that cannot be read is one error message,
    not a failure of the rest. ``progress`` is called with a :class:`Progress` as files finish and,
    locally, as bytes are read (so one big file still shows movement).
    """
    files = find_traces(path)
    if not files:
        raise TraceError(f"{path}: no trace files (*.json, *.json.gz) found")
    workers = workers or min(len(files), os.cpu_count() or 1)
    sizes = [_size(f.path) for f in files]
    state = Progress(0, len(files), 0, sum(sizes))

    def file_done(k: int) -> None:  # Ray: bytes read on the cluster are not seen here, so count whole files
        state.files_done += 1
        state.bytes_done += sizes[k]
        if progress:
            progress(state)

    def bytes_read(n: int) -> None:  # a reduction may read a file twice (diff --step): never show over 100%
        state.bytes_done = min(state.bytes_done + n, state.bytes_total)
        if progress:
            progress(state)

    jobs = [(f, reduce) for f in files]
    if ray_address:
        return _map_ray(jobs, ray_address, file_done)
    results, errors = [], []
    if workers <= 1 or len(files) == 1:
        for job in jobs:
            try:
                results.append(_one(job, bytes_read))
            except TraceError as e:
                errors.append(str(e))
            state.files_done += 1
            if progress:
                progress(state)
        return results, errors
    counter = multiprocessing.get_context().Value("q", 0)
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(counter,)) as pool:
        pending = {pool.submit(_one_in_pool, job) for job in jobs}
        while pending:
            # Wake up now and then to show bytes read by the workers, not only finished files.
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    results.append(fut.result())
                except TraceError as e:
                    errors.append(str(e))
            state.files_done += len(done)
            state.bytes_done = min(counter.value, state.bytes_total)
            if progress:
                progress(state)
    return results, errors
