"""Read and reduce many ranks in parallel: one compact result per file comes back, never the events."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable

from .reader import TraceError, TraceFile, find_traces, open_trace

logger = logging.getLogger(__name__)


def _one_or_error(job):
    try:
        return True, _one(job)
    except TraceError as e:
        return False, str(e)


def _map_ray(jobs: list, address: str, progress: Callable[[int, int], None] | None) -> tuple[list[Any], list[str]]:
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
        pending = [task.remote(j) for j in jobs]
        results, errors, done = [], [], 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ok, value = ray.get(ready[0])
            (results if ok else errors).append(value)
            done += 1
            if progress:
                progress(done, len(jobs))
        return results, errors
    finally:
        if started:
            ray.shutdown()


def _one(args: tuple[TraceFile, Callable[[Any], Any]]) -> Any:
    f, reduce = args
    return reduce(open_trace(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window))


def map_traces(path: str, reduce: Callable[[Any], Any], workers: int | None = None,
               progress: Callable[[int, int], None] | None = None, ray_address: str | None = None
               ) -> tuple[list[Any], list[str]]:
    """Apply ``reduce`` (a module-level function of a TraceStream) to every trace under ``path``.

    Returns (results, errors). Files are read in a process pool (``workers``, default: CPU count,
    1 = in this process), or as Ray tasks with ``ray_address`` ("local" starts a loopback cluster);
    only the compact per-file results come back. A file that cannot be read is one error message,
    not a failure of the rest.
    """
    files = find_traces(path)
    if not files:
        raise TraceError(f"{path}: no trace files (*.json, *.json.gz) found")
    workers = workers or min(len(files), os.cpu_count() or 1)
    results, errors = [], []
    jobs = [(f, reduce) for f in files]
    if ray_address:
        return _map_ray(jobs, ray_address, progress)
    if workers <= 1 or len(files) == 1:
        for i, job in enumerate(jobs, 1):
            try:
                results.append(_one(job))
            except TraceError as e:
                errors.append(str(e))
            if progress:
                progress(i, len(jobs))
        return results, errors
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_one, job) for job in jobs]
        for i, fut in enumerate(as_completed(futures), 1):
            try:
                results.append(fut.result())
            except TraceError as e:
                errors.append(str(e))
            if progress:
                progress(i, len(jobs))
    return results, errors
