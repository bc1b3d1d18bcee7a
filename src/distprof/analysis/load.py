"""Read and reduce many ranks in parallel: one compact result per file comes back, never the events."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable

from .reader import TraceError, find_traces, read_trace

logger = logging.getLogger(__name__)


def _one(args: tuple[str, int | None, str | None, Callable[[Any], Any]]) -> Any:
    path, manifest_rank, role, reduce = args
    return reduce(read_trace(path, manifest_rank=manifest_rank, role=role))


def map_traces(path: str, reduce: Callable[[Any], Any], workers: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> tuple[list[Any], list[str]]:
    """Apply ``reduce`` (a module-level function of a RankTrace) to every trace under ``path``.

    Returns (results, errors). Files are read in a process pool (``workers``, default: CPU count,
    1 = in this process); a file that cannot be read is one error message, not a failure of the rest.
    """
    files = find_traces(path)
    if not files:
        raise TraceError(f"{path}: no trace files (*.json, *.json.gz) found")
    workers = workers or min(len(files), os.cpu_count() or 1)
    results, errors = [], []
    jobs = [(f, r, role, reduce) for f, r, role in files]
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
