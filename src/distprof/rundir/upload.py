"""Background uploads to an fsspec ``save_path``: a slow or failing object store never stalls a training step.

A closed window's files are staged on local disk (``RunDir.local_dir``); the profiler hands them to this
process's :class:`Uploader` (one daemon thread, a bounded queue) and returns to training at once. The thread
puts each file, then appends the window's manifest line, retrying with exponential backoff for at most
:data:`RETRY_BUDGET_S` per window. A window whose upload finally fails is never deleted: its files move to
:meth:`RunDir.unsent_dir` on this host with its manifest line (``local_path``, ``upload_error``) in a
``manifest.jsonl`` beside them; the line also goes to the object store's manifest if it answers. At ``stop()``
the profiler waits at most :data:`DRAIN_TIMEOUT_S` for the queue to drain; then every window not uploaded yet is
kept locally the same way, on the training thread, the one in flight included: a put that hangs on a store that
accepts and never answers cannot hold it (the thread's late result is ignored; the file may reach the store as well).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from distprof.rundir.layout import MANIFEST
from distprof.rundir.manifest import WindowRecord
from distprof.rundir.netfs import describe
from distprof.rundir.store import Published, RunDir, warn_conflict

logger = logging.getLogger(__name__)

__all__ = ["DRAIN_TIMEOUT_S", "QUEUE_WINDOWS", "RETRY_BUDGET_S", "StoreWrite", "UploadJob", "Uploader", "uploader"]

RETRY_BUDGET_S = 60.0  # per window: how long an object store may stay unreachable before the files are kept locally
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0
# At stop(): wait this long for pending uploads, then keep them locally (fits a SIGTERM grace period).
DRAIN_TIMEOUT_S = 15.0
KEEP_GRACE_S = 5.0  # then: wait this long for a window the upload thread is moving to the unsent folder (local disk)
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


class _Flight:
    """The window the upload thread is working on. Who settles it (the thread: uploaded or kept locally; or a
    ``drain()`` that gave up while it was in flight) is decided once, under the uploader's lock (``claimed``)."""

    __slots__ = ("claimed", "counted", "job", "published", "todo")

    def __init__(self, job: UploadJob | StoreWrite):
        self.job = job
        self.todo = list(job.files)  # still staged here
        self.published: list[Published] = []  # already on the object store
        self.claimed = False
        self.counted = False  # its pending count was given back


class Uploader:
    """One per process: a daemon thread emptying a bounded queue of windows to upload."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._q: queue.Queue[UploadJob | StoreWrite] = queue.Queue(maxsize=QUEUE_WINDOWS)
        self._cv = threading.Condition()
        self._pending = 0  # queued + in flight
        self._flight: _Flight | None = None
        self._abandon = False  # set while drain() gives up: a job taken off the queue then is kept locally at once
        self._wake = threading.Event()  # cuts a backoff short when drain() gives up
        self._thread = threading.Thread(target=self._loop, name="distprof-upload", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------------------------------------------
    def submit(self, job: UploadJob | StoreWrite) -> None:
        """Queue ``job``; never blocks. With the queue full the window is kept locally at once."""
        with self._cv:
            self._pending += 1
        try:
            self._q.put_nowait(job)
        except queue.Full:
            try:  # on the training thread: no network call, the line goes beside the files
                _keep_local(job, f"upload queue full ({QUEUE_WINDOWS} windows waiting for the object store)")
            finally:
                self._done()

    def pending(self) -> int:
        """Windows queued or being uploaded."""
        with self._cv:
            return self._pending

    def drain(self, timeout: float | None = None) -> bool:
        """Wait at most ``timeout`` s (default :data:`DRAIN_TIMEOUT_S`) for every queued window to be uploaded (or
        kept locally). True if none is left. On timeout, every window not uploaded yet, the one in flight included
        (its put may hang on a store that accepts and never answers), is kept locally now, on this thread: its
        staged files move to :meth:`RunDir.unsent_dir` with its manifest line beside them."""
        timeout = DRAIN_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._pending and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
            if not self._pending:
                return True
            self._abandon = True
            self._wake.set()
            flight = self._flight
            if flight is not None and not flight.claimed:
                flight.claimed = True  # the upload thread leaves it alone from now on, whatever its put does
            else:
                flight = None
        why = f"not uploaded within {timeout:g} s of stop()"
        try:
            while True:
                try:
                    job = self._q.get_nowait()
                except queue.Empty:
                    break
                try:
                    _keep_local(job, why)
                finally:
                    self._done()
            if flight is not None:
                try:
                    job = flight.job
                    if not isinstance(job, StoreWrite):  # run.json: nothing to keep; its write stops retrying
                        _keep_local(UploadJob(job.run, job.rel_dir, flight.todo, job.record, job.who, job.done),
                                    why + " (its upload was still in flight)", flight.published)
                finally:
                    self._count(flight)
            with self._cv:  # a window the thread took off the queue meanwhile: it keeps it locally (local disk only)
                end = time.monotonic() + KEEP_GRACE_S
                while self._pending and (left := end - time.monotonic()) > 0:
                    self._cv.wait(left)
                return not self._pending
        finally:
            with self._cv:
                self._abandon = False
                self._wake.clear()

    # ---- upload thread ---------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._q.get()
            with self._cv:
                flight = None if self._abandon else _Flight(job)
                self._flight = flight
            try:
                if isinstance(job, StoreWrite):
                    if flight is not None:  # not while drain() gives up: the store is slow now
                        self._write(job)
                elif flight is None:  # drain() gave up just as this window left the queue
                    _keep_local(job, "not uploaded: stop() gave up waiting for the object store")
                else:
                    self._upload(flight)
            except BaseException:  # never let the thread die: the next window must still go out
                logger.exception("distprof: %s: upload of a window failed unexpectedly", job.who)
            finally:
                with self._cv:
                    self._flight = None
                if flight is None:
                    self._done()
                else:
                    self._count(flight)

    def _done(self) -> None:
        with self._cv:
            self._pending -= 1
            self._cv.notify_all()

    def _count(self, flight: _Flight) -> None:
        """Give back ``flight``'s pending count, once (the thread and drain() may both get here)."""
        with self._cv:
            if flight.counted:
                return
            flight.counted = True
            self._pending -= 1
            self._cv.notify_all()

    def _claim(self, flight: _Flight) -> bool:
        """Settle ``flight`` from the upload thread; False if drain() already took it."""
        with self._cv:
            if flight.claimed:
                return False
            flight.claimed = True
            return True

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

    def _upload(self, flight: _Flight) -> None:
        job = flight.job
        if not isinstance(job, UploadJob):  # a StoreWrite is written by _write, never here
            raise TypeError(f"_upload takes a window's UploadJob, not {type(job).__name__}")
        deadline = time.monotonic() + RETRY_BUDGET_S
        backoff, attempt = FIRST_BACKOFF_S, 0
        while True:
            attempt += 1
            try:
                while flight.todo:
                    tmp, name = flight.todo[0]
                    put = job.run.publish(tmp, job.rel_dir, name, unlink=False)
                    with self._cv:
                        if flight.claimed:  # drain() kept the window locally meanwhile (this file too)
                            return
                        flight.published.append(put)
                        flight.todo.pop(0)
                    os.unlink(tmp)
                record = job.record(flight.published)
                job.run.append_manifest(job.rel_dir, record)
                if not self._claim(flight):  # its line is in the unsent folder too, written by drain()
                    logger.info("distprof: %s uploaded window %s-%s after stop() had kept it locally",
                                job.who, record.steps[0], record.steps[1])
                    return
                where = job.run.url(flight.published[0].path if flight.published else job.rel_dir)
                if attempt > 1:
                    logger.warning("distprof: %s uploaded %s after %d attempts", job.who, where, attempt)
                else:
                    logger.info("distprof: %s uploaded %s", job.who, where)
                self._count(flight)  # uploaded: a drain() waiting for it may return now
                warn_conflict(job.run, job.rel_dir, [n for _, n in job.files], flight.published, job.who)
                _call_done(job, record)
                return
            except Exception as e:  # network, auth, throttling: retry until the window's budget is spent
                error = describe(e)  # a timeout names DISTPROF_STORE_TIMEOUT_S
                with self._cv:
                    if flight.claimed:
                        return  # drain() took it (its put then failed, or its staged file moved away)
                    if time.monotonic() + backoff > deadline:
                        flight.claimed = True
                        break
                logger.debug("distprof: %s upload attempt %d failed (%s); retrying in %.1f s", job.who, attempt,
                             error, backoff)
                self._wake.wait(backoff)  # backoff between retries, on the upload thread only
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        # Files already put stay on the object store; the rest are kept here.
        _keep_local(UploadJob(job.run, job.rel_dir, flight.todo, job.record, job.who, job.done), error[:500],
                    flight.published, settled=lambda: self._count(flight), try_store=True)


def _keep_local(job: UploadJob | StoreWrite, error: str, published: Sequence[Published] = (),
                settled: Callable[[], None] | None = None, try_store: bool = False) -> None:
    """Keep a window's files that did not reach the object store in the run's unsent folder with its manifest line
    beside them, and say where; then (``try_store``) put the line in the object store's manifest too, if it
    answers. ``settled`` is called once the window is safe on this host, before that network call. A
    :class:`StoreWrite` has no files to keep: it is said once and dropped (``run.json`` is written by the next
    process that starts, or is missing; ``distprof check`` says so)."""
    if isinstance(job, StoreWrite):
        logger.warning("distprof: %s was not written (%s)", job.run.url(job.rel), error)
        if settled is not None:
            settled()
        return
    keep_dir = job.run.unsent_dir(job.rel_dir)
    kept = list(published)
    for tmp, name in job.files:
        try:
            kept.append(job.run.keep_local(tmp, job.rel_dir, name, keep_dir))
        except OSError:  # this host's disk failed too: keep what can be kept, say what could not
            logger.exception("distprof: %s could not keep %s in %s either; it is lost", job.who, name, keep_dir)
    record = job.record(kept)
    record.local_path = os.path.abspath(keep_dir)
    record.upload_error = error
    try:
        job.run.append_local_manifest(keep_dir, record)
        where = os.path.join(record.local_path, MANIFEST)
    except OSError:
        logger.exception("distprof: %s could not write the manifest line of window %s-%s in %s", job.who,
                         record.steps[0], record.steps[1], keep_dir)
        where = "no manifest: writing it failed"
    logger.error("distprof: %s could not upload window %s-%s (%s); its files are kept at %s (recorded in %s)",
                 job.who, record.steps[0], record.steps[1], error, record.local_path, where)
    _call_done(job, record)
    if settled is not None:
        settled()
    if try_store:
        try:
            job.run.append_manifest(job.rel_dir, record)
            logger.info("distprof: %s: the line of window %s-%s (kept at %s) is in the manifest on %s too",
                        job.who, record.steps[0], record.steps[1], record.local_path, job.run.url(job.rel_dir))
        except Exception:  # the object store is still down: the local line is the record
            pass


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
