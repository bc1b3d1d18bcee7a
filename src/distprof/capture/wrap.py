"""``python -m distprof.capture.wrap SPEC default_worker.py ARGS``: run a Ray worker under a profiling tool.

Ray starts wrapped workers through this module (see ``capture/backends/process.py``).
It runs the tool with the worker as its child, forwards termination signals
in the form each tool needs to write its output (py-spy and nsys write on
SIGINT, not SIGTERM), waits for the tool to finish writing after the worker is
gone, then renames the tool's hidden output to its final
name. If the tool cannot start, the worker runs unwrapped: profiling is lost,
training is not.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from distprof.capture.backends.process import WrapSpec, tool_command
from distprof.rundir.layout import temp_name
from distprof.rundir.safefile import replace, touch
from distprof.util.envvars import WRAPPED_BY
from distprof.util.procfs import alive, first_child, wait_for_handler

logger = logging.getLogger("distprof.capture.wrap")

# The signal that makes each tool stop and write its output.
FINALIZE_SIGNAL = {"py_spy": signal.SIGINT, "nsys": signal.SIGINT, "rocprof_sys": signal.SIGINT,
                   "memray": signal.SIGTERM}
# Tools that may hang once their child (the worker) is SIGKILLed, and the signal that makes them write.
# py-spy 0.4 neither writes nor exits then (seen here). memray is the worker itself; nsys and
# rocprof-sys launch the app through their own helpers, so they are left to finish by themselves.
KICK_SIGNAL = {"py_spy": signal.SIGINT}


FINALIZER_SUFFIX = "-finalizer"  # marker `.tmp-{finalizer pid}-finalizer`: an output is still to come


def finalize_outputs(out_dir: str, pid: int) -> list[str]:
    """Rename the tool's hidden outputs for this pid to their final names; return the final names.

    Safe to run twice at once (the wrapper and its finalizer may race): a name already moved is skipped.
    """
    prefix = temp_name(pid, "")
    done: list[str] = []
    try:
        names = os.listdir(out_dir)
    except FileNotFoundError:
        return done
    for name in names:
        if name.startswith(prefix) and not name.endswith(FINALIZER_SUFFIX):
            final = name[len(prefix):]
            try:
                replace(os.path.join(out_dir, name), os.path.join(out_dir, final))
            except FileNotFoundError:
                continue
            done.append(final)
    return done


def run(spec: WrapSpec, worker_args: list[str]) -> int:
    pid = os.getpid()
    os.makedirs(spec.out_dir, exist_ok=True)
    argv, extra_env = tool_command(spec, pid, worker_args)
    env = {**os.environ, **extra_env, WRAPPED_BY: f"{spec.backend}:{pid}"}  # known to config (envvars)
    try:
        child = subprocess.Popen(argv, env=env, start_new_session=True)
    except OSError as e:
        logger.error("distprof.capture.wrap: cannot start %s (%s); running the worker without it", argv[0], e)
        os.execvpe(spec.python[0], [*spec.python, *worker_args], {**os.environ, **spec.env})
    finalizer = subprocess.Popen([sys.executable, "-m", "distprof.capture.wrap", "--finalize", spec.out_dir, str(pid),
                                  str(child.pid), str(int(KICK_SIGNAL.get(spec.backend, 0)))],
                                 start_new_session=True, stdin=subprocess.DEVNULL)
    # The marker exists from now on (the finalizer needs a moment to start); the finalizer removes it.
    touch(_marker(spec.out_dir, finalizer.pid))  # never through a link planted at its (predictable) name

    def forward(signum, _frame):
        sig = FINALIZE_SIGNAL[spec.backend]
        # A tool signalled before it installs its handler dies without writing: give it a moment.
        wait_for_handler(child.pid, sig, timeout_s=10.0)
        try:
            child.send_signal(sig)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    rc = _wait(child)
    if not finalize_outputs(spec.out_dir, pid):
        # Goes to the worker's log (Ray: the worker's .err file): the one place this can be seen.
        logger.error("distprof.capture.wrap: %s exited with code %s and wrote no output in %s", argv[0], rc,
                     spec.out_dir)
    return rc if rc >= 0 else 128 - rc


def finalize_later(out_dir: str, wrapper_pid: int, tool_pid: int, finalize_signal: int) -> int:
    """The detached finalizer: wait for the tool to exit, then rename its outputs.

    A tool whose child (the worker) was SIGKILLed may never notice: py-spy 0.4 then neither writes nor
    exits. So for such tools (``finalize_signal`` non-zero), once the worker is gone and the tool still
    runs, the tool gets that signal.
    """
    marker = _marker(out_dir, os.getpid())
    touch(marker)
    try:
        worker = None
        signalled = not finalize_signal  # nothing to send: just wait
        while alive(tool_pid):
            if worker is None and not signalled:
                worker = first_child(tool_pid)
            if not signalled and worker is not None and not alive(worker):
                signalled = True
                wait_for_handler(tool_pid, finalize_signal, timeout_s=10.0)
                try:
                    os.kill(tool_pid, finalize_signal)
                except ProcessLookupError:
                    break
            time.sleep(0.05)  # the tool is not our child: there is nothing to block on
        finalize_outputs(out_dir, wrapper_pid)
    finally:
        os.unlink(marker)
    return 0


def _marker(out_dir: str, finalizer_pid: int) -> str:
    return os.path.join(out_dir, temp_name(finalizer_pid, FINALIZER_SUFFIX.lstrip("-")))


def _wait(child: subprocess.Popen) -> int:
    while True:
        try:
            return child.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us; kept for clarity
            continue


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python -m distprof.capture.wrap SPEC default_worker.py ARGS\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if argv[0] == "--finalize":
        return finalize_later(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    return run(WrapSpec.decode(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main())
