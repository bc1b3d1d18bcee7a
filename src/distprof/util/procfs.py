"""What Linux's /proc says about other processes: alive, parent, first child, caught signals.

Used by the process wrapper (``capture/wrap.py``) to drive a profiling tool it does not own, and by ``collect``
and the demo to wait for processes that are not their children. Each function answers None (or a safe
default) where /proc cannot tell: another OS, or the process is gone.
"""

from __future__ import annotations

import os
import time

__all__ = ["alive", "first_child", "handles_signal", "parent_pid", "wait_for_handler"]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...); None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent_pid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def alive(pid: int) -> bool:
    """Is process ``pid`` running (a zombie has exited and writes nothing more)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    return fields is None or fields[0] != "Z"


def first_child(pid: int) -> int | None:
    """A child of ``pid``: any of its threads may have started it (py-spy spawns from a worker thread)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
    except (OSError, ValueError):
        return None
    return None


def handles_signal(pid: int, sig: int) -> bool | None:
    """Does process ``pid`` catch ``sig``? None when /proc cannot tell (not Linux, or gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except OSError:
        return None
    return None


def wait_for_handler(pid: int, sig: int, timeout_s: float) -> None:
    """Wait (bounded) until ``pid`` has installed a handler for ``sig``: a tool signalled before that dies
    without writing its output."""
    deadline = time.monotonic() + timeout_s
    while handles_signal(pid, sig) is False and time.monotonic() < deadline:
        time.sleep(0.01)  # another process's state: nothing to block on
