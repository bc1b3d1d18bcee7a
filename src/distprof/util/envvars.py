"""The environment variables that are distprof's own, in one place.

Every ``DISTPROF_<FIELD>`` variable is a config setting (see ``config.env_overrides``); the names here share the
prefix but are not settings. A config refuses an unknown ``DISTPROF_*`` variable as a likely typo, so each
variable distprof itself sets or reads must be listed here, or a process distprof started would refuse its own
environment.
"""

import logging
import os

from distprof.util.logs import WHERE_LOGGER

PREFIX = "DISTPROF_"

# Set by ``distprof.capture.wrap`` in a worker it runs under a profiling tool: "<backend>:<wrapper pid>".
WRAPPED_BY = "DISTPROF_WRAPPED_BY"
# The level of distprof's own loggers ("DEBUG", "INFO", "WARNING", "ERROR" or a number), in every process that
# builds a Profiler or runs the CLI: the one knob that reaches Ray workers and torchrun children without code.
LOG_LEVEL = "DISTPROF_LOG_LEVEL"
# Seconds one object-store request may wait for an answer (rundir/netfs.py): profiler and CLI alike.
STORE_TIMEOUT = "DISTPROF_STORE_TIMEOUT_S"
# The native decoder (trace/nativelib.py): "0" switches it off in this process; NATIVE_LIB loads that library file
# instead of the one the install built (tests and benchmarks build the crate into a temporary folder).
NATIVE = "DISTPROF_NATIVE"
NATIVE_LIB = "DISTPROF_NATIVE_LIB"

NOT_SETTINGS = frozenset({WRAPPED_BY, LOG_LEVEL, STORE_TIMEOUT, NATIVE, NATIVE_LIB})

_applied: list[str | None] = []


def apply_log_level() -> None:
    """Set the ``distprof`` logger's level from ``DISTPROF_LOG_LEVEL`` (once per value; a bad value warns once).

    Unset, the one line saying where a process's traces go (``distprof.where``, see :mod:`distprof.util.logs`) is
    at INFO, shown; set, that line follows the variable like every other. Handlers: :mod:`distprof.util.logs`.
    """
    value = os.environ.get(LOG_LEVEL)
    if _applied and _applied[-1] == value:
        return
    _applied.append(value)
    where = logging.getLogger(WHERE_LOGGER)
    where.setLevel(logging.INFO)
    if not value:
        return
    text = value.strip().upper()
    level = int(text) if text.isdigit() else logging.getLevelName(text)
    if not isinstance(level, int):
        logging.getLogger("distprof").warning(
            "distprof: %s=%r is not a log level; use DEBUG, INFO, WARNING or ERROR", LOG_LEVEL, value[:40])
        return
    logging.getLogger("distprof").setLevel(level)
    where.setLevel(logging.NOTSET)
