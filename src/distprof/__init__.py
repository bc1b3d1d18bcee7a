"""distprof: config-driven profiling of distributed PyTorch training, and answers from its traces."""

from typing import TYPE_CHECKING, Any

from .annotate import annotate

__version__ = "0.1.0"

__all__ = ["ProfilerConfig", "Profiler", "annotate", "add_profiler_args", "trigger", "trigger_status", "__version__"]

if TYPE_CHECKING:
    from .args import add_profiler_args
    from .config import ProfilerConfig
    from .profiler import Profiler
    from .rundir.trigger import trigger, trigger_status


def __getattr__(name: str) -> Any:
    # Imported on first use: the analysis commands never touch the config (pydantic costs ~0.1 s per process).
    if name == "ProfilerConfig":
        from .config import ProfilerConfig

        return ProfilerConfig
    if name == "add_profiler_args":
        from .args import add_profiler_args

        return add_profiler_args
    if name == "Profiler":
        from .profiler import Profiler

        return Profiler
    if name in ("trigger", "trigger_status"):
        from .rundir import trigger as _trigger

        return getattr(_trigger, name)
    raise AttributeError(f"module 'distprof' has no attribute {name!r}")
