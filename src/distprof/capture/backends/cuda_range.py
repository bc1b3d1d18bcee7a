"""nsys companion: mark each window's recorded steps with cudaProfilerStart / cudaProfilerStop.

nsys, started with ``--capture-range=cudaProfilerApi``, records only between
these calls (``capture/backends/process.py`` injects that option when steps or a
schedule are set). Warm-up steps are not marked.
"""

from __future__ import annotations

import logging

from distprof.capture.backends.base import WindowContext, WindowFiles
from distprof.config.plan import Window

logger = logging.getLogger(__name__)


class CudaProfilerRangeBackend:
    name = "cuda_range"

    def __init__(self) -> None:
        self._window: Window | None = None
        self._on = False

    def begin(self, window: Window, step: int, ctx: WindowContext) -> None:
        self._window = window
        if step >= window.start:
            self._start()

    def advance(self, step: int) -> None:
        if self._window is not None and step == self._window.start and not self._on:
            self._start()

    def finish(self, first: int, last: int) -> WindowFiles:
        if self._on:
            import torch

            torch.cuda.profiler.stop()
            self._on = False
        self._window = None
        return WindowFiles()

    def abort(self) -> None:
        try:
            self.finish(0, -1)
        except Exception:
            logger.debug("cudaProfilerStop after a fault failed", exc_info=True)

    def _start(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("nsys capture ranges need CUDA (torch.cuda.profiler.start); this process has none")
        torch.cuda.profiler.start()
        self._on = True
