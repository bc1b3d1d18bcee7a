"""A window's files to where they stay, then its manifest line: the one path every Profiler write takes.

Locally the files are published (``RunDir.publish``: never over another writer's) and the line appended at once, in
the caller's thread. To an fsspec URL a background thread uploads and retries (``upload.py``): a training step
never waits on the network.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from distprof.rundir.layout import RUN_JSON
from distprof.rundir.manifest import FileEntry, WindowRecord
from distprof.rundir.store import Published, RunDir, warn_conflict
from distprof.rundir.upload import StoreWrite, UploadJob, uploader

logger = logging.getLogger(__name__)

__all__ = ["publish", "write_json"]


def publish(run: RunDir, rel_dir: str, staged: list[tuple[str, str]], fields: dict[str, Any], who: str,
            done: Callable[[WindowRecord], None] | None = None, t0: float | None = None) -> WindowRecord | None:
    """Publish ``staged`` ((temporary, final name), in order) under ``rel_dir`` with one manifest line of
    ``fields`` (plus the files, written time, writer conflict). ``t0``: ``time.perf_counter()`` when the caller
    began closing the window; ``export_s`` is the time from it until the files are published (until the upload is
    handed over, for a URL). ``done`` gets the line once written. Returns it when written here (local)."""
    def record(published: list[Published]) -> WindowRecord:
        if t0 is not None and "export_s" not in fields:
            fields["export_s"] = round(time.perf_counter() - t0, 6)
        first = published[0] if published else None  # no file: a window the memory guard did not export
        return WindowRecord(**fields, written_time=time.time(), files=[FileEntry(p.path, p.bytes) for p in published],
                            file=first.path if first else None, bytes=first.bytes if first else None,
                            writer_conflict=any(p.conflict for p in published))

    if run.remote:
        if t0 is not None:
            fields["export_s"] = round(time.perf_counter() - t0, 6)
        uploader().submit(UploadJob(run, rel_dir, staged, record, who, done))
        return None
    published = []
    try:
        for tmp, name in staged:
            published.append(run.publish(tmp, rel_dir, name))
    except BaseException:
        for tmp, _ in staged:  # leave no half-made temporaries behind
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise
    line = record(published)
    run.append_manifest(rel_dir, line)
    warn_conflict(run, rel_dir, [n for _, n in staged], published, who)
    if published:
        logger.info("distprof: %s wrote %s (%d bytes)", who, run.url(published[0].path), published[0].bytes)
    if done is not None:
        done(line)
    return line


def write_json(run: RunDir, info: dict[str, Any], rel: str = RUN_JSON) -> bool | None:
    """``run.json`` (or ``role.json``) unless another process wrote it first: locally at once (True if we wrote
    it); to an fsspec URL on the upload thread, in order with the windows and retried like them
    (:class:`.upload.StoreWrite`), so the caller (``Profiler.start()``, on the training thread) never waits on the
    network, and None is returned."""
    if run.remote:
        uploader().submit(StoreWrite(run, rel, lambda: run.write_run_json(info, rel)))
        return None
    return run.write_run_json(info, rel)
