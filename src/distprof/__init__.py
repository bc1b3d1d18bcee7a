"""distprof: config-driven profiling of distributed PyTorch training, and answers from its traces."""

from typing import TYPE_CHECKING, Any

from distprof.capture.annotate import annotate
from distprof.util.runtime import VERSION as __version__

__all__ = ["Profiler", "ProfilerConfig", "__version__", "add_profiler_args", "annotate", "trigger", "trigger_status"]

if TYPE_CHECKING:
    from distprof.capture.profiler import Profiler
    from distprof.capture.trigger import trigger, trigger_status
    from distprof.config.args import add_profiler_args
    from distprof.config.model import ProfilerConfig


def __getattr__(name: str) -> Any:
    # Imported on first use: the analysis commands never touch the config (pydantic costs ~0.1 s per process).
    if name == "ProfilerConfig":
        from distprof.config.model import ProfilerConfig

        return ProfilerConfig
    if name == "add_profiler_args":
        from distprof.config.args import add_profiler_args

        return add_profiler_args
    if name == "Profiler":
        from distprof.capture.profiler import Profiler

        return Profiler
    if name in ("trigger", "trigger_status"):
        from distprof.capture import trigger as _trigger

        return getattr(_trigger, name)
    raise AttributeError(f"module 'distprof' has no attribute {name!r}")
