"""The native decoder's Python side (issue 24): a run of events (the JSON list ``reduce_run`` gets) reduced into
:class:`~distprof.trace.columns.Columns` by the Rust scanner in ``native/`` (loaded with ctypes), or ``None``
when the scanner is absent or not sure (then the Python path reads the run: it stays the fallback and the
oracle; both give the same columns, which tests/unit/trace/test_native_*.py check on every trace and on fuzzed
input).

Skeleton: :func:`reduce_native` always answers None until the scanner lands.
"""

from __future__ import annotations

from distprof.trace.columns import Columns

__all__ = ["available", "reduce_native", "use"]

_on = True


def available() -> bool:
    """Whether the native scanner is loaded (built, its ABI the one this module speaks, not switched off)."""
    return False


def use(on: bool) -> bool:
    """Switch the native path on or off in this process (tests read one file both ways); the previous setting."""
    global _on
    prev, _on = _on, bool(on)
    return prev


def reduce_native(data: bytes) -> Columns | None:
    """The run ``data`` (a JSON list of whole events) reduced natively: the same :class:`Columns` that
    ``Columns().add(decode_run(data))`` builds; None when the scanner is absent or not sure (the caller then
    takes the Python path, which also decides whether the run decodes at all)."""
    return None
