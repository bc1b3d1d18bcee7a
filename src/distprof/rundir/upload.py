"""Background uploads to an fsspec ``save_path``: a slow or failing object store never stalls a training step.

A closed window's files are staged on local disk (``RunDir.local_dir``); the profiler hands them to this
process's :class:`Uploader` (one daemon thread, a bounded queue) and returns to training at once. The thread
puts each file, then appends the window's manifest line, retrying with exponential backoff for at most
:data:`RETRY_BUDGET_S` per window. A window whose upload finally fails is never deleted: its files move to
:meth:`RunDir.unsent_dir` on this host, and its manifest line (``local_path``, ``upload_error``) goes to the
object store if it answers, else to a manifest in that local folder. At ``stop()`` the profiler waits at most
:data:`DRAIN_TIMEOUT_S` for the queue to drain; what is still queued then is kept locally the same way.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .manifest import WindowRecord
from .netfs import describe
from .store import Published, RunDir, warn_conflict

logger = logging.getLogger(__name__)

__all__ = ["UploadJob", "StoreWrite", "Uploader", "uploader", "RETRY_BUDGET_S", "DRAIN_TIMEOUT_S", "QUEUE_WINDOWS"]

RETRY_BUDGET_S = 60.0  # per window: how long an object store may stay unreachable before the files are kept locally
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0
DRAIN_TIMEOUT_S = 15.0  # at stop(): wait this long for pending uploads, then keep them locally (fits a SIGTERM grace period)
QUEUE_WINDOWS = 64  # windows waiting at most; one more is kept locally at once (a step never waits for room)


@dataclass
class UploadJob:
    run: RunDir
    rel_dir: str
    files: list[tuple[str, str]]
    """(staged temporary, final name), in publication order."""
    record: Callable[[list[Published]], WindowRecord]
    """The manifest line, from where the files ended up."""
    who: str
    done: Callable[[WindowRecord], None] | None = None
    """Called on the upload thread with the window's manifest line once it is written (uploaded or kept locally):
    a requested window is acknowledged only when its files are where they stay."""


@dataclass
class StoreWrite:
    """A small file (``run.json``, ``role.json``) written on the upload thread, in order with the windows and
    retried like them, so ``Profiler.start()`` never waits on the network. ``write`` does the store calls (each
    bounded: :mod:`.netfs`). It has no staged files: a give-up path (queue full, ``drain()`` timing out) finds
    nothing to keep locally; the write in flight then stops retrying and warns."""

    run: RunDir
    rel: str
    write: Callable[[], object]
    who: str = "distprof"
    rel_dir: str = ""
    files: tuple = ()


def _call_done(job: UploadJob, record: WindowRecord) -> None:
    if job.done is not None:
        try:
            job.done(record)
        except Exception:  # an acknowledgement is for people: its failure must not turn into an upload failure
            logger.warning("distprof: %s: reporting an uploaded window failed", job.who, exc_info=True)


class Uploader:
    """One per process: a daemon thread emptying a bounded queue of windows to upload."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._q: queue.Queue[UploadJob] = queue.Queue(maxsize=QUEUE_WINDOWS)
        self._cv = threading.Condition()
        self._pending = 0  # queued + in flight
        self._abandon = False  # set by drain() on timeout: the job in flight stops retrying
        self._wake = threading.Event()  # cuts a backoff short when drain() gives up
        self._thread = threading.Thread(target=self._loop, name="distprof-upload", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------------------------------------------
    def submit(self, job: UploadJob) -> None:
        """Queue ``job``; never blocks. With the queue full the window is kept locally at once."""
        with self._cv:
            self._pending += 1
        try:
            self._q.put_nowait(job)
        except queue.Full:
            self._done()
            # On the training thread: no network call, the line goes beside the files.
            _keep_local(job, f"upload queue full ({QUEUE_WINDOWS} windows waiting for the object store)",
                        try_store=False)

    def pending(self) -> int:
        """Windows queued or being uploaded."""
        with self._cv:
            return self._pending

    def drain(self, timeout: float | None = None) -> bool:
        """Wait at most ``timeout`` s (default :data:`DRAIN_TIMEOUT_S`) for every queued window to be uploaded (or
        kept locally). True if none is left. On timeout, queued windows are kept locally now and the one in flight
        stops retrying."""
        timeout = DRAIN_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._pending and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
            if not self._pending:
                return True
            self._abandon = True
            self._wake.set()
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            _keep_local(job, f"not uploaded within {timeout:g} s of stop()", try_store=False)  # the store is slow now
            self._done()
        with self._cv:  # the job in flight gives up at its next retry; its own attempt is bounded by fsspec
            while self._pending and (left := deadline + 2 * FIRST_BACKOFF_S + MAX_BACKOFF_S - time.monotonic()) > 0:
                self._cv.wait(left)
            self._abandon = False
            self._wake.clear()
            return not self._pending

    # ---- upload thread ---------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._q.get()
            try:
                if isinstance(job, StoreWrite):
                    self._write(job)
                else:
                    self._upload(job)
            except BaseException:  # never let the thread die: the next window must still go out
                logger.exception("distprof: %s: upload of a window failed unexpectedly", job.who)
            finally:
                self._done()

    def _done(self) -> None:
        with self._cv:
            self._pending -= 1
            self._cv.notify_all()

    def _write(self, job: StoreWrite) -> None:
        """One small file, retried with backoff for at most RETRY_BUDGET_S; on failure one warning per run."""
        deadline = time.monotonic() + RETRY_BUDGET_S
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                job.write()
                job.run.store_failed = None
                return
            except Exception as e:
                error = describe(e)
                if self._abandon or time.monotonic() + backoff > deadline:
                    break
                logger.debug("distprof: writing %s failed (%s); retrying in %.1f s", job.run.url(job.rel), error,
                             backoff)
                self._wake.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        if job.run.store_failed is not None:  # the store is still down: said once for this run already
            logger.info("distprof: could not write %s either (%s)", job.run.url(job.rel), error)
        else:
            logger.warning("distprof: could not write %s (%s); the run directory lacks it until a process writes "
                           "it (`distprof check` needs run.json); training and capture go on", job.run.url(job.rel),
                           error)
        job.run.store_failed = error

    def _upload(self, job: UploadJob) -> None:
        published: list[Published] = []
        todo = list(job.files)
        deadline = time.monotonic() + RETRY_BUDGET_S
        backoff, attempt = FIRST_BACKOFF_S, 0
        while True:
            attempt += 1
            try:
                while todo:
                    tmp, name = todo[0]
                    published.append(job.run.publish(tmp, job.rel_dir, name))
                    todo.pop(0)
                record = job.record(published)
                job.run.append_manifest(job.rel_dir, record)
                if attempt > 1:
                    logger.warning("distprof: %s uploaded %s after %d attempts", job.who,
                                   job.run.url(published[0].path), attempt)
                else:
                    logger.info("distprof: %s uploaded %s", job.who, job.run.url(published[0].path))
                warn_conflict(job.run, job.rel_dir, [n for _, n in job.files], published, job.who)
                _call_done(job, record)
                return
            except Exception as e:  # network, auth, throttling: retry until the window's budget is spent
                error = describe(e)  # a timeout names DISTPROF_STORE_TIMEOUT_S
                if self._abandon or time.monotonic() + backoff > deadline:
                    break
                logger.debug("distprof: %s upload attempt %d failed (%s); retrying in %.1f s", job.who, attempt,
                             error, backoff)
                self._wake.wait(backoff)  # backoff between retries, on the upload thread only
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        # Files already put stay on the object store; the rest are kept here.
        _keep_local(UploadJob(job.run, job.rel_dir, todo, job.record, job.who, job.done), error[:500], published)


def _keep_local(job: UploadJob, error: str, published: list[Published] = (), try_store: bool = True) -> None:
    """Keep a window's files that did not reach the object store in the run's unsent folder, and say where: its
    manifest line goes to the object store if ``try_store`` and it answers, else beside the files."""
    keep_dir = job.run.unsent_dir(job.rel_dir)
    kept = list(published)
    for tmp, name in job.files:
        try:
            kept.append(job.run.keep_local(tmp, job.rel_dir, name, keep_dir))
        except OSError:  # this host's disk failed too: keep what can be kept, say what could not
            logger.exception("distprof: %s could not keep %s in %s either; it is lost", job.who, name, keep_dir)
    if not kept:
        return
    record = job.record(kept)
    record.local_path = os.path.abspath(keep_dir)
    record.upload_error = error
    where = None
    if try_store:
        try:
            job.run.append_manifest(job.rel_dir, record)
            where = "the manifest on " + job.run.url(job.rel_dir)
        except Exception:  # the object store is still down: the line goes beside the files
            pass
    if where is None:
        job.run.append_local_manifest(keep_dir, record)
        where = "a local manifest there"
    logger.error("distprof: %s could not upload window %s-%s (%s); its files are kept at %s (recorded in %s)",
                 job.who, record.steps[0], record.steps[1], error, keep_dir, where)
    _call_done(job, record)


_lock = threading.Lock()
_uploader: Uploader | None = None


def uploader() -> Uploader:
    """This process's uploader (a forked child gets its own: threads do not survive fork)."""
    global _uploader
    with _lock:
        if _uploader is None or _uploader.pid != os.getpid():
            _uploader = Uploader()
        return _uploader


def active() -> Uploader | None:
    """This process's uploader if it has started (no thread is started just to ask)."""
    u = _uploader
    return u if u is not None and u.pid == os.getpid() else None
