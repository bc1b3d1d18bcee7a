"""annotate(name): a named range, as a decorator or a context manager.

While a capture window is open in this process, a range emits
``torch.profiler.record_function`` (so it shows in the trace), an NVTX range
when CUDA is available (so Nsight shows it), and adds its wall time to every
open profiler's per-name timings. Otherwise it does nothing: ``annotate(name)``
returns a cached object whose ``__enter__`` / ``__exit__`` each test one
module-level counter, so an inert range costs about as much as a preallocated
no-op context manager.

With step telemetry on (:mod:`.telemetry`), ``Annotation.__enter__`` / ``__exit__`` are swapped for timed ones
while any telemetry lives: an outermost range on the training thread (the thread that started the first
telemetry) appends itself and its wall time to ``_STATE.log`` (two clock reads, two appends), which the first
live telemetry takes at each of its steps (:func:`take_phases`) and adds up in its writer thread; the inert
methods come back when the last telemetry stops, so a job without telemetry pays nothing for it. Ranges on
other threads are not phases: an outermost range is recognised by the thread it opens on, and only ranges of
its own name inside it are counted (recursion), which keeps both methods to one or two attribute tests when
nothing is timed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
import time
from _thread import get_ident
from collections.abc import Callable
from typing import Any, Literal, TypeVar

logger = logging.getLogger(__name__)

__all__ = ["Annotation", "annotate"]

F = TypeVar("F", bound=Callable[..., Any])


class _State:
    """Process-wide counters read on every inert call (kept as plain attributes: fastest lookups)."""

    __slots__ = ("active", "live", "lock", "log", "nvtx", "opened", "profilers", "record_function", "same", "t0",
                 "thread", "timing", "top", "warned")

    def __init__(self) -> None:
        self.active = 0  # capture windows open in this process
        self.live = 0  # nonzero while a window is open or telemetry times ranges: decorated functions enter
        self.timing: tuple[Any, ...] = ()  # live telemetries (capture/telemetry.py), receiving outermost ranges
        self.thread = 0  # the training thread: the one whose outermost ranges are phases
        self.top: Annotation | None = None  # that thread's open outermost range
        self.same = 0  # ranges of the same name open inside it (recursion)
        self.t0 = 0  # when it opened (perf_counter_ns)
        # The outermost ranges closed since the primary telemetry's last step: range, ns, range, ns, ... (two
        # appends, no tuple: the cheapest record; the telemetry's writer thread adds them up per name).
        self.log: list[Any] = []
        self.opened = 0  # ranges open right now, all threads
        self.profilers: list[Any] = []  # profilers with an open window (they receive timings)
        self.record_function: Any = None
        self.nvtx: Any = None
        self.lock = threading.Lock()
        self.warned = False

    def __reduce__(self):
        # A decorated function or method defined in a driver's __main__ is pickled by value (cloudpickle,
        # Ray), with the globals its wrapper reads: this one. It stands for "this process's state", so it
        # unpickles as the receiving process's own, never as a copy (and never tries to pickle the lock).
        return (_process_state, ())


_STATE = _State()


def _process_state() -> _State:
    return _STATE

_tls = threading.local()
_NONE: list[Any] = []  # no phases this step (shared, never written to)
_now = time.perf_counter_ns
_CACHE: dict[str, Annotation] = {}
_CACHE_LIMIT = 4096  # dynamic names (f"step{i}") must not grow the cache forever


def window_opened(profiler: Any) -> None:
    """Called by a Profiler when it opens a capture window."""
    with _STATE.lock:
        if _STATE.active == 0:
            torch = sys.modules.get("torch")
            if torch is not None:
                _STATE.record_function = torch.profiler.record_function
                try:
                    _STATE.nvtx = torch.cuda.nvtx if torch.cuda.is_available() else None
                except Exception:  # pragma: no cover - CUDA probing failures mean: no NVTX
                    _STATE.nvtx = None
        _STATE.profilers.append(profiler)
        _STATE.active += 1
        _STATE.live = 1


def refresh_emitters() -> None:
    """Pick up torch's record_function / NVTX if torch was imported after the first window opened (a discrete
    profiler listens before its backend has imported torch)."""
    torch = sys.modules.get("torch")
    if torch is None or _STATE.record_function is not None:
        return
    with _STATE.lock:
        _STATE.record_function = torch.profiler.record_function
        try:
            _STATE.nvtx = torch.cuda.nvtx if torch.cuda.is_available() else None
        except Exception:  # pragma: no cover - CUDA probing failures mean: no NVTX
            _STATE.nvtx = None


def window_closed(profiler: Any) -> None:
    with _STATE.lock:
        if profiler in _STATE.profilers:
            _STATE.profilers.remove(profiler)
            _STATE.active -= 1
            _STATE.live = 1 if (_STATE.active or _STATE.timing) else 0


def timing_on(telemetry: Any) -> None:
    """``telemetry`` receives the outermost ranges of the calling (training) thread: swap in the timed methods."""
    with _STATE.lock:
        if telemetry in _STATE.timing:
            return
        if not _STATE.timing:
            _STATE.thread, _STATE.top, _STATE.same = get_ident(), None, 0
            take_phases()
            Annotation.__enter__ = Annotation._timed_enter  # type: ignore[method-assign]
            Annotation.__exit__ = Annotation._timed_exit  # type: ignore[method-assign]
        _STATE.timing = (*_STATE.timing, telemetry)
        _STATE.live = 1


def take_phases() -> list[Any]:
    """The outermost ranges closed since the last call (range, ns, range, ns, ...; :func:`phase_times` adds them
    up), and start again: the primary telemetry's step end."""
    log = _STATE.log
    if not log:
        return _NONE
    _STATE.log = []
    return log


def phase_times(log: list[Any]) -> dict[str, int]:
    """ns per range name of a :func:`take_phases` record (off the training thread). A stray entry (the record
    cut between its two appends by :func:`trim_phases`) is skipped."""
    out: dict[str, int] = {}
    it = iter(log)
    for a in it:
        if isinstance(a, Annotation):
            ns = next(it, None)
            if isinstance(ns, int):
                out[a.name] = out.get(a.name, 0) + ns
    return out


def trim_phases(limit: int) -> None:
    """Drop the ranges recorded since the last step when there are more than ``limit`` (a job with telemetry
    whose profiler never ends a step must not grow memory); called from the telemetry's writer thread."""
    if len(_STATE.log) > 2 * limit:
        _STATE.log = []


def timing_off(telemetry: Any) -> None:
    """``telemetry`` stops receiving ranges; the last one gone puts the inert methods back."""
    with _STATE.lock:
        if telemetry not in _STATE.timing:
            return
        _STATE.timing = tuple(t for t in _STATE.timing if t is not telemetry)
        if not _STATE.timing:
            Annotation.__enter__ = Annotation._plain_enter  # type: ignore[method-assign]
            Annotation.__exit__ = Annotation._plain_exit  # type: ignore[method-assign]
            _STATE.live = 1 if _STATE.active else 0


def _warn_once(what: str) -> None:
    if not _STATE.warned:
        _STATE.warned = True
        logger.warning("distprof: annotate() failed to %s; the range is skipped (logged once)", what, exc_info=True)


class Annotation:
    """A named range. Get one with ``annotate(name)``."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"annotate({self.name!r})"

    def __reduce__(self):
        return (annotate, (self.name,))  # the receiving process's cached range of that name

    def __enter__(self) -> Annotation:
        if _STATE.active:
            self._open()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if _STATE.opened:
            self._close(exc_type)
        return False  # never swallow the caller's exception

    _plain_enter, _plain_exit = __enter__, __exit__

    def _timed_enter(self) -> Annotation:
        """``__enter__`` while telemetry lives: the window path, then, for an outermost range on the training
        thread, its start (a range of the same name inside it only counts its depth)."""
        st = _STATE
        if st.active:
            self._open()
        if st.top is None:
            if get_ident() == st.thread:
                st.top = self
                st.t0 = _now()
        elif st.top is self:
            st.same += 1
        return self

    def _timed_exit(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        st = _STATE
        if st.opened:
            self._close(exc_type)
        if st.top is self:
            if st.same:
                st.same -= 1
            else:
                ns = _now() - st.t0
                st.top = None
                log = st.log
                log.append(self)
                log.append(ns)
        return False

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args, **kwargs):
                if not _STATE.live:
                    return await func(*args, **kwargs)
                with self:
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not _STATE.live:
                return func(*args, **kwargs)
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    # ---- slow path: a window is open ----------------------------------------------------------
    def _open(self) -> None:
        rf = nv = None
        with _STATE.lock:
            profilers = list(_STATE.profilers)
        for p in profilers:  # discrete profilers open the stage's own window first, so the range below is in it
            if (st := p._stages) is not None:  # capture/stages.py
                p._guard("stage start", lambda st=st: st.enter(self.name))
        try:
            if _STATE.record_function is not None:
                rf = _STATE.record_function(self.name)
                rf.__enter__()
            if _STATE.nvtx is not None:
                _STATE.nvtx.range_push(self.name)
                nv = _STATE.nvtx
        except Exception:
            _warn_once(f"open range {self.name!r}")
        stack = _tls.__dict__.setdefault("stack", [])
        stack.append((self, rf, nv, time.perf_counter_ns()))
        with _STATE.lock:
            _STATE.opened += 1

    def _close(self, exc_type: Any = None) -> None:
        stack = _tls.__dict__.get("stack")
        if not stack or stack[-1][0] is not self:
            return  # this range was entered while no window was open
        _, rf, nv, t0 = stack.pop()
        elapsed = time.perf_counter_ns() - t0
        with _STATE.lock:
            _STATE.opened -= 1
            profilers = list(_STATE.profilers)
        try:
            if nv is not None:
                nv.range_pop()
            if rf is not None:
                rf.__exit__(None, None, None)
        except Exception:
            _warn_once(f"close range {self.name!r}")
        for p in profilers:
            p._record_annotation(self.name, elapsed)
        for p in profilers:
            if (st := p._stages) is not None:
                p._guard("stage end", lambda st=st: st.exit(self.name, exc_type))


def annotate(name: str) -> Annotation:
    """A named range: ``with annotate("rollout/generate"): ...`` or ``@annotate("actor/update")``.

    ``@annotate`` without a name uses the function's qualified name.
    """
    try:  # a subscript is cheaper than dict.get (no method call): this is the inert hot path
        return _CACHE[name]
    except KeyError:
        return _make(name)
    except TypeError:  # unhashable: not a name
        return _make(name)


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, the export child) times no range for its parent's telemetry (whose
    writer thread, which took and trimmed them, is not in the child: they would pile up) and gets a lock of its
    own (another thread of the parent may have held it at the fork)."""
    _STATE.lock = threading.Lock()
    if _STATE.timing:
        _STATE.timing, _STATE.top, _STATE.same, _STATE.log = (), None, 0, []
        Annotation.__enter__ = Annotation._plain_enter  # type: ignore[method-assign]
        Annotation.__exit__ = Annotation._plain_exit  # type: ignore[method-assign]
        _STATE.live = 1 if _STATE.active else 0


if hasattr(os, "register_at_fork"):  # registered before capture.shutdown's (imported after): it takes the lock
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _make(name: Any) -> Any:
    if callable(name):  # bare @annotate
        return annotate(getattr(name, "__qualname__", repr(name)))(name)
    if not isinstance(name, str) or not name:
        raise ValueError(f"annotate() needs a non-empty string name, got {name!r}")
    a = Annotation(name)
    if len(_CACHE) < _CACHE_LIMIT:
        _CACHE[name] = a
    return a
