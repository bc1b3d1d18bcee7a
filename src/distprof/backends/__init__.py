"""Capture backends: one small module each, all implementing ``base.Backend``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Backend, WindowContext, WindowFiles

if TYPE_CHECKING:  # pragma: no cover
    from ..config import ProfilerConfig

__all__ = ["Backend", "WindowContext", "WindowFiles", "create_backend", "IN_PROCESS"]

# Backends a Profiler drives inside the training process. The others (nsys,
# rocprof_sys, py_spy, memray) wrap the whole worker process from outside.
IN_PROCESS = ("torch",)


def create_backend(config: "ProfilerConfig") -> Backend:
    if config.backend == "torch":
        from .torch_backend import TorchBackend

        return TorchBackend(config.torch)
    raise ValueError(
        f"backend {config.backend!r} is not available as an in-process profiler in this version of distprof; "
        "use backend: torch"
    )
