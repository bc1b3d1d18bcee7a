"""``python -m distprof.wrap SPEC default_worker.py ARGS``: run a Ray worker under a profiling tool.

Ray starts wrapped workers through this module (see ``backends/process.py``).
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

from .backends.process import WrapSpec, finalize_outputs, tool_command

logger = logging.getLogger("distprof.wrap")

# The signal that makes each tool stop and write its output.
FINALIZE_SIGNAL = {"py_spy": signal.SIGINT, "nsys": signal.SIGINT, "rocprof_sys": signal.SIGINT, "memray": signal.SIGTERM}


def run(spec: WrapSpec, worker_args: list[str]) -> int:
    pid = os.getpid()
    os.makedirs(spec.out_dir, exist_ok=True)
    argv, extra_env = tool_command(spec, pid, worker_args)
    env = {**os.environ, **extra_env, "DISTPROF_WRAPPED_BY": f"{spec.backend}:{pid}"}
    try:
        child = subprocess.Popen(argv, env=env)
    except OSError as e:
        logger.error("distprof.wrap: cannot start %s (%s); running the worker without it", argv[0], e)
        os.execvpe(spec.python[0], [*spec.python, *worker_args], {**os.environ, **spec.env})

    def forward(signum, _frame):
        sig = FINALIZE_SIGNAL[spec.backend]
        # A tool signalled before it installs its handler dies without writing: give it a moment.
        _wait_for_handler(child.pid, sig, timeout_s=10.0)
        try:
            child.send_signal(sig)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    rc = _wait(child)
    finalize_outputs(spec.out_dir, pid)
    return rc if rc >= 0 else 128 - rc


def _handles(pid: int, sig: int) -> bool | None:
    """Does process ``pid`` catch ``sig``? None when /proc cannot tell (not Linux, or gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except OSError:
        return None
    return None


def _wait_for_handler(pid: int, sig: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _handles(pid, sig) is False and time.monotonic() < deadline:
        time.sleep(0.01)  # another process's state: nothing to block on


def _wait(child: subprocess.Popen) -> int:
    while True:
        try:
            return child.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us; kept for clarity
            continue


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python -m distprof.wrap SPEC default_worker.py ARGS\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return run(WrapSpec.decode(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main())
