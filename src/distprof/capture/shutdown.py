"""Crash-safe capture: a started profiler publishes its open window however the process leaves.

A ``Profiler`` registers here when it starts and leaves when it stops. What happens on each way out:

- ``with prof:`` left by an exception: ``__exit__`` stops the profiler (nothing here is needed).
- Return from the script, ``sys.exit(n)``, or an uncaught exception with ``start()`` / ``stop()`` or a
  trainer callback that never got its "train end": Python runs ``atexit`` handlers before it tears
  the interpreter down. Ours stops every profiler still started, so the open window is written and
  listed in the manifest with ``complete: false``. Stopping before teardown also avoids the
  segmentation fault torch's profiler causes when it is still tracing while the interpreter
  finalizes. The exit status stays the process's own.
- ``SIGTERM`` (a scheduler's preemption, torchrun tearing the other ranks down, ``kill``): its
  default action ends the process on the spot, running nothing. When SIGTERM still has its
  default action as the first profiler starts (in the main thread), distprof installs a handler
  whose body only raises ``SystemExit`` (or, when the signal lands inside one of the profiler's own
  state changes, remembers it: see below): no I/O, no locks, nothing
  that could deadlock against the code it interrupted (Python runs signal handlers between bytecodes of the main
  thread, which may hold any lock). The exception unwinds the training code like ``KeyboardInterrupt`` does (its
  ``finally`` blocks run, ``except Exception`` does not catch it); the export then happens in the
  ``atexit`` handler, in ordinary code. Last, the handler puts SIGTERM's default action back and
  sends the signal again, so the process ends killed by SIGTERM exactly as it would without
  distprof. A handler someone else installed (Ray's workers have one that calls ``sys.exit``) is
  left alone; when it exits the process, ``atexit`` runs as above.
- ``SIGINT`` (Ctrl-C): while Python's own handler is in place, distprof's raises ``KeyboardInterrupt``
  as Python's does, except inside a profiler's state change (below).
- A signal during a profiler's own state change (its step, or writing a window: ``stop()``, a window's
  end, the ``atexit`` export): unwinding from the middle of torch's profiler leaves it half-switched,
  and a window cut off mid-export is lost. So SIGTERM and SIGINT are remembered and the change
  finishes: the window and its manifest line are written (a window cut short records the signal as its
  ``stopped_by``), one warning says so, and then the process stops as the signal asked: SIGTERM unwinds
  with ``SystemExit`` and ends killed by SIGTERM, SIGINT raises ``KeyboardInterrupt`` (at exit: the
  process ends killed by SIGINT). The handlers stay in place until that export is done. A second
  signal during the same export does not cut it short (torch's writer is C code no signal handler can
  interrupt anyway, and the window would be lost); it is counted in the warning. SIGKILL (or Ctrl-\\,
  SIGQUIT) ends the process at once, losing the window.
- A forked child (a raw ``os.fork()`` inside ``with prof:``, multiprocessing, DataLoader workers) holds
  none of the parent's windows: every profiler the parent had started turns inert in the child (one
  INFO line), so the child never writes into the parent's rank folder, and SIGTERM / SIGINT have
  their default actions there.
- ``SIGKILL``, ``os._exit``, a hard crash, or a main thread blocked forever inside a C call (a
  collective waiting for a dead peer until its timeout): nothing can run; the steps of the open
  window are lost and ``distprof check`` names the missing window.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["enter", "leave", "register", "unregister"]

_started: list[Any] = []  # profilers between start() and stop(), in start order
_lock = threading.Lock()
_MAIN = threading.main_thread().ident
_hooked = False  # atexit handler registered (once per process)
_installed: set[int] = set()  # the signals whose handler is ours (_on_signal)
_terminated_by: int | None = None  # the SIGTERM our handler turned into SystemExit (or holds)
_critical = 0  # profiler state changes in progress (see enter / leave)
_busy: tuple[Any, str, int] | None = None  # (profiler, what it does, its windows_closed) of the outermost change
_pending: int | None = None  # the first signal that came during one, to stop for when it ends
_extra = 0  # further signals that came while one was pending (counted in the warning)
_exiting = False  # in _at_exit: signals are held until every open window is written
_threads: dict[int, int] = {}  # id(profiler) -> the thread that started it
# The handler each signal must have for distprof to install its own: the default action, Python's own Ctrl-C.
_DEFAULTS: dict[int, Any] = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}


def register(profiler: Any) -> None:
    """Called by ``Profiler.start()``: stop ``profiler`` on the way out if nobody else does."""
    global _hooked
    with _lock:
        if profiler not in _started:
            _started.append(profiler)
            _threads[id(profiler)] = threading.get_ident()
        first = not _hooked
        _hooked = True
    if first:
        atexit.register(_at_exit)
    _install()


def unregister(profiler: Any) -> None:
    """Called when ``profiler`` has stopped (its last window written) or is switched off by a fault."""
    with _lock:
        if profiler in _started:
            _started.remove(profiler)
            _threads.pop(id(profiler), None)
        idle = not _started
    if idle and not _critical and not _exiting:
        _restore()  # nothing to write any more: the signals' own handlers again (children, C calls)


def _on_signal(signum: int, frame: Any) -> None:
    # The whole body: remember the signal and unwind (or hold it). Everything else happens in leave / _at_exit.
    global _terminated_by, _pending, _extra
    if signum == signal.SIGTERM and _terminated_by is None:
        _terminated_by = signum
    if _critical or _exiting:
        # Inside a profiler's own state change (torch.profiler's step / stop / export are Python code): unwinding
        # from the middle of one leaves torch's profiler half-switched (exporting it later crashes the process),
        # and a window cut off mid-export is lost. The change finishes first; leave() (or _at_exit) then stops.
        if _pending is None:
            _pending = signum
        else:
            _extra += 1
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def enter(profiler: Any = None, what: str = "") -> None:
    """A profiler state change begins (``Profiler._guard``; ``what``: ``step``, ``stop``, ...): SIGTERM and SIGINT
    wait for its end. Only the main thread's count: the handler runs in the main thread, and a change in another
    thread must not hold the exit back."""
    global _critical, _busy
    if threading.get_ident() == _MAIN:
        if not _critical:
            _busy = (profiler, what, getattr(profiler, "_windows_closed", 0))
        _critical += 1


def leave() -> None:
    """The state change is done: stop now, as the signal asks, if one came during it."""
    global _critical, _pending, _extra
    if threading.get_ident() != _MAIN:
        return
    _critical -= 1
    if _critical or _exiting:
        return
    if _pending is None:
        if _installed and not _started:
            _restore()  # the last profiler was switched off during this change (a fault)
        return
    signum, _pending = _pending, None
    extra, _extra = _extra, 0
    prof, what, before = _busy or (None, "", 0)
    who = prof._who() if prof is not None else "distprof"
    logger.warning("distprof: %s: %s came during its %s; it waited until %s, and the process now stops for %s%s",
                   who, _name(signum), what or "work", _outcome(prof, before), _name(signum), _also(extra))
    if not _started:
        _restore()  # the last profiler stopped during this change: Ctrl-C is Python's again
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _outcome(prof: Any, before: int) -> str:
    n = getattr(prof, "_windows_closed", 0) - before
    if n > 0:
        return "its window was written" if n == 1 else f"its {n} windows were written"
    return "that finished (no window was being written)"


def _also(extra: int) -> str:
    return f" ({extra} more signal{'s' if extra > 1 else ''} came meanwhile and did not cut it short)" if extra else ""


def _name(signum: int) -> str:
    return signal.Signals(signum).name


def held(cause: str | None) -> str | None:
    """``stopped_by`` for a window cut short (``cause``) whose export a signal interrupted: the signal's name,
    since it is what ends the process. A window that ran to its end (``None``) stays complete."""
    return cause if cause is None or _pending is None else _name(_pending)


def _after_fork_in_child() -> None:
    """A forked child (a raw ``os.fork()``, multiprocessing, DataLoader workers) holds none of the parent's
    profilers: they turn inert here, so the child never writes their windows (into the parent's rank folders),
    and SIGTERM / SIGINT end it the default way."""
    global _MAIN, _critical, _pending, _terminated_by, _busy, _extra, _exiting
    if getattr(export_fork, "on", False):
        return  # distprof's own export child: it runs the writer and os._exit, never the application's code
    forked = list(_started)
    _started.clear()
    _threads.clear()
    _MAIN = threading.get_ident()  # the forking thread is the child's only thread
    _critical, _pending, _terminated_by, _busy, _extra, _exiting = 0, None, None, None, 0, False
    _restore()
    for prof in forked:
        try:
            prof._forked()
        except Exception:  # pragma: no cover - never let the child's start fail over the profiler
            logger.debug("distprof: switching off an inherited profiler failed", exc_info=True)
    if forked and not getattr(export_fork, "on", False):
        logger.info("distprof: forked child pid %d inherited %s from pid %d; it writes none of their windows "
                    "(the parent does)", os.getpid(), ", ".join(p._who() for p in forked), os.getppid())


# Set (on its thread) while distprof forks a child to write a window (exporter.run_forked): that child is
# distprof's own, and says nothing about the profilers it inherits.
export_fork = threading.local()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _restore() -> None:
    """Give every signal whose handler is ours its own handler back (not SIGTERM once it is ending the process)."""
    if threading.get_ident() != _MAIN:
        return
    for signum in list(_installed):
        if signum == _terminated_by:
            continue  # _die_by resets it
        try:
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, _DEFAULTS[signum])
            _installed.discard(signum)
        except (ValueError, OSError):  # pragma: no cover
            pass


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    for signum, default in _DEFAULTS.items():
        if signum in _installed:
            continue
        try:
            if signal.getsignal(signum) is default:
                signal.signal(signum, _on_signal)
                _installed.add(signum)
        except (ValueError, OSError):  # pragma: no cover - embedded interpreters without signal support
            pass


def _at_exit() -> None:
    global _exiting
    _exiting = True  # from here a signal is held until every open window is written, then ends the process
    with _lock:
        pending = list(reversed(_started))  # nested profilers stop inner first
    # An uncaught exception or a signal interrupted the step in progress: keep what it recorded.
    crashed = _terminated_by is not None or getattr(sys, "last_value", None) is not None
    written = 0
    for prof in pending:
        if _threads.get(id(prof), _MAIN) != _MAIN:
            # torch's profiler must be stopped by the thread that started it: from here it crashes the process.
            logger.warning("distprof: %s was started in another thread and is still open at exit; its window is "
                           "not written (stop it in that thread)", prof._who())
            continue
        logger.warning("distprof: %s was still started when the process exited (by %s); writing its open window",
                       prof._who(), _cause(crashed))
        before = prof.windows_closed
        try:
            prof._finish(crashed=crashed, cause=_cause(crashed))
        except BaseException:  # on_error="raise" re-raises; at exit there is nobody left to raise to
            logger.error("distprof: %s could not write its window at exit", prof._who(), exc_info=True)
        written += prof.windows_closed - before
    if _pending is not None:
        what = ("its window was written" if written == 1 else f"{written} windows were written" if written
                else "no window was written (see above)")
        logger.warning("distprof: %s came while distprof wrote the open windows at exit; it waited until %s, and "
                       "the process now ends by %s%s", _name(_pending), what, _name(_terminated_by or _pending),
                       _also(_extra))
    stop_by = _terminated_by if _terminated_by is not None else _pending
    if stop_by is not None:
        _die_by(stop_by)
    _exiting = False
    _restore()


def cause_of(exc_type: Any) -> str:
    """What ended a ``with`` block, as the manifest's ``stopped_by`` says it: ``stop`` (no exception), the
    signal's name (SIGTERM through our handler, SIGINT as KeyboardInterrupt), ``exit`` or ``exception``."""
    if exc_type is None:
        return "stop"
    if issubclass(exc_type, SystemExit):
        return _name(_terminated_by) if _terminated_by is not None else "exit"
    if issubclass(exc_type, KeyboardInterrupt):
        return "SIGINT"
    return "exception"


def _cause(crashed: bool) -> str:
    if _terminated_by is not None:
        return _name(_terminated_by)
    if isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
        return "SIGINT"
    return "exception" if crashed else "exit"


def _die_by(signum: int) -> None:
    """End the process by ``signum`` with its default action, as it would have ended without us."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
