"""distprof: config-driven profiling of distributed PyTorch training, and answers from its traces."""

from typing import TYPE_CHECKING, Any

from .annotate import annotate

__version__ = "0.1.0"

__all__ = ["ProfilerConfig", "Profiler", "annotate", "add_profiler_args", "__version__"]

if TYPE_CHECKING:
    from .args import add_profiler_args
    from .config import ProfilerConfig
    from .profiler import Profiler


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
    raise AttributeError(f"module 'distprof' has no attribute {name!r}")
