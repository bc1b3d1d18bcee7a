"""Profiler: decides from config alone what this process captures, and drives one backend.

Lifecycle: ``start()`` (or ``with prof:``), then ``step()`` at the end of every
step, then ``stop()``. ``global_step`` is the step about to run; ``step()`` ends
it. Capture windows come from ``config.plan()`` and are evaluated on global
step numbers, so a resumed job captures the same steps as a fresh one.

The Profiler is the window state machine (plan, open, advance, close, publish). Its collaborators own the rest
and are called at step boundaries: :class:`~.steptime.StepClock` (which steps are timed), :class:`~.guard.MemoryWatch`
(the memory guard), :class:`~.ondemand.OnDemand` (trigger requests), :class:`~.stages.Stages` (discrete mode).

An inert profiler (disabled, or this rank / role not selected, or switched off by a fault) swaps its ``step`` for
a one-line counter: no files, no directories. Any fault inside a backend is logged once with its traceback and
turns this profiler off (``on_error="disable"``) or re-raises (``on_error="raise"``): :mod:`.faults`.
"""


from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

from distprof.capture import closing, hang, shutdown, watchproc
from distprof.capture.annotate import window_closed, window_opened
from distprof.capture.backends import WindowContext, create_backend
from distprof.capture.engines.capture import for_profiler
from distprof.capture.exporter import Exporter
from distprof.capture.faults import FaultGuard
from distprof.capture.guard import MemoryGuard, MemoryWatch
from distprof.capture.ondemand import OnDemand, PollTimer
from distprof.capture.runinfo import role_info, run_info
from distprof.capture.stages import Stages
from distprof.capture.steptime import BASELINE_STEPS, SETTLING_STEPS, StepClock
from distprof.capture.telemetry import Telemetry
from distprof.config.mesh import RankMesh
from distprof.config.model import ProfilerConfig
from distprof.config.plan import Plan, Window, role_selected
from distprof.rundir.layout import ROLE_JSON, rank_dir, sanitize_role
from distprof.rundir.publish import publish, write_json
from distprof.rundir.store import RunDir
from distprof.rundir.upload import active as upload_active
from distprof.util import logs
from distprof.util.envvars import apply_log_level
from distprof.util.runtime import detect_local_rank, detect_rank_world, host_name, torch_version

logger = logging.getLogger(__name__)

__all__ = ["BASELINE_STEPS", "SETTLING_STEPS", "Profiler"]


class Profiler:
    """One profiler per training process and granularity (role)."""

    # The two attributes an inert step() touches are slots: their access does not depend on how many attributes
    # this instance (or another Profiler in the process) put in its __dict__ (measured: an inert step() took 79 ns
    # alone and 141 ns beside an enabled profiler while both were dict entries).
    __slots__ = ("__dict__", "__weakref__", "_fast", "global_step")

    _plan: Plan  # these three are set once enabled (an inert profiler never reads them)
    _run: RunDir
    _dir: str

    def __init__(
        self,
        config: ProfilerConfig | dict | None = None,
        role: str = "main",
        global_step: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        mesh: Any = None,
        local_rank: int | None = None,
    ):
        """``mesh``: the job's DeviceMesh or ``{dim: size}`` (outermost first), for ``ranks: {pp: "*", tp: 0}``;
        ``local_rank``: this process's rank on its node, for ``per_node`` (default: LOCAL_RANK and friends)."""
        apply_log_level()  # DISTPROF_LOG_LEVEL: reaches workers whose logging the user cannot configure
        if config is None:
            config = ProfilerConfig()
        elif not isinstance(config, ProfilerConfig):
            config = ProfilerConfig.from_dict(config)
        if isinstance(global_step, bool) or not isinstance(global_step, int) or global_step < 0:
            raise ValueError(f"global_step must be an integer >= 0, got {global_step!r}; "
                             "pass the trainer's step counter")
        self.role = sanitize_role(role)
        config = config.for_role(self.role)  # per_role settings for this role, if any
        self.config = config
        self.global_step = global_step
        if rank is None or world_size is None:
            auto_rank, auto_world = detect_rank_world()
            rank = auto_rank if rank is None else rank
            world_size = auto_world if world_size is None else world_size
        if rank < 0 or world_size < 1 or rank >= world_size:
            raise ValueError(f"rank {rank} does not fit world_size {world_size}; pass 0 <= rank < world_size")
        self.rank, self.world_size = rank, world_size
        logs.process_is(self.role, rank)  # a stderr handler where nothing prints distprof's lines (distprof.util.logs)

        self.enabled = False  # True while this process may capture
        self._started = False  # between start() and stop()
        self._stopped = False
        self._next: Window | None = None  # the next window to open, as seen from global_step
        self._open: Window | None = None  # the window being captured
        self._backend: Any = None
        self._windows_closed = 0
        self._stopping = False  # in _stop: windows closing now are written inline
        self._held: tuple[Window, int, float, float] | None = None  # a closed window whose files are not written yet
        self._window_t0 = 0.0  # when the open window began (time.time())
        self._last_summary: dict[str, Any] | None = None
        self._annotations: dict[str, list[int]] = {}  # name -> [count, total ns] of the open / last window
        self._annotations_total: dict[str, list[int]] = {}
        self._mesh: RankMesh | None = None
        self._faults = FaultGuard(config.on_error, self._fault_text, self._fault, logger)  # capture/faults.py
        # Collaborators, each owning its state, called at step boundaries (None: this profiler does without):
        self._clock = StepClock()  # profiling's own cost: which steps are timed (capture/steptime.py)
        self._stages: Stages | None = None  # discrete mode: one window per stage run (capture/stages.py)
        self._memory: MemoryWatch | None = None  # the memory guard, at step ends of an open window (capture/guard.py)
        self._ondemand: OnDemand | None = None  # trigger: true, requests from save_path/.requests (capture/ondemand.py)
        self._engine: Any = None  # the rollout engine this role drives (capture/engines/capture.py), if any
        self._exporter = Exporter(self._who())  # a closed window's files, written beside training (capture/exporter.py)
        # Step telemetry (telemetry: true) on every rank of the role, capturing or not (capture/telemetry.py)
        self._telemetry: Telemetry | None = None
        if config.telemetry and config.save_path:
            self._telemetry = Telemetry(config.save_path, self.role, rank, world_size, config.telemetry_options)
            # a profiler dropped without stop(): its writer thread ends and its phases go to the next telemetry
            weakref.finalize(self, self._telemetry.release).atexit = False  # (atexit: capture/telemetry.py)
        self._watcher: Any = None  # the in-job watcher's process (detect: true; capture/watchproc.py)
        self._hang = hang.watch_for(self)  # hang evidence on every rank (hang.enabled; capture/hang.py), else None
        self._fast = 0  # step() is one increment: INERT or IDLE (never with telemetry); 0: the full step

        if not (config.enable or config.trigger) or not self._selected(mesh, local_rank):
            self._make_inert()
            return
        self._enable()

    def _selected(self, mesh: Any, local_rank: int | None) -> bool:
        """This rank and role capture (the config fits the world size, or a ValueError says why not)."""
        config, rank, world_size = self.config, self.rank, self.world_size
        config.check_world_size(world_size)
        if local_rank is None:
            local_rank = detect_local_rank(rank) if world_size > 1 else 0
        if mesh is not None and isinstance(config.ranks, dict):
            self._mesh = RankMesh.of(mesh)  # recorded in role.json, so `check` knows which ranks should capture
        return role_selected(config.roles, self.role) and config.selects_rank(rank, world_size, mesh, local_rank)

    def _enable(self) -> None:
        config, save_path = self.config, self.config.save_path
        if save_path is None:  # ProfilerConfig refuses enable / trigger without one
            raise ValueError("save_path is required when profiling is enabled; set save_path")
        self._backend = create_backend(config)
        self._run = RunDir(save_path)
        self._run.check_writable()
        self._dir = rank_dir(self.role, self.rank)
        self._plan = config.plan()
        if config.discrete:
            self._stages = Stages(self)
        elif not config.is_process_backend:  # windows that end at step boundaries
            self._memory = MemoryWatch.from_config(config)
        if config.trigger:
            self._ondemand = OnDemand(self, save_path)
        self.enabled = True
        if config.engine is not None:
            self._engine = for_profiler(self)

    # ---- public API -----------------------------------------------------------------------------------
    def start(self) -> Profiler:
        if self._telemetry is not None:
            self._telemetry.start()
            if self._watcher is None and watchproc.launches_here(self.config, self.rank):  # detect: true
                self._watcher = watchproc.start(str(self.config.save_path), self._who(), self.config)
        hang.start(self._hang)  # after telemetry: the phases stay telemetry's (capture/hang.py only reads the open one)
        if not self.enabled or self._started:
            return self
        self._started, self._stopped, self._stopping = True, False, False
        shutdown.register(self)  # the open window is written however the process leaves
        self._guard("start", self._start)
        return self

    def step(self, export: bool = True) -> None:
        """End the current global step. Call once at the end of every step at this profiler's granularity.

        When this step closes a capture window, torch stops tracing inside this call and the window's files are
        written beside training (``torch.background_export``; false: inside this call). With
        ``export=False`` the step still ends here (``ProfilerStep#N`` closes now) but writing is
        held until :meth:`export` (or the next ``step()`` / ``stop()``): a driver ending the step
        of several worker groups ends every group's step first, then lets them write, so no
        group's export lands inside another group's step.
        """
        if self._fast:  # inert, or idle between requests, without telemetry: the whole step is this increment
            self.global_step += 1
            return
        if self._telemetry is not None:
            self._telemetry.step_ended(self.global_step)
        if self._started:
            self._guard("step", self._step if export else self._step_held)
            return
        self.global_step += 1
        if self.enabled and not self._stopped:
            logger.warning("distprof: %s step() called before start(); starting now at step %d", self._who(),
                           self.global_step)
            self.start()

    def export(self) -> bool:
        """Write the window a ``step(export=False)`` closed; True if there was one (else a no-op). With
        ``torch.background_export`` the writing is handed to the background here, as a window's end does."""
        if self._held is None or not self._started:
            return False
        self._guard("export", self._export_held)
        return True

    def stop(self) -> None:
        """End profiling. A window still open keeps the steps that finished.

        A started profiler that is never stopped (an exception, ``sys.exit``, SIGTERM) is stopped on
        the way out of the process: see :mod:`distprof.capture.shutdown`.
        """
        self._finish(crashed=False)

    def wait_engine(self, timeout_s: float | None = None) -> bool:
        """Wait until the rollout engine's closed windows are flushed and published (``engine`` setting; each is
        bounded by ``engine.flush_timeout_s``). True when none is pending (or no engine is driven)."""
        return self._engine is None or self._engine.wait(timeout_s)

    def _finish(self, crashed: bool, cause: str = "stop") -> None:
        """Stop; ``crashed``: the step in progress was interrupted (keep it); ``cause`` goes in the manifest."""
        hang.stop(self._hang)
        if self._telemetry is not None:
            self._telemetry.stop()
            watchproc.stop(self._watcher)
            self._watcher = None
        if not self.enabled or not self._started:
            return
        self._started = False
        self._stopped = True
        self._use_full_step()  # leave the idle fast path: a stopped profiler polls nothing
        if self._ondemand is not None:
            self._ondemand.cancel()
        try:
            self._guard("stop", lambda: self._stop(crashed, cause))
        finally:  # only now: a signal during the last export waits for it (capture/shutdown.py), then stops the process
            shutdown.unregister(self)

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        # Leaving on an exception: the step about to end is the one that failed; keep it in the trace.
        self._finish(crashed=exc_type is not None, cause=shutdown.cause_of(exc_type))
        return False

    @property
    def capturing(self) -> bool:
        """True while a window (warm-up included) is open."""
        return self._open is not None

    def summary(self) -> dict[str, Any] | None:
        """Per-op self time and count of the last closed window, and device busy time (overlap counted once)."""
        self._exporter.wait(check=False)  # the last window's, once written
        return self._last_summary

    def annotation_times(self, total: bool = False) -> dict[str, dict[str, float]]:
        """Wall time per ``annotate`` name: of the open (or last) window, or over the whole run with ``total``."""
        src = self._annotations_total if total else self._annotations
        return {k: {"count": c, "total_s": ns / 1e9} for k, (c, ns) in src.items()}

    @property
    def windows_closed(self) -> int:
        """Windows whose files are published (a window being written in the background is waited for)."""
        self._exporter.wait(check=False)
        return self._windows_closed

    @property
    def save_dir(self) -> str | None:
        """Where this profiler's files go (None when inert)."""
        return self._run.url(self._dir) if self.enabled else None

    def __repr__(self) -> str:
        state = "capturing" if self.capturing else ("enabled" if self.enabled else "inert")
        return (f"Profiler(role={self.role!r}, rank={self.rank}, world_size={self.world_size}, "
                f"step={self.global_step}, {state})")

    def trigger_request(self, request: Any) -> dict[str, Any] | None:
        """Hand a request to this profiler in-process (the Ray groups do, without a shared filesystem).

        It is stored under this process's save_path (so ``distprof trigger --status`` and ``collect`` see it) and
        answered by the same rule as a polled one. Returns this process's acknowledgement (None: the request does
        not select this role / rank, or this profiler does not take requests)."""
        if self._ondemand is None or not self._started:
            return None
        return self._ondemand.hand(request)

    # ---- what tests and tools look at ---------------------------------------------------------------------
    @property
    def _mem_guard(self) -> MemoryGuard | None:
        """The memory guard sampling this profiler's windows (None: no limit set, or it tripped)."""
        return None if self._memory is None else self._memory.guard

    @property
    def _poll_timer(self) -> PollTimer | None:
        """The thread that flags a poll for requests every trigger_poll_s (None: not polling)."""
        return None if self._ondemand is None else self._ondemand.timer

    # ---- inert and idle steps -------------------------------------------------------------------------------
    def _make_inert(self) -> None:
        self.enabled = False
        with _STEP_SWAP:  # the poll timer's thread flips the flag too (_use_full_step)
            # step() is one increment (telemetry, if kept, still times the steps: the full step does that and
            # returns, as this profiler is neither enabled nor started).
            self._fast = INERT if self._telemetry is None else 0

    def _idle_if_nothing_planned(self) -> None:
        """Nothing planned or requested: step() is the inert one. Every trigger_poll_s the poll timer puts the
        full step() back (_use_full_step), which looks for requests at the next step boundary."""
        od = self._ondemand
        if (self._open is None and self._next is None and self._held is None and od is not None and od.pending is None
                and self._started and self.enabled and self.config.trigger_poll_s > 0 and self._telemetry is None):
            with _STEP_SWAP:
                self._fast = IDLE

    def _use_full_step(self, if_idle: bool = False) -> None:
        """Back to the full step(); ``if_idle``: only from the idle step (never undo an inert one)."""
        with _STEP_SWAP:
            if not if_idle or self._fast == IDLE:
                self._fast = 0

    def _forked(self) -> None:
        """In a forked child (capture/shutdown.py): the parent's windows are not this process's to write. Inert, without
        touching torch's profiler (the parent's) or the step lock (another parent thread may have held it)."""
        window_closed(self)
        self._started, self._stopped, self.enabled = False, True, False
        self._backend = self._open = self._next = self._held = None
        self._stages = self._ondemand = self._memory = None
        self._telemetry = self._watcher = self._hang = None  # the parent's (telemetry.py, hang.py: off in a child)
        self._fast = INERT

    # ---- state machine ----------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._clock.started(self.global_step)
        info = self._run_info()
        write_json(self._run, info)
        mesh = self._mesh
        write_json(self._run, role_info(self.role, info, self.config.backend, mesh), rel=f"{self.role}/{ROLE_JSON}")
        self._next = self._plan.next_window(self.global_step)
        self._plan_timing()
        if self._engine is not None:
            self._engine.at(self.global_step)
        if self._next is None and not self.config.trigger:
            logger.warning("distprof: %s starts at step %d, after every capture window (%s); nothing will be captured",
                           self._who(), self.global_step, self._plan.describe())
        if self._stages is not None:
            self._stages.arm()
            return
        self._maybe_open()
        od = self._ondemand
        if od is not None:
            od.poll()
            od.open_due()
            self._idle_if_nothing_planned()

    def _step(self, hold: bool = False) -> None:
        if self._engine is not None:
            self._engine.at(self.global_step + 1)
        if self._stages is not None:
            self._stages.step()
            return
        if self._held is not None:
            self._export_held()
        clock = self._clock
        if self.global_step >= clock.time_from:
            clock.ended(self.global_step, self._open)
        self.global_step += 1
        g = self.global_step
        self._exporter.check()  # a window written in the background failed: the fault path, here
        w = self._open
        if w is not None and self._window_step(w, g, hold):
            return  # held: the files are written by export(), and the next window opens then
        if self._next is not None and g >= self._next.warmup_start:
            self._maybe_open()
        od = self._ondemand
        if od is not None:
            if od.poll_due:
                od.poll()
            od.open_due()
            self._idle_if_nothing_planned()
        if g >= clock.time_from:  # stamped last: the profiler's own step-end work is not the next step's time
            clock.mark = (g, time.perf_counter())

    def _window_step(self, w: Window, g: int, hold: bool) -> bool:
        """Step ``g - 1`` of open window ``w`` ended: advance the backend, close the window after its last step (or
        when the memory guard says so). True when the closed window's writing is held for export()."""
        mem = self._memory
        if g <= w.end:
            self._backend.advance(g)
            crossed = None if mem is None else mem.step_ended(w, g)
            if crossed is not None:
                self._trip_guard(w, g - 1, crossed)
            return False
        t0, t1 = time.perf_counter(), time.time()  # closing starts: torch stops tracing, processes events
        # The guard always sees a window's last step, before its export (one step may have grown it a lot).
        crossed = None if mem is None else mem.last_step()
        self._backend.advance(g)
        if crossed is not None:
            self._trip_guard(w, w.end, crossed, t1=t1, t0=t0)  # exported (or refused) now, even with hold
        elif hold:
            # The step has ended (torch closed ProfilerStep#N and stopped tracing); the files are
            # written by export(). The next window opens then too, so its warm-up starts after.
            self._open = None
            window_closed(self)
            self._held = (w, w.end, t1, time.perf_counter() - t0)
            return True
        else:
            self._close(w, last=w.end, t1=t1, t0=t0)
        return False

    def _step_held(self) -> None:
        self._step(hold=True)

    def _export_held(self) -> None:
        self._write_held()
        if self._next is not None and self.global_step >= self._next.warmup_start:
            self._maybe_open()
        if self._ondemand is not None:
            self._ondemand.open_due()
            self._idle_if_nothing_planned()
        if self.global_step >= self._clock.time_from:
            self._clock.mark = (self.global_step, time.perf_counter())

    def _write_held(self) -> None:
        if self._held is not None:
            w, last, t1, spent = self._held
            self._held = None
            self._close(w, last=last, t1=t1, spent=spent)

    def _stop(self, crashed: bool, cause: str) -> None:
        if self._engine is not None:
            self._engine.close(cause)
        if self._stages is not None:
            self._stages.stop(cause)
            self._cleanup_run()
            return
        self._exporter.wait()  # the window being written in the background first: nothing is lost, lines in order
        self._stopping = True  # what closes from here is written in this call (closing.py): the process may end
        self._write_held()
        w = self._open
        if w is not None:
            # Steps before global_step finished; global_step itself ran (partly) only if we crashed in it.
            last = min(w.end, self.global_step if crashed else self.global_step - 1)
            self._close(w, last=last, stopped_by=cause)
        if self._ondemand is not None:
            self._ondemand.stop(cause)
        self._exporter.wait()  # a window just handed to the background (a held one) is written before stop() returns
        # Process-backend tools write their own files; a profiler that waits for requests may rightly capture none.
        if self._windows_closed == 0 and not self.config.is_process_backend and not self.config.trigger:
            logger.warning("distprof: %s stopped at step %d without capturing a window (plan: %s)",
                           self._who(), self.global_step, self._plan.describe())
        self._cleanup_run()

    def _maybe_open(self) -> None:
        w = self._next
        if w is None or self.global_step < w.warmup_start:
            return
        w = self._plan.next_window(self.global_step)  # clipped to now (a late start skips warm-up)
        self._next = None
        if w is None:
            return
        self._begin_window(w, self._backend)
        logger.info("distprof: %s opened window %d-%d (warm-up from %d)", self._who(), w.start, w.end, w.warmup_start)

    def _context(self, label: str | None = None) -> WindowContext:
        """What the backend is told of the window it opens (``label``: a discrete stage's)."""
        return WindowContext(role=self.role, rank=self.rank, world_size=self.world_size,
                             tmp_path=lambda name: self._run.temp_path(self._dir, name), label=label,
                             publish_now=self._publish_now)

    def _begin_window(self, w: Window, backend: Any) -> None:
        """Open ``w`` on ``backend`` (a planned window, or a requested one with its own backend)."""
        self._exporter.wait()  # the previous window's export first: windows never pile up in memory
        self._annotations = {}
        self._open = w
        self._window_t0 = time.time()
        self._clock.opened()
        backend.begin(w, self.global_step, self._context())
        window_opened(self)  # after begin(): the backend has imported what the ranges emit into
        if self._memory is not None:
            self._memory.opened(backend, closing.in_background(self, backend))  # after begin(): see opened()

    def _close(self, w: Window, last: int, t1: float | None = None, stopped_by: str | None = None,
               stage: str | None = None, t0: float | None = None, spent: float = 0.0) -> None:
        """Publish the window's files and its manifest line; ``t1``: when its last step ended (default now).

        ``stopped_by``: why the window closed before its end (``stop``, ``exception``, ``exit``, a signal's
        name); such a window is never ``complete``, even when the interrupted step was its last. ``export_s``
        in the line: from ``t0`` (default now; the step that ends a window starts closing it before this call)
        until its files are published, plus ``spent`` (closing work done in an earlier call: a held export); a
        window written in the background counts the closing step's part (:mod:`.closing`).
        """
        closing.close(self, w, last, t1=t1, stopped_by=stopped_by, stage=stage, t0=t0, spent=spent)

    def _plan_timing(self) -> None:
        """Time the steps before the next window (planned, and an accepted request's) and the windows' own."""
        self._clock.plan(self._next, self.global_step)
        od = self._ondemand
        if od is not None and od.pending is not None:  # a request accepted while a planned window was open
            self._clock.plan_request(od.pending[1], self.global_step)

    def _trip_guard(self, w: Window, last: int, crossed: dict[str, Any], **close: Any) -> None:
        """A memory limit (or the export budget) was crossed at the end of step ``last``: close the window now with
        what it recorded, warn once; after a memory limit, open no more windows in this run."""
        mem = self._memory
        if mem is None:  # only the memory guard trips a window
            raise RuntimeError("a memory limit tripped a profiler without a memory guard")
        stopped_by = mem.trip(self._who(), w, last, crossed)  # memory_guard or export_budget
        try:
            self._close(w, last=last, stopped_by=stopped_by, **close)
        finally:
            mem.numbers = None

    def _publish_now(self, tmp: str, name: str, steps: list[int], stopped_by: str) -> None:
        """A file a backend wrote on the spot (``cuda_memory``'s OOM snapshot: the process may not survive the
        error), published at once with its own manifest line, so ``check`` lists it."""
        publish(self._run, self._dir, [(tmp, name)], dict(
            role=self.role, rank=self.rank, world_size=self.world_size, steps=steps, complete=False,
            stopped_by=stopped_by, start_time=self._window_t0, end_time=time.time(), host=host_name(), pid=os.getpid(),
            torch=torch_version(), backend=getattr(self._backend, "name", self.config.backend)), self._who())

    def _cleanup_run(self) -> None:
        """Delete the local staging folder, once uploads waiting in it are done (bounded wait)."""
        if self._run.remote and (u := upload_active()) is not None and not u.drain():
            logger.warning("distprof: %s: an upload is still in flight at stop(); its staged files stay in %s",
                           self._who(), self._run.local_dir(""))
            return
        self._run.cleanup()

    # ---- fault isolation (capture/faults.py) -----------------------------------------------------------------
    def _guard(self, where: str, fn: Callable[[], Any]) -> None:
        shutdown.enter(self, where)  # a SIGTERM / SIGINT now stops after this state change, never in its middle
        try:
            fn()
        except Exception:
            if self._faults.fault(where):
                raise
        finally:
            shutdown.leave()

    def _fault_text(self, where: str) -> str:
        return (f"distprof: {self._who()} failed during {where} at step {self.global_step}; "
                "profiling is disabled for the rest of the run")

    def _fault(self, where: str) -> None:
        """Switch off after a fault (the guard logged it): answer a waiting request, abort the backend, inert."""
        window_closed(self)
        if self._ondemand is not None:
            self._ondemand.fault(where)
        self._open = self._next = self._held = None
        self._stages = self._ondemand = None
        if self._backend is not None:
            try:
                self._backend.abort()
            except Exception:  # abort must never raise; if it does, there is nothing more to do
                pass
        self._started = False
        shutdown.unregister(self)
        self._make_inert()

    def _record_annotation(self, name: str, ns: int) -> None:
        w = self._open
        if w is None or self.global_step < w.start:
            return  # warm-up steps are not part of the capture
        for d in (self._annotations, self._annotations_total):
            entry = d.get(name)
            if entry is None:
                d[name] = [1, ns]
            else:
                entry[0] += 1
                entry[1] += ns

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _who(self) -> str:
        return f"profiler {self.role!r} rank {self.rank}"

    def _run_info(self) -> dict[str, Any]:
        return run_info(self.config, self.world_size, self._plan)


_STEP_SWAP = threading.Lock()  # held to change a profiler's fast path (rare); the step itself never takes it
IDLE, INERT = 1, 2  # Profiler._fast: step() is one increment while idle (a trigger profiler between polls) or inert

