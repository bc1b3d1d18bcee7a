"""Always-on step telemetry (``telemetry: true``): every rank's step times, kept without torch.profiler.

Per rank and step, the step's wall time and the time spent in each outermost ``annotate`` range (a *phase*) that
ended during the step on the training thread. The training thread only reads a clock and appends one tuple per
step (and two clock reads and a dict update per outermost range: :mod:`.annotate`); a daemon thread writes the
buffered steps every ``telemetry_options.flush_s`` as JSON lines appended to the rank's stream::

    {save_path}/{role}/rank{R:05d}/telemetry.jsonl
    {"telemetry": 1, "role": "actor", "rank": 3, "world_size": 8, "pid": 4242, "host": "node7", "start": 1764240000.5}
    {"step": 120, "t": 1764240012.118, "dur_us": 20456, "phases": {"forward": 6120, "backward": 11873}}

``t`` is the wall-clock time the step ended, ``dur_us`` the time since the previous step ended (for the first
step of a process: since the profiler was built), ``phases`` the microseconds per outermost range. A header
line starts every segment and every process appending to it (a restarted rank). The stream rotates at half of
``telemetry_options.max_mb`` into ``telemetry.1.jsonl`` (replacing the older one), so one rank's stream stays
under ``max_mb`` and keeps its newest steps. A kill -9 loses at most the last ``flush_s`` of steps and maybe a
torn last line, which the reader skips (``distprof.analysis.telemetry``).

The job comes first: the buffer is bounded (``buffer_steps``; a stalled filesystem drops the oldest steps, not
the job's memory), and a write that fails is logged once and turns telemetry off for this process.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import weakref
from typing import Any

import msgspec

from distprof.capture import annotate
from distprof.rundir.layout import TELEMETRY, TELEMETRY_OLD, rank_dir
from distprof.rundir.safefile import no_links, replace
from distprof.util.runtime import host_name

logger = logging.getLogger(__name__)

__all__ = ["FORMAT", "Telemetry"]

FORMAT = 1  # the header's "telemetry" value: the stream's format version
_LIVE: weakref.WeakSet[Telemetry] = weakref.WeakSet()  # flushed at the process's end
_perf_ns = time.perf_counter_ns


class Telemetry:
    """One profiler's telemetry: the training thread calls :meth:`step_ended`; a daemon thread writes."""

    __slots__ = ("__weakref__", "_buf", "_dead", "_fd", "_header", "_last", "_lock", "_max_half", "_path",
                 "_rel", "_root", "_stop", "_thread", "_written", "dropped", "flush_s")

    def __init__(self, root: str, role: str, rank: int, world_size: int, options: Any) -> None:
        """``root``: the run directory (a local or mounted path); ``options``: ``TelemetryOptions``."""
        self._root, self._rel = root, rank_dir(role, rank)
        self._path = os.path.join(root, self._rel, TELEMETRY)
        self._header = {"telemetry": FORMAT, "role": role, "rank": rank, "world_size": world_size,
                        "pid": os.getpid(), "host": host_name()}
        self.flush_s = float(options.flush_s)
        self._max_half = max(int(options.max_mb * 1e6 / 2), 1)
        self._buf: collections.deque[tuple[int, int, int, list[Any]]] = collections.deque(
            maxlen=options.buffer_steps)
        self._last = _perf_ns()  # when the previous step ended
        self.dropped = 0
        self._fd: int | None = None
        self._written = 0
        self._dead = False
        self._lock = threading.Lock()  # one writer at a time: the thread, stop(), the process's end
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the training thread ----------------------------------------------------------------------------
    def step_ended(self, step: int) -> None:
        """Step ``step`` just ended: keep its wall time and phases (a clock read and an append). The phases go to
        the first live telemetry of the process (:mod:`.annotate`); another (a second role at a finer
        granularity in the same process) keeps step times only."""
        t = _perf_ns()
        timing = annotate._STATE.timing
        ph = annotate.take_phases() if timing and timing[0] is self else annotate._NONE
        self._buf.append((step, t, t - self._last, ph))
        self._last = t

    def start(self) -> None:
        """Start the writer thread and receive ``annotate``'s phase times (idempotent)."""
        if self._thread is not None or self._dead:
            return
        self._stop.clear()
        _LIVE.add(self)
        annotate.timing_on(self)
        t = threading.Thread(target=self._run, name="distprof-telemetry", daemon=True)
        self._thread = t
        t.start()

    def stop(self) -> None:
        """Write what is buffered and stop the writer (the profiler's stop, the process's end)."""
        annotate.timing_off(self)
        t, self._thread = self._thread, None
        self._stop.set()
        if t is not None and t is not threading.current_thread():
            t.join(timeout=max(5.0, self.flush_s * 2))
        self.flush()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        _LIVE.discard(self)

    # ---- the writer ---------------------------------------------------------------------------------------
    def release(self) -> None:
        """Its profiler was collected without stop(): the writer thread writes what is buffered, hands the phases
        back and ends (never blocks: a garbage collection may run this anywhere on the training thread)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            annotate.trim_phases(self._buf.maxlen or 100_000)
            self.flush()
        if self._thread is threading.current_thread():  # released, not stopped: stop here, off the training thread
            self.stop()

    def flush(self) -> None:
        """Append the buffered steps to the stream; a failure is logged once and turns telemetry off."""
        if self._dead:
            return
        with self._lock:
            try:
                self._flush()
            except Exception as e:  # the job comes first: no retry loop, no exception into training
                self._dead = True
                self._buf.clear()
                annotate.timing_off(self)
                logger.warning("distprof: telemetry for %s rank %s stopped: cannot write %s (%s)",
                               self._header["role"], self._header["rank"], self._path, e)

    def _flush(self) -> None:
        buf = self._buf
        if not buf:
            return
        wall, perf = time.time(), _perf_ns()
        parts = []
        while buf:
            step, t, dur, phases = buf.popleft()
            ph = annotate.phase_times(phases) if phases else {}
            parts.append(_LINE.encode(_Step(step, round(wall - (perf - t) / 1e9, 6), dur // 1000,
                                            {k: v // 1000 for k, v in ph.items()})))
        data = b"\n".join(parts) + b"\n"
        if self._fd is None or self._written >= self._max_half:
            self._open(rotate=self._fd is not None)
        os.write(self._fd, data)  # type: ignore[arg-type]
        self._written += len(data)

    def _open(self, rotate: bool) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        folder = os.path.dirname(self._path)
        if not no_links(self._root, self._rel):  # a link inside the run directory would lead the stream out of it
            raise OSError(f"{folder} (or a folder above it, inside the run directory) is a symbolic link")
        os.makedirs(folder, exist_ok=True)
        if rotate:
            replace(self._path, os.path.join(folder, TELEMETRY_OLD))  # the one rename, never through a link
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(self._path, flags, 0o644)
        self._written = os.fstat(self._fd).st_size
        header = dict(self._header, start=round(time.time(), 6))
        os.write(self._fd, msgspec.json.encode(header) + b"\n")


class _Step(msgspec.Struct, array_like=False):
    step: int
    t: float
    dur_us: int
    phases: dict[str, int]


_LINE = msgspec.json.Encoder()


def _flush_all() -> None:
    for t in list(_LIVE):
        t.stop()


def _forked() -> None:
    """In a forked child (the export child, a DataLoader worker): the parent's streams are not this process's."""
    for t in list(_LIVE):
        t._dead = True
        t._buf.clear()
        # the writer thread is not in the child: its lock may be held for good, and stop() has no thread to join
        t._lock = threading.Lock()
        t._thread = None
        if t._fd is not None:
            try:
                os.close(t._fd)  # the child's copy only
            except OSError:
                pass
            t._fd = None
    _LIVE.clear()  # annotate's own fork handler stops timing ranges for these (capture/annotate.py)


atexit.register(_flush_all)
os.register_at_fork(after_in_child=_forked)
