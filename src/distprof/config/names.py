"""The closed sets of names a config chooses from: capture tools and torch.profiler activities.

Pure: imports nothing. The command-line flags (:mod:`.args`), the option models (:mod:`.options`) and
``ProfilerConfig`` (:mod:`.model`) read them here, so none of them imports another for a list of names.
"""

from __future__ import annotations

__all__ = ["ACTIVITIES", "AUTO_ACTIVITIES", "BACKENDS"]

BACKENDS = ("torch", "cuda_memory", "nsys", "rocprof_sys", "py_spy", "memray")
ACTIVITIES = ("cpu", "cuda", "xpu")
AUTO_ACTIVITIES = "auto"  # cpu plus the accelerator present, resolved when a window opens (backends/torch_backend)
