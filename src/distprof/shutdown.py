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
  state changes, marks it so that the change finishes and then raises): no I/O, no locks, nothing
  that could deadlock against the code it interrupted (Python runs signal handlers between bytecodes of the main thread, which may
  hold any lock). The exception unwinds the training code like ``KeyboardInterrupt`` does (its
  ``finally`` blocks run, ``except Exception`` does not catch it); the export then happens in the
  ``atexit`` handler, in ordinary code. Last, the handler puts SIGTERM's default action back and
  sends the signal again, so the process ends killed by SIGTERM exactly as it would without
  distprof. A handler someone else installed (Ray's workers have one that calls ``sys.exit``) is
  left alone; when it exits the process, ``atexit`` runs as above.
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

__all__ = ["register", "unregister", "enter", "leave"]

_started: list[Any] = []  # profilers between start() and stop(), in start order
_lock = threading.Lock()
_MAIN = threading.main_thread().ident
_hooked = False  # atexit handler registered (once per process)
_sigterm_installed = False
_terminated_by: int | None = None  # the signal our handler turned into SystemExit
_critical = 0  # profiler state changes in progress (see enter / leave)
_pending: int | None = None  # a signal that came during one, to unwind with when it ends
_threads: dict[int, int] = {}  # id(profiler) -> the thread that started it


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
    _install_sigterm()


def unregister(profiler: Any) -> None:
    """Called when ``profiler`` stops (or is switched off by a fault)."""
    with _lock:
        if profiler in _started:
            _started.remove(profiler)
            _threads.pop(id(profiler), None)
        idle = not _started
    if idle:
        _restore_sigterm()  # nothing to write any more: SIGTERM is the default again (children, C calls)


def _on_sigterm(signum: int, frame: Any) -> None:
    # The whole body: remember the signal and unwind. Everything else happens in _at_exit.
    global _terminated_by, _pending
    _terminated_by = signum
    if _critical:
        # Inside a profiler's own state change (torch.profiler's step / stop / export are Python code): unwinding
        # from the middle of one leaves torch's profiler half-switched, and exporting it later crashes the
        # process. The change finishes first; leave() then unwinds.
        _pending = signum
        return
    raise SystemExit(128 + signum)


def enter() -> None:
    """A profiler state change begins (``Profiler._guard``): SIGTERM waits for its end. Only the main thread's
    count: the handler runs in the main thread, and a change in another thread must not hold the exit back."""
    global _critical
    if threading.get_ident() == _MAIN:
        _critical += 1


def leave() -> None:
    """The state change is done: unwind now if SIGTERM came during it."""
    global _critical, _pending
    if threading.get_ident() != _MAIN:
        return
    _critical -= 1
    if not _critical and _pending is not None:
        signum, _pending = _pending, None
        raise SystemExit(128 + signum)


def _after_fork_in_child() -> None:
    """A forked child (multiprocessing, DataLoader workers) holds none of the parent's profilers: it must not
    write their windows at its exit, and SIGTERM must end it the default way."""
    global _MAIN, _critical, _pending, _terminated_by
    _started.clear()
    _threads.clear()
    _MAIN = threading.get_ident()  # the forking thread is the child's only thread
    _critical, _pending, _terminated_by = 0, None, None
    _restore_sigterm()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _restore_sigterm() -> None:
    global _sigterm_installed
    if not _sigterm_installed or _terminated_by is not None or threading.get_ident() != _MAIN:
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _sigterm_installed = False
    except (ValueError, OSError):  # pragma: no cover
        pass


def _install_sigterm() -> None:
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_installed = True
    except (ValueError, OSError):  # pragma: no cover - embedded interpreters without signal support
        pass


def _at_exit() -> None:
    with _lock:
        pending = list(reversed(_started))  # nested profilers stop inner first
    # An uncaught exception or a signal interrupted the step in progress: keep what it recorded.
    crashed = _terminated_by is not None or getattr(sys, "last_value", None) is not None
    for prof in pending:
        if _threads.get(id(prof), _MAIN) != _MAIN:
            # torch's profiler must be stopped by the thread that started it: from here it crashes the process.
            logger.warning("distprof: %s was started in another thread and is still open at exit; its window is "
                           "not written (stop it in that thread)", prof._who())
            continue
        logger.warning("distprof: %s was still started when the process exited (by %s); writing its open window",
                       prof._who(), _cause(crashed))
        try:
            prof._finish(crashed=crashed, cause=_cause(crashed))
        except BaseException:  # on_error="raise" re-raises; at exit there is nobody left to raise to
            logger.error("distprof: %s could not write its window at exit", prof._who(), exc_info=True)
    if _terminated_by is not None:
        _die_by(_terminated_by)


def cause_of(exc_type: Any) -> str:
    """What ended a ``with`` block, as the manifest's ``stopped_by`` says it: ``stop`` (no exception), the
    signal's name (SIGTERM through our handler, SIGINT as KeyboardInterrupt), ``exit`` or ``exception``."""
    if exc_type is None:
        return "stop"
    if issubclass(exc_type, SystemExit):
        return signal.Signals(_terminated_by).name if _terminated_by is not None else "exit"
    if issubclass(exc_type, KeyboardInterrupt):
        return "SIGINT"
    return "exception"


def _cause(crashed: bool) -> str:
    if _terminated_by is not None:
        return signal.Signals(_terminated_by).name
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
