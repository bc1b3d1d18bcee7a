"""A window's files written beside training: the step that closes a window only ends torch's tracing.

The closing step used to write the window itself: torch's JSON writer, the gzip, the op summary, the rename into
the run directory and the manifest line, seconds to minutes of a step while every other rank waited in its next
collective. With ``torch.background_export`` (the default) the Profiler hands that work, as one call, to an
:class:`Exporter`: one thread per call, one call at a time per profiler.

- **Bounded memory**: a window's results are held until written; the next window waits for the previous one
  (:meth:`Exporter.wait` before it opens), so exports never pile up.
- **Nothing lost**: ``stop()``, the end of a ``with`` block and the ``atexit`` export (SIGTERM, ``sys.exit``, an
  exception: :mod:`.shutdown`) wait for it before anything else; the thread is not a daemon, so even a process
  whose profiler is never stopped ends after the file is written.
- **One fault path**: what the call raised is kept and raised again on the training thread, in the profiler's
  next step or stop (:meth:`Exporter.check`), where the fault guard logs it once and turns profiling off.
- **What it holds**: see ``TorchBackend._write``: torch's JSON writer holds the GIL while it runs, the gzip
  releases it, the op summary shares it. On a thread of the training process that only moved the export's cost
  into the next steps (measured: the other rank's stall 0.94-1.22x the inline export's), so the torch backend
  writes in a child forked for it (:func:`fork_child`, its own GIL; 0.16x), and the thread here only waits for
  the child and publishes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["Child", "ChildFailed", "Exporter", "fork_child"]


class Exporter:
    """Runs one window's writing at a time on a thread of its own (see the module)."""

    def __init__(self, who: str):
        self._who = who
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._lock = threading.Lock()  # summary() / windows_closed may wait from another thread (a Ray actor's)

    @property
    def busy(self) -> bool:
        """A window is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, write: Callable[[], None]) -> None:
        """Run ``write`` on a thread of its own, after the previous one has ended."""
        self.wait(check=False)

        def run() -> None:
            try:
                write()
            except BaseException as e:  # raised again on the training thread (check)
                self._failed = e

        t = threading.Thread(target=run, name=f"distprof-export {self._who}", daemon=False)
        try:
            t.start()
        except RuntimeError:  # no new thread (the interpreter is shutting down, a thread limit): write it here
            run()
            return
        with self._lock:
            self._thread = t

    def wait(self, check: bool = True) -> None:
        """Block until the window being written (if any) is written; then :meth:`check` unless ``check`` is false.
        Called on the training thread: from another one (a signal handler's unwinding is the main thread's) it
        only waits."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
            with self._lock:
                if self._thread is t:  # not one submitted meanwhile
                    self._thread = None
        if check:
            self.check()

    def check(self) -> None:
        """Raise what the last write raised, once."""
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed


class ChildFailed(RuntimeError):
    """The forked child did not return a result (it could not start, was killed, or crashed); ``pid``: the
    child's (None if none started), whose hidden temporaries it may have left."""

    def __init__(self, message: str, pid: int | None = None):
        super().__init__(message)
        self.pid = pid


class Child:
    """A child forked by :func:`fork_child`, writing; :meth:`result` waits for what it sends back."""

    def __init__(self, pid: int, fd: int):
        self.pid, self._fd = pid, fd

    def result(self) -> Any:
        """The child's result (JSON). What its call raised is raised here as ``OSError`` (the same export would
        fail here: a full disk); a child that ended without one (killed, crashed) raises :class:`ChildFailed`."""
        import json
        import os

        with os.fdopen(self._fd, "rb") as f:
            data = f.read()  # the GIL is released while this waits
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # the application reaps children itself (or ignores SIGCHLD): trust what came
            status = 0
        try:
            got = json.loads(data) if data else {}
        except ValueError:
            got = {}
        if "error" in got:
            raise OSError(f"in the export's child process: {got['error']}")
        code = os.waitstatus_to_exitcode(status)
        if code != 0 or "result" not in got:
            raise ChildFailed(f"the export's child process ended with status {code}", self.pid)
        return got["result"]


def fork_child(fn: Callable[[], Any]) -> Child:
    """Fork a child that runs ``fn()`` and sends its result (JSON) back through a pipe (:meth:`Child.result`).

    Why: what torch does to write a window holds the GIL (its JSON writer for all of its run, the op summary
    in turns), so on a thread of this process it still slows training. A forked child holds its own GIL, on
    another core, over a copy-on-write view of this process's memory: torch's results are read there, and this
    process may drop its own references at once (training code that swaps parameters, FSDP2's offload, needs
    them gone). The child runs only ``fn`` (no CUDA call: torch stopped tracing before), on the thread that
    forked it (the others do not exist there), touches none of the inherited profilers (no lock another thread
    may have held at the fork), ignores SIGINT and SIGTERM (:func:`_become_export_child`), and ends with
    ``os._exit``: no ``atexit``, no flushing of buffers this process owns. :class:`ChildFailed` if ``fork``
    is refused (out of memory, a process limit).
    """
    import json
    import os
    import signal
    import warnings

    from distprof.capture import shutdown

    try:
        r, w = os.pipe()
    except OSError as e:  # out of file descriptors
        raise ChildFailed(f"no pipe for the export's child ({e})") from None
    shutdown.export_fork.on = True  # the child's inherited profilers turn inert without a word
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns of fork in a process with threads: the child
            warnings.simplefilter("ignore", DeprecationWarning)  # runs only torch's writer, not their code
            pid = os.fork()
    except (OSError, RuntimeError) as e:  # out of memory, a process limit; Python 3.12+ at interpreter exit
        os.close(r)
        os.close(w)
        raise ChildFailed(f"fork failed ({e})") from None
    finally:
        shutdown.export_fork.on = False
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(r)
            _become_export_child(signal)
            try:
                out = {"result": fn()}
                code = 0
            except BaseException as e:
                out = {"error": f"{type(e).__name__}: {e}"[:2000]}
            data = json.dumps(out).encode()
            with os.fdopen(w, "wb") as f:
                f.write(data)
        finally:
            os._exit(code)
    os.close(w)
    return Child(pid, r)


def _become_export_child(signal: Any) -> None:
    """The export child's first acts: it outlives no signal meant for the job (SIGTERM to the process group, as
    torchrun and scancel send, and Ctrl-C: the training process waits for the child and publishes the window),
    runs none of the application's Python signal handlers (a requeue handler on SIGUSR1), dies with the
    training process (SIGKILL: nothing more to publish to), and is the first the kernel's OOM killer picks."""
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
