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

if TYPE_CHECKING:  # pragma: no cover
    from distprof.config.model import ProfilerConfig

__all__ = ["Backend", "NullBackend", "WindowContext", "WindowFiles", "create_backend"]


def create_backend(config: ProfilerConfig) -> Backend:
    if config.backend == "torch":
        from distprof.capture.backends.torch_backend import TorchBackend

        return TorchBackend(config.torch)
    if config.backend == "cuda_memory":
        from distprof.capture.backends.cuda_memory import CudaMemoryBackend

        return CudaMemoryBackend(config.cuda_memory)
    if config.backend == "nsys" and not config.whole_lifetime:
        from distprof.capture.backends.cuda_range import CudaProfilerRangeBackend

        return CudaProfilerRangeBackend()
    return NullBackend()
