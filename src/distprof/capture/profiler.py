"""Profiler: decides from config alone what this process captures, and drives one backend.

Lifecycle: ``start()`` (or ``with prof:``), then ``step()`` at the end of every
step, then ``stop()``. ``global_step`` is the step about to run; ``step()`` ends
it. Capture windows come from ``config.plan()`` and are evaluated on global
step numbers, so a resumed job captures the same steps as a fresh one.

An inert profiler (disabled, or this rank / role not selected, or switched off
by a fault) swaps its ``step`` for a one-line counter: no files, no
directories, no imports. Any fault inside a backend is logged once with its
traceback and turns this profiler off (``on_error="disable"``) or re-raises
(``on_error="raise"``); training code never sees a profiler exception.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from distprof.capture import shutdown
from distprof.capture.annotate import refresh_emitters, window_closed, window_opened
from distprof.capture.steptime import BASELINE_STEPS, SETTLING_STEPS, StepClock
from distprof.config.model import ProfilerConfig
from distprof.config.plan import Window, role_selected
from distprof.rundir.layout import ROLE_JSON, rank_dir, sanitize_role, stage_label
from distprof.rundir.manifest import WindowRecord
from distprof.rundir.publish import publish, write_json
from distprof.rundir.store import RunDir
from distprof.rundir.upload import active as upload_active
from distprof.util import logs
from distprof.util.envvars import apply_log_level
from distprof.util.runtime import VERSION, detect_local_rank, detect_rank_world, host_name, torch_version

logger = logging.getLogger(__name__)

__all__ = ["BASELINE_STEPS", "SETTLING_STEPS", "Profiler"]

_NEVER = 1 << 62  # a step number no run reaches: nothing is timed


class Profiler:
    """One profiler per training process and granularity (role)."""

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
            raise ValueError(f"global_step must be an integer >= 0, got {global_step!r}; pass the trainer's step counter")
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
        self._plan = None
        self._next: Window | None = None  # the next window to open, as seen from global_step
        self._open: Window | None = None  # the window being captured
        self._backend: Any = None
        self._windows_closed = 0
        self._held: tuple[Window, int, float] | None = None  # a closed window whose files are not written yet
        self._last_summary: dict[str, Any] | None = None
        self._annotations: dict[str, list[int]] = {}  # name -> [count, total ns] of the open / last window
        # Discrete mode (verl's): every outermost annotated stage of a planned step is its own window.
        self._discrete = config.discrete
        self._armed = False  # discrete: this step is planned, so annotate() reports stages to us
        self._stage: list[Any] | None = None  # discrete: [name, depth, thread id, label] of the open stage window
        self._stage_runs: dict[str, int] = {}  # discrete: stage name -> runs in the current step
        self._annotations_total: dict[str, list[int]] = {}
        # Profiling's own cost (capture/steptime.py): steps from _time_from on are timed (the baseline steps before the
        # next window's warm-up, then the window's); every other step pays one comparison. _mark: (step,
        # perf_counter) when that step began. The memory guard (None when no limit is set) is asked at step ends
        # of an open window.
        self._time_from = _NEVER
        self._mark: tuple[int, float] | None = None
        self._clock = StepClock()
        self._mem_guard: Any = None
        self._guard_numbers: dict[str, Any] | None = None
        self._guard_tripped = False
        # On-demand capture (trigger: true): requests polled from save_path/.requests (capture/trigger.py).
        self._requests = None  # the RequestStore, when this process opted in
        self._poll_due = True  # time to look at the requests folder (set every trigger_poll_s by _PollTimer)
        self._poll_timer: _PollTimer | None = None
        self._seen: set[str] = set()  # request ids this process has answered (or that are not for it)
        self._pending: tuple[Any, Window] | None = None  # an accepted request and its window, not open yet
        self._open_trigger: tuple[Any, Any] | None = None  # (request, its backend) of the open requested window
        self._engine: Any = None  # the rollout engine this role drives (capture/engines/capture.py), if any

        if not (config.enable or config.trigger):
            self._make_inert()
            return
        config.check_world_size(world_size)
        if local_rank is None:
            local_rank = detect_local_rank(rank) if world_size > 1 else 0
        self._mesh = None
        if mesh is not None and isinstance(config.ranks, dict):
            from distprof.config.mesh import RankMesh

            self._mesh = RankMesh.of(mesh)  # recorded in role.json, so `check` knows which ranks should capture
        if not (role_selected(config.roles, self.role) and config.selects_rank(rank, world_size, mesh, local_rank)):
            self._make_inert()
            return
        from distprof.capture.backends import create_backend

        self._backend = create_backend(config)
        self._run = RunDir(config.save_path)
        self._run.check_writable()
        self._dir = rank_dir(self.role, rank)
        self._plan = config.plan()
        if not self._discrete and not config.is_process_backend:  # windows that end at step boundaries
            from distprof.capture.guard import MemoryGuard

            self._mem_guard = MemoryGuard.from_config(config)
        if config.trigger:
            from distprof.capture.trigger import RequestScanner, RequestStore

            self._requests = RequestStore(config.save_path)
            self._scanner = RequestScanner(self._requests, self._who())
        self.enabled = True
        if config.engine is not None:
            from distprof.capture.engines.capture import for_profiler

            self._engine = for_profiler(self)

    # ---- public API -----------------------------------------------------------------------------------
    def start(self) -> Profiler:
        if not self.enabled or self._started:
            return self
        self._started, self._stopped = True, False
        shutdown.register(self)  # the open window is written however the process leaves
        self._guard("start", self._start)
        return self

    def step(self, export: bool = True) -> None:
        """End the current global step. Call once at the end of every step at this profiler's granularity.

        When this step closes a capture window, its trace is written inside this call. With
        ``export=False`` the step still ends here (``ProfilerStep#N`` closes now) but writing is
        held until :meth:`export` (or the next ``step()`` / ``stop()``): a driver ending the step
        of several worker groups ends every group's step first, then lets them write, so no
        group's export lands inside another group's step.
        """
        if self._started:
            self._guard("step", self._step if export else self._step_held)
            return
        self.global_step += 1
        if not self._stopped:
            logger.warning("distprof: %s step() called before start(); starting now at step %d", self._who(), self.global_step)
            self.start()

    def export(self) -> bool:
        """Write the window a ``step(export=False)`` closed; True if there was one (else a no-op)."""
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
        if not self.enabled or not self._started:
            return
        self._started = False
        self._stopped = True
        self._use_full_step()  # leave the idle fast path: a stopped profiler polls nothing
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        try:
            self._guard("stop", lambda: self._stop(crashed, cause))
        finally:  # only now: a signal during the last export waits for it (capture/shutdown.py), then stops the process
            shutdown.unregister(self)

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        # Leaving on an exception: the step about to end is the one that failed; keep it in the trace.
        self._finish(crashed=exc_type is not None, cause=shutdown.cause_of(exc_type))
        return False

    @property
    def capturing(self) -> bool:
        """True while a window (warm-up included) is open."""
        return self._open is not None

    def summary(self) -> dict[str, Any] | None:
        """Per-op self time and count of the last closed window, and device busy time (overlap counted once)."""
        return self._last_summary

    def annotation_times(self, total: bool = False) -> dict[str, dict[str, float]]:
        """Wall time per ``annotate`` name: of the open (or last) window, or over the whole run with ``total``."""
        src = self._annotations_total if total else self._annotations
        return {k: {"count": c, "total_s": ns / 1e9} for k, (c, ns) in src.items()}

    @property
    def windows_closed(self) -> int:
        return self._windows_closed

    @property
    def save_dir(self) -> str | None:
        """Where this profiler's files go (None when inert)."""
        return self._run.url(self._dir) if self.enabled else None

    def __repr__(self) -> str:
        state = "capturing" if self.capturing else ("enabled" if self.enabled else "inert")
        return f"Profiler(role={self.role!r}, rank={self.rank}, world_size={self.world_size}, step={self.global_step}, {state})"

    # ---- inert mode -------------------------------------------------------------------------------------
    def _make_inert(self) -> None:
        self.enabled = False
        # Instance attributes shadow the methods: an inert step() is one increment.
        with _STEP_SWAP:  # the poll timer's thread swaps step too (_use_full_step)
            self.step = self._inert_step  # type: ignore[method-assign]

    def _inert_step(self, export: bool = True) -> None:
        self.global_step += 1

    def _forked(self) -> None:
        """In a forked child (capture/shutdown.py): the parent's windows are not this process's to write. Inert, without
        touching torch's profiler (the parent's) or the step lock (another parent thread may have held it)."""
        window_closed(self)
        self._started, self._stopped, self.enabled, self._armed, self._discrete = False, True, False, False, False
        self._backend = self._open = self._next = self._held = self._stage = self._pending = None
        self._open_trigger = self._requests = self._poll_timer = self._mem_guard = None
        self.__dict__["step"] = self._inert_step

    # ---- state machine ----------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._clock.started(self.global_step)
        info = self._run_info()
        write_json(self._run, info)
        write_json(self._run, {"role": self.role, "world_size": self.world_size, "plan": info["plan"],
                               "backend": self.config.backend, "config": info["config"],
                               **({"mesh": {"names": list(self._mesh.names), "shape": list(self._mesh.shape),
                                            "ranks": list(self._mesh.ranks)}} if self._mesh else {})},
                   rel=f"{self.role}/{ROLE_JSON}")
        self._next = self._plan.next_window(self.global_step)
        self._plan_timing()
        if self._engine is not None:
            self._engine.at(self.global_step)
        if self._next is None and not self.config.trigger:
            logger.warning("distprof: %s starts at step %d, after every capture window (%s); nothing will be captured",
                           self._who(), self.global_step, self._plan.describe())
        if self._discrete:
            self._arm()
        else:
            self._maybe_open()
            if self._requests is not None:
                self._poll()
                self._maybe_open_requested()
                self._idle_if_nothing_planned()

    def _step(self, hold: bool = False) -> None:
        if self._engine is not None:
            self._engine.at(self.global_step + 1)
        if self._discrete:
            self._step_discrete()
            return
        if self._held is not None:
            self._export_held()
        if self.global_step >= self._time_from:
            self._time_step(self.global_step)
        self.global_step += 1
        g = self.global_step
        w = self._open
        if w is not None:
            if g > w.end:
                t0, t1 = time.perf_counter(), time.time()  # closing starts: torch stops tracing, processes events
                # The guard always sees a window's last step, before its export (one step may have grown it a lot).
                crossed = None if self._mem_guard is None else self._mem_guard.sample()
                self._backend.advance(g)
                if crossed is not None:
                    self._trip_guard(w, w.end, crossed, t1=t1, t0=t0)  # exported (or refused) now, even with hold
                elif hold:
                    # The step has ended (torch closed ProfilerStep#N and stopped tracing); the files are
                    # written by export(). The next window opens then too, so its warm-up starts after.
                    self._open = None
                    window_closed(self)
                    self._held = (w, w.end, t1, time.perf_counter() - t0)
                    return
                else:
                    self._close(w, last=w.end, t1=t1, t0=t0)
                w = None
            else:
                self._backend.advance(g)
            if w is not None and self._mem_guard is not None:
                crossed = self._mem_guard.check(recording=g > w.start)
                if crossed is not None:
                    self._trip_guard(w, g - 1, crossed)
                elif g == w.start:
                    self._mem_guard.rebase()
        if self._next is not None and g >= self._next.warmup_start:
            self._maybe_open()
        if self._requests is not None:
            if self._poll_due:
                self._poll()
            self._maybe_open_requested()
            self._idle_if_nothing_planned()
        if g >= self._time_from:  # stamped last: the profiler's own step-end work is not the next step's time
            self._mark = (g, time.perf_counter())

    def _step_held(self) -> None:
        self._step(hold=True)

    def _export_held(self) -> None:
        w, last, t1, spent = self._held
        self._held = None
        self._close(w, last=last, t1=t1, spent=spent)
        if self._next is not None and self.global_step >= self._next.warmup_start:
            self._maybe_open()
        if self._requests is not None:
            self._maybe_open_requested()
            self._idle_if_nothing_planned()
        if self.global_step >= self._time_from:
            self._mark = (self.global_step, time.perf_counter())

    # ---- discrete mode: one window per stage run ---------------------------------------------------------
    def _arm(self) -> None:
        """Listen to annotate() during planned steps only; elsewhere the inert fast path stays inert."""
        w = self._plan.next_window(self.global_step)
        armed = w is not None and w.start <= self.global_step <= w.end
        if armed and not self._armed:
            window_opened(self)
        elif self._armed and not armed:
            window_closed(self)
        self._armed = armed
        self._stage_runs = {}

    def _step_discrete(self) -> None:
        if self._stage is not None:  # a stage still open at the step's end: it ends with the step
            self._close_stage(stopped_by="step_end")
        self.global_step += 1
        self._arm()

    def _stage_enter(self, name: str) -> None:
        """annotate() entered ``name`` while armed: open its window if it is the outermost range."""
        tid = threading.get_ident()
        st = self._stage
        if st is not None:
            if st[2] == tid:
                st[1] += 1  # a range nested in the stage: part of its trace
            return
        from distprof.capture.backends import WindowContext

        g = self.global_step
        runs = self._stage_runs[name] = self._stage_runs.get(name, 0) + 1
        label = stage_label(name, runs)
        self._annotations = {}
        ctx = WindowContext(role=self.role, rank=self.rank, world_size=self.world_size,
                            tmp_path=lambda n: self._run.temp_path(self._dir, n), label=label,
                            publish_now=self._publish_now)
        w = Window(start=g, end=g, warmup_start=g)
        self._stage = [name, 1, tid, label]
        self._open = w
        self._window_t0 = time.time()
        self._backend.begin(w, g, ctx)
        refresh_emitters()  # the backend may have imported torch just now: the stage's own range must show

    def _stage_exit(self, name: str, exc_type: Any = None) -> None:
        st = self._stage
        if st is None or st[2] != threading.get_ident():
            return
        st[1] -= 1
        if st[1] == 0:  # a stage left by an exception (or SystemExit) is cut short: say why
            self._close_stage(stopped_by=None if exc_type is None else shutdown.cause_of(exc_type))

    def _close_stage(self, stopped_by: str | None = None) -> None:
        name = self._stage[0]
        self._stage = None
        w = self._open
        self._close(w, last=w.end, stopped_by=stopped_by, stage=name)
        if self._armed:
            window_opened(self)  # _close() stopped the listening; the step goes on

    def _stop(self, crashed: bool, cause: str) -> None:
        if self._engine is not None:
            self._engine.close(cause)
        if self._discrete:
            if self._stage is not None:
                self._close_stage(stopped_by=cause)
            if self._armed:
                window_closed(self)
                self._armed = False
            self._cleanup_run()
            return
        if self._held is not None:
            w, last, t1, spent = self._held
            self._held = None
            self._close(w, last=last, t1=t1, spent=spent)
        w = self._open
        if w is not None:
            # Steps before global_step finished; global_step itself ran (partly) only if we crashed in it.
            last = min(w.end, self.global_step if crashed else self.global_step - 1)
            self._close(w, last=last, stopped_by=cause)
        if self._pending is not None:
            req, pw = self._pending
            self._pending = None
            self._ack(req, "skipped", f"stopped ({cause}) at step {self.global_step}, before the requested steps "
                                      f"{pw.start}-{pw.end}")
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

    def _begin_window(self, w: Window, backend: Any) -> None:
        """Open ``w`` on ``backend`` (a planned window, or a requested one with its own backend)."""
        from distprof.capture.backends import WindowContext

        self._annotations = {}
        ctx = WindowContext(role=self.role, rank=self.rank, world_size=self.world_size,
                            tmp_path=lambda name: self._run.temp_path(self._dir, name), publish_now=self._publish_now)
        self._open = w
        self._window_t0 = time.time()
        self._clock.opened()
        backend.begin(w, self.global_step, ctx)
        window_opened(self)  # after begin(): the backend has imported what the ranges emit into
        if self._mem_guard is not None:
            self._mem_guard.open()  # after begin(): torch's own start-up memory is not the trace's

    def _close(self, w: Window, last: int, t1: float | None = None, stopped_by: str | None = None,
               stage: str | None = None, t0: float | None = None, spent: float = 0.0) -> None:
        """Publish the window's files and its manifest line; ``t1``: when its last step ended (default now).

        ``stopped_by``: why the window closed before its end (``stop``, ``exception``, ``exit``, a signal's
        name); such a window is never ``complete``, even when the interrupted step was its last. ``export_s``
        in the line: from ``t0`` (default now; the step that ends a window starts closing it before this call)
        until its files are published, plus ``spent`` (closing work done in an earlier call: a held export).
        """
        t0 = time.perf_counter() if t0 is None else t0
        self._open = None
        window_closed(self)
        t1 = time.time() if t1 is None else t1
        requested, self._open_trigger = self._open_trigger, None  # (request, the plan's backend)
        numbers, failed = self._guard_numbers, None  # set while the memory guard closes this window (capture/guard.py)
        try:
            if numbers is None:
                result = self._backend.finish(w.start, last)
            else:
                from distprof.capture.guard import finish_closed

                result, failed = finish_closed(self._backend, w.start, last, numbers)
        finally:
            if requested is not None:
                self._backend = requested[1]
        stopped_by = shutdown.held(stopped_by)  # a signal came during the export: it is what ends the process
        self._last_summary = result.summary
        staged = [(tmp, name) for name, tmp in sorted(result.files.items())]
        if staged or (numbers is not None and requested is None):  # every window the guard closed gets its line
            fields = dict(
                role=self.role, rank=self.rank, world_size=self.world_size,
                steps=[w.start, last] if last >= w.start else [w.start, w.end],  # in warm-up: the planned steps
                complete=stopped_by is None and last >= w.end, stopped_by=stopped_by,
                start_time=self._window_t0, end_time=t1,
                host=host_name(), pid=os.getpid(), torch=torch_version(),
                backend=requested[0].backend if requested is not None else self.config.backend,
                stage=stage, annotations=self.annotation_times(), summary=_short_summary(result.summary),
                **self._clock.record(), guard=self._guard_numbers,
                trigger=requested[0].id if requested is not None else None,
            )
            # A requested window is acknowledged once its files are where they stay (from the upload thread).
            done = None if requested is None else self._ack_uploaded(requested[0], self._requests, stopped_by)
            publish(self._run, self._dir, staged, fields, self._who(), done, t0=t0 - spent)
            if staged:
                self._windows_closed += 1
                logs.announce_where(self._who(), self.save_dir, self._run.save_path if self._run.remote else self._run.root)
        elif requested is not None:
            self._unrecorded_request(requested[0], w, last, stopped_by)
        self._clock.closed(last)
        self._next = None if self._guard_tripped else self._plan.next_window(self.global_step)
        self._plan_timing()
        if failed is not None:
            raise failed  # recorded above; now the usual fault path (logged, profiling off)

    # ---- profiling's own cost and the memory guard --------------------------------------------------------
    def _plan_timing(self) -> None:
        """Time the steady-state steps before the next window's warm-up and the window's own steps (capture/steptime.py);
        the plan knows them in advance, so no other step is timed."""
        w = self._next
        self._time_from = _NEVER if w is None else self._clock.first_timed(w)
        self._clock.reset()
        if self.global_step >= self._time_from:
            self._mark = (self.global_step, time.perf_counter())
        if self._pending is not None:  # a request accepted while a planned window was open: still timed
            self._time_request(self._pending[1])

    def _time_request(self, w: Window) -> None:
        """An accepted request is timed like a planned window (profiling's own cost in its manifest line): its
        baseline steps from now on, its recorded steps. The planned next window comes after it (no overlap)."""
        start = self._clock.first_timed(w)
        if start < self._time_from:
            self._time_from = start
            self._clock.reset()
            if self.global_step >= start:
                self._mark = (self.global_step, time.perf_counter())

    def _time_step(self, ended: int) -> None:
        """Step ``ended`` just ended: its wall time joins the baseline (no window open) or the window's
        recorded steps (warm-up steps are neither)."""
        t = time.perf_counter()
        mark = self._mark
        if mark is None or mark[0] != ended:
            return  # its start was not stamped (a late start, a held export): not a whole step
        w = self._open  # StepClock's lists, filled here: a method call would cost each timed step 0.1 us more
        if w is None:
            self._clock.baseline.append((ended, t - mark[1]))
        elif ended >= w.start:
            self._clock.window_steps.append(t - mark[1])

    def _trip_guard(self, w: Window, last: int, crossed: dict[str, Any], **close: Any) -> None:
        """A memory limit was crossed at the end of step ``last``: close the window now with what it recorded,
        warn once, and open no more windows in this run."""
        from distprof.capture.guard import GUARD_STOP, describe

        kept = f"keeping steps {w.start}-{last}" if last >= w.start else "in its warm-up: nothing recorded yet"
        if crossed.get("exported") is False and last >= w.start:
            kept = f"dropping steps {w.start}-{last} unexported; its manifest line says why"
        logger.warning("distprof: %s: %s at step %d; closing window %d-%d early (%s) and capturing no more "
                       "windows in this run", self._who(), describe(crossed), last, w.start, w.end, kept)
        self._guard_tripped = True
        self._mem_guard = None
        self._guard_numbers = {**crossed, "step": last}
        try:
            self._close(w, last=last, stopped_by=GUARD_STOP, **close)
        finally:
            self._guard_numbers = None

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

    # ---- on-demand capture (trigger: true; the rule is in capture/trigger.py) ------------------------------
    def trigger_request(self, request: Any) -> dict[str, Any] | None:
        """Hand a request to this profiler in-process (the Ray groups do, without a shared filesystem).

        It is stored under this process's save_path (so ``distprof trigger --status`` and ``collect`` see it)
        and answered by the same rule as a polled one. Returns this process's acknowledgement (None: the
        request does not select this role / rank, or this profiler does not take requests).
        """
        if self._requests is None or not self._started:
            return None
        out: list[Any] = []
        self._guard("trigger", lambda: out.append(self._take(request, stored=False)))
        if self._pending is not None or self._open_trigger is not None:
            self._use_full_step(if_idle=True)  # a window to open: leave the idle fast path
        import msgspec

        return msgspec.to_builtins(out[0]) if out and out[0] is not None else None

    def _idle_step(self, export: bool = True) -> None:
        """step() while nothing is planned or requested: the inert one. Every trigger_poll_s the poll timer
        puts the full step() back (_use_full_step), which looks for requests at the next step boundary."""
        self.global_step += 1

    def _idle_if_nothing_planned(self) -> None:
        if (self._open is None and self._next is None and self._held is None and self._pending is None
                and self._started and self.enabled and self.config.trigger_poll_s > 0):
            with _STEP_SWAP:
                self.step = self._idle_step  # type: ignore[method-assign]

    def _use_full_step(self, if_idle: bool = False) -> None:
        """Back to the class's step(); ``if_idle``: only from the idle step (never undo an inert one)."""
        with _STEP_SWAP:
            if not if_idle or getattr(self.__dict__.get("step"), "__func__", None) is Profiler._idle_step:
                self.__dict__.pop("step", None)

    def _poll(self) -> None:
        """Answer the requests found (capture/trigger.py RequestScanner): the poll thread reads the folder; this
        thread reads it only at the first poll and with trigger_poll_s 0, a bounded number of files."""
        from distprof.capture.trigger import READS_PER_POLL

        interval = self.config.trigger_poll_s
        self._poll_due = interval == 0  # 0: at every step
        if interval == 0 or self._poll_timer is None:
            self._scanner.scan(limit=READS_PER_POLL)
        if interval > 0 and self._poll_timer is None:
            self._poll_timer = _PollTimer(self, interval)
        for req in self._scanner.take():
            if req.id not in self._seen:
                self._take(req, stored=True)

    def _take(self, req: Any, stored: bool) -> Any:
        """Answer one request: accepted (with its steps), refused, skipped, or None when it is not for us."""
        from distprof.capture.trigger import FINAL_STATES, aligned_start, too_far

        store = self._requests
        self._seen.add(req.id)
        if (req.ranks is not None and self.rank not in req.ranks) or not role_selected(req.roles, self.role):
            return None
        g = self.global_step  # the step about to run
        try:
            if not stored:
                store.put(req)
            prev = store.my_ack(req.id, self.role, self.rank)
            if prev is not None and prev.state in FINAL_STATES:
                return prev  # answered by an earlier process of this rank (a restarted job)
            why = self._refusal(req)
            if why:
                return self._ack(req, "refused", why, seen_step=g)
            start = req.start_step if req.start_step is not None else store.claim_start(
                req.id, aligned_start(g, req.lead_steps, req.align))
        except (OSError, ValueError) as e:  # a folder it may read, not write: this request only, not profiling
            logger.warning("distprof: %s skips request %s: it cannot write its claim in %s: %s", self._who(),
                           req.id, store.save_path, e)
            return None
        why = too_far(start, g)
        if why:
            return self._ack(req, "refused", why, seen_step=g)
        end = start + req.steps - 1
        if g > start:
            detail = f"saw the request at step {g}, after the agreed start {start}"
            # Said in the manifest too (no files, stopped_by trigger_skipped): whoever reads the run sees why
            # this rank lacks the steps the others captured.
            self._run.append_manifest(self._dir, WindowRecord(
                role=self.role, rank=self.rank, world_size=self.world_size, steps=[start, end], complete=False,
                stopped_by="trigger_skipped", written_time=time.time(), host=host_name(), pid=os.getpid(),
                backend=req.backend, trigger=req.id))
            return self._ack(req, "skipped", detail, steps=[start, end], seen_step=g)
        w = Window(start=start, end=end, warmup_start=max(start - 1, g))
        planned = self._plan.next_window(w.warmup_start)
        if (self._open is not None and self._open.end >= w.warmup_start) or (
                planned is not None and planned.warmup_start <= w.end):
            other = self._open if self._open is not None and self._open.end >= w.warmup_start else planned
            return self._ack(req, "refused", f"steps {start}-{end} overlap the planned window {other.start}-{other.end}",
                             steps=[start, end], seen_step=g)
        self._pending = (req, w)
        self._time_request(w)
        return self._ack(req, "accepted", f"will record steps {start}-{end}", steps=[start, end], seen_step=g)

    def _refusal(self, req: Any) -> str | None:
        cfg = self.config
        if self._guard_tripped:
            return "the memory guard stopped profiling on this rank earlier in the run; it captures no more windows"
        if req.steps > cfg.trigger_max_steps:
            return (f"asks for {req.steps} steps, over this job's trigger_max_steps={cfg.trigger_max_steps}; "
                    "ask for fewer steps")
        if self._pending is not None or self._open_trigger is not None:
            busy = (self._pending or self._open_trigger)[0].id
            return f"request {busy} is still pending here; send this one after it is captured"
        if req.backend == "cuda_memory":
            import torch

            if not torch.cuda.is_available():
                return "backend cuda_memory needs a CUDA device, and this process has none"
        return None

    def _maybe_open_requested(self) -> None:
        if self._pending is None or self._open is not None or self.global_step < self._pending[1].warmup_start:
            return
        from distprof.capture.backends import create_backend

        req, w = self._pending
        self._pending = None
        w = w.clipped(self.global_step)
        cfg = self.config
        if req.backend != cfg.backend or req.flags:
            backend = create_backend(cfg.model_copy(update={
                "backend": req.backend, "torch": cfg.torch.model_copy(update={f: True for f in req.flags})}))
        else:
            backend = self._backend
        self._open_trigger = (req, self._backend)
        self._backend = backend
        self._begin_window(w, backend)
        logger.info("distprof: %s opened requested window %d-%d (request %s)", self._who(), w.start, w.end, req.id)

    def _ack(self, req: Any, state: str, detail: str, steps: list[int] | None = None, seen_step: int | None = None,
             file: str | None = None, store: Any = None) -> Any:
        """``store``: where to write it (default this profiler's request store; the upload thread passes the one
        the request came from, since a later fault drops this profiler's)."""
        from distprof.capture.trigger import TriggerAck

        ack = TriggerAck(id=req.id, role=self.role, rank=self.rank, state=state, detail=detail, steps=steps,
                         seen_step=seen_step, file=file, time=time.time(), host=host_name(), pid=os.getpid())
        (logger.warning if state in ("refused", "skipped") else logger.info)(
            "distprof: %s %s request %s: %s", self._who(), state, req.id, detail)
        try:
            (store or self._requests).ack(ack)
        except Exception as e:  # the acknowledgement is for people; failing to write it must not stop the capture
            logger.warning("distprof: %s could not write its acknowledgement of request %s: %s", self._who(), req.id, e)
        return ack

    def _ack_uploaded(self, req: Any, store: Any, stopped_by: str | None):
        """The acknowledgement of a requested window whose manifest line ``rec`` was written: captured, with the
        file where it stays (its published name, or the local folder it was kept in when the upload failed)."""
        def done(rec: WindowRecord) -> None:
            detail = f"recorded steps {rec.steps[0]}-{rec.steps[1]}" + (
                "" if stopped_by is None else f", cut short ({stopped_by})")
            if rec.local_path is not None:
                detail += f"; the upload failed ({rec.upload_error}), so the files stay on {rec.host} in {rec.local_path}"
            self._ack(req, "captured", detail, steps=list(rec.steps), file=rec.file, store=store)
        return done

    def _unrecorded_request(self, req: Any, w: Window, last: int, stopped_by: str | None) -> None:
        """A requested window that closed with no file: cut short before its first step (the memory guard in its
        warm-up, stop()), or a backend that wrote nothing. Said in the ack and, when cut short, in the manifest."""
        if stopped_by is None:
            self._ack(req, "refused", "the backend wrote no file")
            return
        self._run.append_manifest(self._dir, WindowRecord(
            role=self.role, rank=self.rank, world_size=self.world_size, steps=[w.start, w.end], complete=False,
            stopped_by=stopped_by, written_time=time.time(), host=host_name(), pid=os.getpid(), backend=req.backend,
            trigger=req.id, guard=self._guard_numbers))
        self._ack(req, "skipped", f"cut short ({stopped_by}) after step {last}, " + (
            f"before the requested steps {w.start}-{w.end}: nothing recorded" if last < w.start else
            f"steps {w.start}-{last} not exported: {(self._guard_numbers or {}).get('reason', 'no file')}"))

    # ---- fault isolation -----------------------------------------------------------------------------------
    def _guard(self, where: str, fn) -> None:
        shutdown.enter(self, where)  # a SIGTERM / SIGINT now stops after this state change, never in its middle
        try:
            fn()
        except Exception:
            self._fault(where)
            if self.config.on_error == "raise":
                raise
        finally:
            shutdown.leave()

    def _fault(self, where: str) -> None:
        logger.error("distprof: %s failed during %s at step %d; profiling is disabled for the rest of the run",
                     self._who(), where, self.global_step, exc_info=True)
        window_closed(self)
        waiting = self._open_trigger or self._pending
        if waiting is not None and self._requests is not None:  # its sender is waiting for an answer
            self._ack(waiting[0], "refused", f"profiling failed during {where} at step {self.global_step}; "
                                             "see this process's log")
        self._open = self._next = self._held = self._stage = None
        self._armed = False
        self._pending = self._open_trigger = None
        self._requests = None
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
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
        return {
            "config": self.config.model_dump(mode="json"),
            "world_size": self.world_size,
            "plan": self._plan.describe(),
            "start_time": time.time(),
            "host": host_name(),
            "versions": {"distprof": VERSION, "torch": torch_version(), "python": sys.version.split()[0]},
        }


_STEP_SWAP = threading.Lock()  # held to swap a profiler's step (rare); the step itself never takes it


class _PollTimer:
    """Every ``interval`` seconds (Event.wait: a monotonic clock), tells a profiler to look for requests at its
    next step boundary: raises ``_poll_due`` and puts the full step() back in place of the idle one, so an idle
    step() reads no clock and no flag. The thread holds the profiler weakly and ends with it."""

    def __init__(self, prof: Profiler, interval: float):
        import weakref

        self._stop = threading.Event()
        self._ref = weakref.ref(prof)

        def run() -> None:
            while not self._stop.wait(interval) and self.fire():
                pass

        self._thread = threading.Thread(target=run, name="distprof-trigger-poll", daemon=True)
        self._thread.start()

    def fire(self) -> bool:
        """Time to poll; False once the profiler is gone."""
        p = self._ref()
        if p is None:
            return False
        if p._requests is not None:
            from distprof.capture.trigger import READS_PER_SCAN

            p._scanner.scan(READS_PER_SCAN)  # on this thread: the folder is read here, never in a step
        p._poll_due = True
        p._use_full_step(if_idle=True)
        return True

    def cancel(self) -> None:
        self._stop.set()


def _short_summary(summary: dict[str, Any] | None, top: int = 10) -> dict[str, Any] | None:
    if not summary:
        return None
    return {
        **({"activities": summary["activities"]} if "activities" in summary else {}),  # what "auto" became here
        "device_busy_us": summary["device_busy_us"],
        "self_device_us": summary["self_device_us"],
        "self_cpu_us": summary["self_cpu_us"],
        "top": summary["ops"][:top],
    }
