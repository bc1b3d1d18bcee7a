"""distprof's own log lines in the processes that build a Profiler (the CLI renders its own).

Training processes rarely configure logging (torchrun children, Ray workers, HF and Lightning jobs), and Python
then prints nothing below WARNING. Two rules, one place:

- A process that builds a Profiler and has no logging of its own (no handler on the root logger or on
  ``distprof``) gets one handler on the ``distprof`` logger, once, writing to stderr, each line prefixed
  ``[distprof ROLE rank R]``; ``DISTPROF_LOG_LEVEL`` (``envvars.apply_log_level``) sets the level, WARNING
  (Python's default) without it, so unasked it shows what Python would have shown anyway, prefixed. Where the
  application configured logging, distprof's records reach its handlers (they propagate) in its format, and no
  handler is added: each would print twice. Ours stands aside when the application configures root handlers
  later.
- Where the traces go: the first window a process writes is announced once, at INFO on ``distprof.where``,
  whose level is INFO while ``DISTPROF_LOG_LEVEL`` is unset (so it shows by default, like Lightning's profiler
  summary, and nothing else does) and follows the variable otherwise (``WARNING`` or ``ERROR`` quiet it). The
  same handler is attached when nothing else would print it.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["WHERE_LOGGER", "announce_where", "process_is"]

WHERE_LOGGER = "distprof.where"


class _Who:
    """Who this process is in the prefix: the roles of its Profilers, and its rank."""

    def __init__(self) -> None:
        self.roles: list[str] = []
        self.rank: int | None = None


_who = _Who()
_announced: list[int] = []  # the pid that said where its traces go (a forked child says it again)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if text.startswith("distprof: "):
            text = text[len("distprof: "):]
        roles, rank = _who.roles, _who.rank
        if len(roles) == 1:  # the prefix names the profiler already
            own = f"profiler {roles[0]!r} rank {rank}"
            if text.startswith(own):
                text = text[len(own):].lstrip(":").lstrip()
        label = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        who = f"{','.join(roles) or 'process'} rank {'?' if rank is None else rank}"
        return f"[distprof {who}] {label}{text}"


class _Handler(logging.StreamHandler):
    """stderr as it is when a line is written (not when the handler was made)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_Format("%(message)s"))
        self.addFilter(lambda record: not logging.getLogger().handlers)  # the application took over: it prints

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _attach() -> None:
    """Our handler on ``distprof``, unless this process already prints distprof's records somewhere."""
    log = logging.getLogger("distprof")
    if log.handlers or logging.getLogger().handlers:
        return
    log.addHandler(_Handler())


def process_is(role: str, rank: int) -> None:
    """A Profiler for ``role`` on ``rank`` was built in this process: name it in the prefix, attach the handler."""
    if role not in _who.roles:
        _who.roles.append(role)
    if _who.rank is None:
        _who.rank = rank
    _attach()


def announce_where(who: str, folder: str, run: str) -> None:
    """Once per process: where this process's traces go, and how to read them."""
    if _announced and _announced[0] == os.getpid():
        return
    _announced[:] = [os.getpid()]
    log = logging.getLogger(WHERE_LOGGER)
    if log.isEnabledFor(logging.INFO):
        _attach()
        log.info("distprof: %s: traces go to %s; read the run with: distprof diagnose %s", who, folder, run)
