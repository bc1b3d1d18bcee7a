"""CUDA memory snapshot backend: allocator history during a window, a snapshot at its end and on OOM.

Needs CUDA. Uses torch's (private, but documented in "Understanding CUDA
Memory Usage") ``torch.cuda.memory._record_memory_history`` / ``_snapshot``.
The snapshot is a pickle that https://pytorch.org/memory_viz opens. Python-only
stacks are the default: ``stacks="all"`` makes dumps on large models two orders
of magnitude slower. Pickle protocol 4: memory_viz showed nothing for protocol 5.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Callable
from typing import Any

from distprof.capture.backends.base import WindowContext, WindowFiles
from distprof.config.model import CudaMemoryOptions
from distprof.config.plan import Window
from distprof.rundir.layout import rank_dir, window_file_name
from distprof.rundir.manifest import OOM
from distprof.rundir.safefile import replace

logger = logging.getLogger(__name__)

SUFFIX = ".memory.pickle"
_oom_hook: list[Callable[[], None]] = []  # the one observer torch calls; points at the latest window's dumper


class CudaMemoryBackend:
    name = "cuda_memory"

    def __init__(self, opts: CudaMemoryOptions):
        self.opts = opts
        self._ctx: WindowContext | None = None
        self._recording = False
        self._tmp: str | None = None
        self._window: Window | None = None
        self._step = 0  # the step running now (an OOM happens in it)

    def begin(self, window: Window, step: int, ctx: WindowContext) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("backend 'cuda_memory' needs CUDA; this process has none")
        self._ctx, self._window, self._step = ctx, window, step
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=self.opts.stacks,
                                                  max_entries=self.opts.max_entries)
        self._recording = True
        if self.opts.dump_on_oom:
            _install_oom_observer(torch, self._dump_oom)

    def advance(self, step: int) -> None:
        self._step = step

    def finish(self, first: int, last: int) -> WindowFiles:
        import torch

        files: dict[str, str] = {}
        if self._recording:
            if last >= first and self._ctx is not None:  # (recording: begin() set the context)
                tmp = self._ctx.tmp_path("snapshot" + SUFFIX)
                _dump(torch, tmp)
                files[window_file_name(first, last, SUFFIX)] = tmp
            torch.cuda.memory._record_memory_history(enabled=None)
            self._recording = False
        _oom_hook.clear()
        return WindowFiles(files=files)

    def abort(self) -> None:
        _oom_hook.clear()
        if self._recording:
            try:
                import torch

                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                logger.debug("stopping memory history after a fault failed", exc_info=True)
            self._recording = False

    def _dump_oom(self) -> None:
        """Write the snapshot right away and publish it with its own manifest line (``stopped_by: oom``, steps
        from the window's first to the one the allocation failed in): the process may not survive the OOM."""
        import torch

        ctx, window = self._ctx, self._window
        if ctx is None or window is None:  # the observer is installed by begin(), which sets both
            return
        tmp = ctx.tmp_path(f"oom{SUFFIX}")
        _dump(torch, tmp)
        name = f"oom-{time.strftime('%Y%m%dT%H%M%S')}-pid{os.getpid()}{SUFFIX}"
        step = self._step
        steps = [window.start if step >= window.start else step, step]
        if ctx.publish_now is not None:
            ctx.publish_now(tmp, name, steps, OOM)
            where = f"{rank_dir(ctx.role, ctx.rank)}/{name}"
        else:  # a context without a run directory behind it: the file stays beside the window's
            where = os.path.join(os.path.dirname(tmp), name)
            replace(tmp, where)
        logger.error("distprof: CUDA out of memory on %s in step %d; allocator snapshot written to %s (open it at "
                     "https://pytorch.org/memory_viz)", rank_dir(ctx.role, ctx.rank), step, where)


def _dump(torch: Any, path: str) -> None:
    snapshot = torch.cuda.memory._snapshot()
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)


def _install_oom_observer(torch: Any, dumper: Callable[[], None]) -> None:
    first = not _oom_hook and not getattr(_install_oom_observer, "installed", False)
    _oom_hook[:] = [dumper]
    if first:
        def observer(device, alloc, device_alloc, device_free):  # signature fixed by torch
            for hook in list(_oom_hook):
                try:
                    hook()
                except Exception:
                    logger.exception("distprof: writing the OOM memory snapshot failed")

        torch._C._cuda_attach_out_of_memory_observer(observer)
        _install_oom_observer.installed = True  # type: ignore[attr-defined]  # a flag tests reset
