"""Rollout engines (vLLM, SGLang): their own profilers, driven at the planned global steps (capture side).

``distprof.capture.engines.attach(profiler, handle, kind="vllm", trace_dir=...)`` drives an engine held in process;
a role whose config has ``engine: {kind, url}`` drives a server. See capture/engines/capture.py.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attach"]


def attach(profiler: Any, handle: Any, kind: str = "vllm", trace_dir: str | None = None,
           flush_timeout_s: float | None = None, version: str | None = None) -> bool:
    # Kept here: the demo's engine stand-in imports engines.contract, which runs this package; capture.py would
    # bring pydantic (config.engine) into that small server process.
    from distprof.capture.engines.capture import attach as _attach

    return _attach(profiler, handle, kind=kind, trace_dir=trace_dir, flush_timeout_s=flush_timeout_s,
                   version=version)


attach.__doc__ = """Drive an engine held in this process (``vllm.LLM``, or any object with ``start_profile()`` /
``stop_profile()``) from ``profiler``'s planned windows; its traces go to ``{role}/engine``. ``trace_dir``: where
the engine writes (vLLM: its ``torch_profiler_dir``). Returns False (and does nothing) when ``profiler`` does not
capture in this process."""
