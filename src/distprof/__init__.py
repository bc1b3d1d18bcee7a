"""distprof: config-driven profiling of distributed PyTorch training, and answers from its traces."""

from .annotate import annotate
from .config import ProfilerConfig
from .profiler import Profiler

__version__ = "0.1.0"

__all__ = ["ProfilerConfig", "Profiler", "annotate", "__version__"]
