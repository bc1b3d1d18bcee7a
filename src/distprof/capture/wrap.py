"""``python -m distprof.capture.wrap SPEC default_worker.py ARGS``: run a Ray worker under a profiling tool.

Ray starts wrapped workers through this module (see ``capture/backends/process.py``); ``distprof wrap`` runs a
torchrun / srun / plain rank through the same loop (:func:`wrap_process` with ``pass_signals``, from
``capture/wrapjob.py``).
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
from collections.abc import Callable

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
# ``distprof wrap`` (pass_signals): the signals it receives (torchrun's or SLURM's SIGTERM, a SIGINT) reach the app
# as they are, so it ends as it would unwrapped and the tool writes as at any exit of its app; and the status it
# ends with is the app's. memray's app is the tool process itself. py-spy exits 0 whatever its app did, so here it
# attaches (``--pid``) to the app this process starts and waits for. nsys and rocprof-sys end their app themselves
# once told to write (FINALIZE_SIGNAL), and report its status.
APP_IS_TOOL = ("memray",)
ATTACHES = ("py_spy",)
PR_SET_PDEATHSIG, PR_SET_PTRACER, PR_SET_PTRACER_ANY = 1, 0x59616D61, -1  # <linux/prctl.h>
FINALIZER_WAIT_S = 10.0  # distprof wrap: the detached finalizer's time to see the tool gone (then it goes on alone)
TOOL_EXIT_WAIT_S = 60.0  # after an attached app ended: the tool's time to write (then a kick; the finalizer stays)


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
    """The Ray worker's wrapper: the tool's exit code (128 + N for a tool killed by signal N)."""
    rc = wrap_process(spec, worker_args)
    return rc if rc >= 0 else 128 - rc


def wrap_process(spec: WrapSpec, worker_args: list[str], pass_signals: bool = False) -> int:
    """Run ``spec.python + worker_args`` under the tool; return how it ended as ``Popen.returncode`` (-N: killed
    by signal N). With ``pass_signals`` (``distprof wrap``) the app gets the signals this process gets, as they
    are, its status is returned (:data:`APP_IS_TOOL`, :data:`ATTACHES`), and a SIGKILL to this process ends the
    app too (the tool: by its FINALIZE_SIGNAL, so it writes). A tool that cannot start: the app runs unwrapped
    (this process becomes it: exec, or waits for it where it was started already)."""
    pid = os.getpid()
    os.makedirs(spec.out_dir, exist_ok=True)
    app_env = {**os.environ, **spec.env, WRAPPED_BY: f"{spec.backend}:{pid}"}  # known to config (envvars)
    app = None
    if pass_signals and spec.backend in ATTACHES:  # (a CMD that cannot be run raises here: nothing was started)
        app = subprocess.Popen([*spec.python, *worker_args], env=app_env, start_new_session=True,
                               preexec_fn=_app_setup())
    argv, extra_env = tool_command(spec, pid, worker_args, attach_pid=app.pid if app is not None else None)
    env = {**os.environ, **extra_env, WRAPPED_BY: f"{spec.backend}:{pid}"}
    try:
        child = subprocess.Popen(argv, env=env, start_new_session=True,
                                 preexec_fn=_tool_setup(spec.backend) if pass_signals and app is None else None)
    except OSError as e:
        logger.error("distprof.capture.wrap: cannot start %s (%s); running the worker without it", argv[0], e)
        if app is not None:
            return _wait_passing_signals(app)
        os.execvpe(spec.python[0], [*spec.python, *worker_args], {**os.environ, **spec.env})
    finalizer = subprocess.Popen([sys.executable, "-m", "distprof.capture.wrap", "--finalize", spec.out_dir, str(pid),
                                  str(child.pid), str(int(KICK_SIGNAL.get(spec.backend, 0)))],
                                 start_new_session=True, stdin=subprocess.DEVNULL)
    # The marker exists from now on (the finalizer needs a moment to start); the finalizer removes it.
    touch(_marker(spec.out_dir, finalizer.pid))  # never through a link planted at its (predictable) name
    if app is not None:
        rc = _wait_passing_signals(app)
        _tool_done(child, argv[0], KICK_SIGNAL.get(spec.backend))
    else:
        def forward(signum, _frame):
            if pass_signals and spec.backend in APP_IS_TOOL:
                sig = signum
            else:
                sig = FINALIZE_SIGNAL[spec.backend]
                # A tool signalled before it installs its handler dies without writing: give it a moment.
                wait_for_handler(child.pid, sig, timeout_s=10.0)
            try:
                child.send_signal(sig)
            except ProcessLookupError:
                pass

        for s in PASSED_SIGNALS:
            signal.signal(s, forward)
        rc = _wait(child)
    if not finalize_outputs(spec.out_dir, pid):
        # Goes to the worker's log (Ray: the worker's .err file): the one place this can be seen.
        logger.error("distprof.capture.wrap: %s exited with code %s and wrote no output in %s", argv[0],
                     child.returncode, spec.out_dir)
    if pass_signals:  # the rank ends once its output is published: a check run right after finds it settled
        try:
            finalizer.wait(timeout=FINALIZER_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    return rc


PASSED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _wait_passing_signals(app: subprocess.Popen) -> int:
    """Wait for the app this process started, passing it the signals this process gets."""
    def forward(signum, _frame):
        try:
            app.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in PASSED_SIGNALS:
        signal.signal(s, forward)
    return _wait(app)


def _tool_done(tool: subprocess.Popen, name: str, kick: int | None) -> None:
    """An attached tool writes once its app is gone: wait for it (bounded), kicking it once if it hangs (py-spy may).
    What is still unwritten then is the detached finalizer's to publish."""
    for sig in (kick, None):
        try:
            tool.wait(timeout=TOOL_EXIT_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            if sig is None:
                return
            logger.warning("distprof.capture.wrap: %s still runs %.0f s after its app ended; sending it %s",
                           name, TOOL_EXIT_WAIT_S, signal.Signals(sig).name)
            tool.send_signal(sig)


def _prctl_setup(*calls: tuple[int, int]) -> Callable[[], None]:
    """A ``preexec_fn`` making these prctl(2) calls in the child before exec; libc is loaded here, in the parent
    (nothing is imported between fork and exec). Where prctl fails (a kernel without Yama) nothing changes."""
    import ctypes  # here: only a rank distprof wrap wraps pays for it

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return lambda: None
    args = [(option, ctypes.c_ulong(arg % (1 << 64))) for option, arg in calls]

    def setup() -> None:
        for option, arg in args:
            prctl(option, arg, 0, 0, 0)
    return setup


def _app_setup() -> Callable[[], None]:
    """For the app: it dies with this process (as the rank would), and any process of its user may attach to it
    (Yama's ptrace_scope 1 allows only ancestors; the tool is a sibling)."""
    return _prctl_setup((PR_SET_PDEATHSIG, signal.SIGKILL), (PR_SET_PTRACER, PR_SET_PTRACER_ANY))


def _tool_setup(backend: str) -> Callable[[], None]:
    """For the tool: told to write (and to end its app) when this process dies."""
    return _prctl_setup((PR_SET_PDEATHSIG, FINALIZE_SIGNAL[backend]))


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


def exit_like(status: int) -> int:
    """End this process as the app ended: its exit code, or killed by the same signal (a shell then reports
    128 + N, torchrun names the signal). Returns 128 + N where the signal does not end this process."""
    if status >= 0:
        return status
    sig = -status
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig


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
