"""Capture backends: one small module each, all implementing ``base.Backend``.

In-process backends capture inside the training process (torch, cuda_memory).
Process backends (nsys, rocprof_sys, py_spy, memray) wrap the whole worker from
outside (``capture/backends/process.py``, ``distprof.integrations.ray.runtime_env``); inside the
process their Profiler still opens windows, so ``annotate`` emits NVTX ranges
and timings, and for nsys it marks the capture range at window edges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distprof.capture.backends.base import Backend, NullBackend, WindowContext, WindowFiles
from distprof.capture.backends.cuda_range import CudaProfilerRangeBackend

if TYPE_CHECKING:  # pragma: no cover
    from distprof.config.model import ProfilerConfig

__all__ = ["Backend", "NullBackend", "WindowContext", "WindowFiles", "create_backend"]


def create_backend(config: ProfilerConfig) -> Backend:
    # The in-process backends are imported here, when chosen: they bring pydantic (config.model), and the process-
    # tool wrapper (capture/wrap.py, started before every wrapped worker) imports backends.process, which runs this
    # package.
    if config.backend == "torch":
        from distprof.capture.backends.torch_backend import TorchBackend

        return TorchBackend(config.torch)
    if config.backend == "cuda_memory":
        from distprof.capture.backends.cuda_memory import CudaMemoryBackend

        return CudaMemoryBackend(config.cuda_memory)
    if config.backend == "nsys" and not config.whole_lifetime:
        return CudaProfilerRangeBackend()
    return NullBackend()
