"""Hang evidence (``hang: {enabled: true, timeout_s: N}``): a watchdog per process that, when no step ends for
``timeout_s``, writes what this rank was doing into the run directory, for ``distprof hang RUN_DIR``.

Per process (every rank of every role, profiled or not), :class:`HangWatch`:

- records the collective history without torch.profiler (:mod:`.collrec`: per process group, the last entered
  and completed collective and sequence number) and makes sure torch's Flight Recorder is on
  (``TORCH_FR_BUFFER_SIZE``, for process groups created after the profiler; torch 2.13 records gloo's
  collectives as well as NCCL's);
- runs a daemon thread that looks at the profiler's step count every ``tick_s`` (a quarter of the timeout, at
  most 5 s). While steps end it keeps ``{role}/rank{R:05d}/hang.json`` current (``state: running``: step,
  phase, collective history; one small atomic write per tick with progress). After ``timeout_s`` without a step
  ending it writes ``state: stalled`` with the same plus every thread's Python stack and the Flight Recorder's
  entries, and, if a capture window is open, a manifest line for it (``complete: false``, ``stopped_by: hang``:
  torch.profiler can only be stopped on the thread that started it, which is the stuck one, so the window's own
  trace is written only if that thread comes back). When steps end again it writes ``state: resumed``: a slow
  rank is never left called hung;
- arms Python's faulthandler C watchdog (``dump_traceback_later``) a little past the timeout, re-armed at each
  tick with progress: when the training thread is stuck in C code holding the GIL, no Python thread runs, but the
  C watchdog still writes every thread's stack into ``hang-stacks.txt``.

It never adds a collective, never raises into training (a failure is logged once and ends the watch), and
costs nothing when off (no thread, no wrapper, no import of torch).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import stat
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from distprof.capture import annotate, collrec
from distprof.rundir.layout import HANG, HANG_STACKS, rank_dir
from distprof.rundir.manifest import HANG as STOPPED_BY_HANG
from distprof.rundir.manifest import WindowRecord
from distprof.rundir.safefile import make_folder, no_links, write_bytes
from distprof.util.runtime import host_name

logger = logging.getLogger(__name__)

__all__ = ["FORMAT", "HangWatch", "flight_recorder", "thread_stacks"]

FORMAT = 1  # hang.json's "hang" value: the evidence's format version
_FR_FIELDS = ("collective_seq_id", "profiling_name", "retired", "state", "time_created_ns", "is_p2p")
_live: HangWatch | None = None  # one watch per process (the first profiler with hang on owns it)


def thread_stacks(main_ident: int | None = None, limit: int = 64) -> list[dict[str, Any]]:
    """Every thread's Python stack, innermost frame last, the training thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    main_ident = main_ident or threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the watchdog itself
        frames = [{"file": f.filename, "line": f.lineno or 0, "func": f.name}
                  for f in traceback.extract_stack(frame, limit=limit)]
        out.append({"thread": names.get(ident, f"thread-{ident:x}"), "ident": ident, "main": ident == main_ident,
                    "frames": frames})
    out.sort(key=lambda s: not s["main"])
    return out


def flight_recorder(history: int) -> dict[str, Any]:
    """torch's Flight Recorder entries (the last ``history`` per process group), or why there are none. Never
    imports torch: a process that has not imported it has no process group."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return {"available": False, "reason": "this torch has no Flight Recorder dump (_dump_fr_trace_json)"}
    try:
        data = json.loads(dump(True, False))
    except Exception as x:  # an older torch, or a backend without the recorder
        return {"available": False, "reason": f"{type(x).__name__}: {x}"[:300]}
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in data.get("entries") or []:
        pg = e.get("process_group") or ["?", ""]
        groups.setdefault(str(pg[0]), []).append({k: e.get(k) for k in _FR_FIELDS} | {"desc": str(pg[-1])})
    return {"available": True, "version": data.get("version"),
            "groups": {g: es[-history:] for g, es in groups.items()}}


class HangWatch:
    """The watchdog of one process. ``progress`` returns the step count (None: its owner is gone)."""

    def __init__(self, root: str, role: str, rank: int, world_size: int, options: Any,
                 progress: Callable[[], int | None], owner: Any = None) -> None:
        self._root, self._rel = root, rank_dir(role, rank)
        self._who = {"role": role, "rank": rank, "world_size": world_size, "pid": os.getpid(), "host": host_name()}
        self.options = options
        self._progress = progress
        self._owner = weakref.ref(owner) if owner is not None else (lambda: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks: Any = None
        self._timing = False
        self.fired = False
        self.writes = 0
        self._where: tuple[Any, ...] = ()  # where the stalled evidence saw the training thread (_place)
        self._seen: int | None = None  # the step count the watchdog saw last, and since when
        self._since = time.time()

    def start(self) -> None:
        """Install the collective record, arm the watchdogs and start the thread (once per process)."""
        global _live
        if _live is not None or self._thread is not None:
            return
        _live = self
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # process groups created from now on record
        collrec.install(self.options.history)
        if not annotate._STATE.timing:  # the open outermost annotate range is the phase (capture/annotate.py)
            annotate.timing_on(self)
            self._timing = True
        try:
            os.makedirs(self._root, exist_ok=True)
            folder = make_folder(self._root, self._rel)  # never through a link inside the run directory
            if self.options.c_watchdog and no_links(self._root, f"{self._rel}/{HANG_STACKS}"):
                self._stacks = _open_stacks(os.path.join(folder, HANG_STACKS))
        except OSError as e:
            logger.warning("distprof: hang evidence for %s rank %s is off: cannot write %s (%s)",
                           self._who["role"], self._who["rank"], self._rel, e)
            self._end()
            return
        self._thread = threading.Thread(target=self._run, name="distprof-hang", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and the C watchdog (the profiler's stop, the process's end)."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        if t is not None:
            self._final()
        self._end()

    def _final(self) -> None:
        """The profiler stops: say so, unless this rank stalled and never went on (a job killed while hung: SIGTERM
        unwinds the stuck thread through here, and its evidence must stay)."""
        g = self._progress()
        if self.fired and g == self._seen:
            return
        try:
            self._write("stopped", g, self._since)
        except Exception as e:  # the job comes first
            logger.debug("distprof: hang evidence of %s not updated at stop (%s)", self._rel, e)

    def _end(self) -> None:
        global _live
        if self._stacks is not None:
            faulthandler.cancel_dump_traceback_later()
            self._stacks.close()
            self._stacks = None
        if self._timing:
            annotate.timing_off(self)
            self._timing = False
        if _live is self:
            _live = None

    # ---- the watchdog thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # the job comes first
            logger.warning("distprof: the hang watchdog of %s rank %s stopped", self._who["role"], self._who["rank"],
                           exc_info=True)

    def _watch(self) -> None:
        opts = self.options
        tick, timeout = opts.tick_s, opts.timeout_s
        last, since = self._progress(), time.time()
        self._seen, self._since = last, since
        self._arm()
        self._write("running", last, since)
        while not self._stop.wait(tick):
            if self._timing and len(annotate._STATE.timing) > 1:  # a telemetry came later: the phases are its own
                annotate.timing_off(self)
                self._timing = False
            if self._timing:
                annotate.trim_phases(1000)  # nobody takes the phases: keep their log short
            g = self._progress()
            if g is None:
                return
            now = time.time()
            if g != last:
                last, since = g, now
                self._seen, self._since = g, now
                self._arm()
                self._write("resumed" if self.fired else "running", g, since)
                self.fired = False
            elif not self.fired and now - since >= timeout:
                self.fired = True
                if self._stacks is not None:
                    faulthandler.cancel_dump_traceback_later()  # this thread runs: it writes the stacks itself
                self._window_line(g, now - since)  # first: once hang.json says stalled, the evidence is whole
                self._where = self._place()
                self._write("stalled", g, since, full=True)
                logger.warning("distprof: %s rank %s: no step ended for %.0f s (step %s); hang evidence written to %s",
                               self._who["role"], self._who["rank"], now - since, g, self._rel)
            elif self.fired and (where := self._place()) != self._where:
                # Stalled, and still moving inside the step: a slow step (a window starting, a long phase) reached
                # its collective after the evidence was written. The evidence says where the rank is now.
                self._where = where
                self._write("stalled", g, since, full=True)

    @staticmethod
    def _place() -> tuple[Any, ...]:
        """Where the training thread stands inside a step: its collective numbers and its outermost phase."""
        top = annotate._STATE.top
        return collrec.position(), None if top is None else top.name

    def _arm(self) -> None:
        if self._stacks is not None:
            faulthandler.dump_traceback_later(self.options.timeout_s + 2 * self.options.tick_s, repeat=False,
                                              file=self._stacks, exit=False)

    def _write(self, state: str, step: int | None, since: float, full: bool = False) -> None:
        now = time.time()
        st = annotate._STATE
        top = st.top if st.timing else None
        phase_t = None if top is None else round(now - (time.perf_counter_ns() - st.t0) / 1e9, 6)
        groups = collrec.snapshot()
        ev: dict[str, Any] = {"hang": FORMAT, **self._who, "state": state, "written_t": round(now, 6),
                              "step": step, "last_progress_t": round(since, 6), "stalled_s": round(now - since, 3),
                              "timeout_s": self.options.timeout_s, "phase": None if top is None else top.name,
                              "phase_t": phase_t, "in_collective": any(g["entered"] > g["completed"] for g in groups),
                              "main_ident": st.thread or threading.main_thread().ident, "groups": groups}
        if full:
            ev["stacks"] = thread_stacks(st.thread or None)
            if self.options.flight_recorder:
                ev["flight_recorder"] = flight_recorder(self.options.history)
        write_bytes(self._root, f"{self._rel}/{HANG}", json.dumps(ev, default=str).encode())
        self.writes += 1

    def _window_line(self, step: int | None, stalled: float) -> None:
        """A capture window open on this rank: its manifest line as it stands (no trace: see the module's doc)."""
        p = self._owner()
        w = getattr(p, "_open", None)
        run = getattr(p, "_run", None)
        if p is None or w is None or run is None:
            return
        g = step if step is not None else w.start
        reason = ("torch.profiler stops only on the thread that started it, and that thread is stuck; the trace "
                  "is written if it comes back")
        try:
            run.append_manifest(p._dir, WindowRecord(
                role=p.role, rank=p.rank, world_size=p.world_size, steps=[w.start, max(w.start, g)], complete=False,
                stopped_by=STOPPED_BY_HANG, start_time=getattr(p, "_window_t0", None) or None,
                written_time=time.time(), host=host_name(), pid=os.getpid(), backend=p.config.backend,
                guard={"limit": "hang.timeout_s", "limit_value": self.options.timeout_s,
                       "measured": round(stalled, 3), "exported": False, "reason": reason}))
        except Exception as e:
            logger.warning("distprof: could not list the open window of %s in its manifest (%s)", self._rel, e)


def _forked() -> None:
    """A forked child (a DataLoader worker) runs no watch of its own: the parent's thread is not in it."""
    global _live
    _live = None


os.register_at_fork(after_in_child=_forked)


def _open_stacks(path: str) -> Any:
    """``hang-stacks.txt`` for faulthandler to write into; None (no C watchdog, after one warning) when a FIFO or
    a device sits there: opening a FIFO to write would block the training process until someone reads it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:  # ENXIO: a FIFO nobody reads
        logger.warning("distprof: %s cannot be written (%s); the C watchdog is off", path, e.strerror or e)
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        logger.warning("distprof: %s is not a regular file; the C watchdog is off", path)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "w")


def watch_for(prof: Any) -> HangWatch | None:
    """The watch of a profiler whose config turns hang evidence on (None when off: nothing else runs)."""
    config = prof.config
    if not config.hang.enabled or not config.save_path:
        return None
    ref = weakref.ref(prof)

    def progress() -> int | None:
        p = ref()
        return None if p is None else p.global_step

    return HangWatch(str(config.save_path), prof.role, prof.rank, prof.world_size, config.hang, progress, prof)


def start(watch: HangWatch | None) -> None:
    if watch is not None:
        watch.start()


def stop(watch: HangWatch | None) -> None:
    if watch is not None:
        watch.stop()
