"""The in-job watcher (``detect: true``): a process of its own, started by one rank, that runs
``distprof watch SAVE_PATH --quiet --parent-pid PID``.

Why a process and not a thread of rank 0: the watcher parses every rank's telemetry and runs the diagnosis on
the windows it asks for, which would take the training thread's GIL for seconds; in a process of its own it
costs rank 0 nothing but a core's share, and dying (a bug, the OOM killer) touches nothing of the job. It holds
no collective and no file of the job open. It is started by the profiler of the lowest rank that
``ranks`` selects (0 for ``all``), of every role that sets ``detect``; the watcher takes an exclusive lock on
``{save_path}/.watcher.lock``, so one job (several roles, several processes) has one watcher, and the others
exit at once. It ends with the process that started it (``--parent-pid``; the profiler's ``stop()`` asks it
to end after one last look).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["launches_here", "start", "stop"]


def launches_here(config: Any, rank: int) -> bool:
    """This rank starts the watcher: the lowest rank ``ranks`` selects (rank 0 for ``all`` and mesh selections)."""
    if not config.detect or not config.telemetry:
        return False
    ranks = config.ranks
    return rank == (min(ranks) if isinstance(ranks, list) and ranks else 0)


def start(save_path: str, who: str, config: Any = None) -> subprocess.Popen | None:
    """Start the watcher on ``save_path``; None (logged once) when it cannot be started: training goes on.
    ``config``: the job's ProfilerConfig, whose telemetry, trigger and detection settings the watcher is given
    (a job that only detects, without ``enable`` or ``trigger``, writes no run.json to read them from)."""
    cmd = [sys.executable, "-m", "distprof.cli", "watch", save_path, "--quiet", "--parent-pid", str(os.getpid())]
    if config is not None:
        cmd += ["--job-config", json.dumps({"telemetry": bool(config.telemetry), "trigger": bool(config.trigger),
                                            "trigger_poll_s": config.trigger_poll_s,
                                            "detection": config.detection.model_dump(mode="json")})]
    # SIGTERM blocked in the child until its handler is in place (cli_watch._Term unblocks it; the mask is
    # inherited through exec): a stop() soon after start() still gets its last look instead of killing the
    # watcher while it imports. Only this thread's mask, for the time of the spawn.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    except OSError as e:
        logger.warning("distprof: %s could not start the watcher (%s); telemetry is still written, and "
                       "`distprof watch %s` can run beside the job", who, e, save_path)
        return None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    logger.info("distprof: %s started the watcher (pid %d) on %s", who, proc.pid, save_path)
    return proc


def stop(proc: subprocess.Popen | None) -> None:
    """Ask the watcher to take one last look and end (it is not waited for: the job never waits on it)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
    except OSError:
        pass
