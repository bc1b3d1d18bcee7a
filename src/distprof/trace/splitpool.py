"""The worker processes that decode the runs of one big file (``TraceTable.read(..., pool=...)``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["SplitPool"]


class SplitPool:
    """Worker processes for the runs of one file (:meth:`~.table.TraceTable.read`), started on the first run
    submitted (a small file, read whole at once, never starts them)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.backlog = 2 * workers  # runs in flight: enough to keep every worker busy, few to hold
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, fn: Callable, *args: Any):
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        return self._pool.submit(fn, *args)

    def __enter__(self) -> SplitPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
