"""Process tools' options as the plan needs them (pure): nsys's capture range over the planned windows.

Used where a config is checked (a dialect's nsys options) and where the worker's command line is built
(:mod:`distprof.integrations.ray.runtime_env`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["nsys_capture_options"]


def nsys_capture_options(options: Mapping[str, Any], windows: int | None, whole_lifetime: bool) -> dict[str, Any]:
    """Options with the CUDA-profiler-API capture range injected when steps or a schedule choose windows.

    ``capture-range-end=repeat:N`` records every one of the N windows (the in-process profiler calls
    cudaProfilerStart/Stop at each window's edges) and finalizes when the worker exits. The
    ``*-shutdown`` variants would kill the worker, and ``stop`` records only the first window.
    """
    opts = dict(options)
    if whole_lifetime:
        return opts
    opts.setdefault("capture-range", "cudaProfilerApi")
    end = str(opts.get("capture-range-end", ""))
    if not end:
        opts["capture-range-end"] = f"repeat:{windows}" if windows else "repeat"
    elif end in ("stop", "stop-shutdown") and (windows is None or windows > 1):
        raise ValueError(
            f"nsys.options capture-range-end={end!r} records only the first of "
            f"{windows if windows else 'an unbounded number of'} windows; use 'repeat:{windows or ''}'".rstrip(":")
            + " or leave it unset"
        )
    elif end.startswith("repeat") and ":" in end and windows is not None:
        n = end.split(":", 1)[1]
        if n.isdigit() and int(n) < windows:
            raise ValueError(
                f"nsys.options capture-range-end={end!r} stops after {n} ranges but the plan has {windows} windows; "
                f"use 'repeat:{windows}' or leave it unset"
            )
    return opts
