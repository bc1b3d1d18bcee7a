"""torch.profiler backend: one ``torch.profiler.profile`` per capture window.

A fresh profile object per window keeps torch's own state machine simple (no
"clears events at the end of each cycle" surprises) and lets each window start
at a global step: torch numbers ProfilerStep#N from ``step_num``, so we set it
to the global step before ``start()``. The schedule we pass maps global steps
to torch's actions (warm-up, record, record-and-save), and torch calls our
``on_trace_ready`` when the window's last step ends, exactly as with its own
schedules. The callback only marks the window ready: the files are written in
``finish()``, so the profiler decides when writing happens (after the step has
ended everywhere, for a driver stepping several worker groups).
"""

from __future__ import annotations

import glob
import gzip
import inspect
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from distprof.capture.backends.base import WindowContext, WindowFiles
from distprof.capture.compat import release, window_options
from distprof.capture.exporter import Child, ChildFailed, fork_child
from distprof.config.model import AUTO_ACTIVITIES, TorchOptions
from distprof.config.plan import Window
from distprof.rundir.layout import temp_name, window_file_name
from distprof.util.intervals import union_length

logger = logging.getLogger(__name__)

_warned_missing: set[str] = set()  # accelerators already warned about in this process
# torch.profiler traces one session per process: the backend whose window is open now (see begin()).
_capturing: TorchBackend | None = None


def _release_session(backend: TorchBackend) -> None:
    global _capturing
    if _capturing is backend:
        _capturing = None


@contextmanager
def _without_inductor_probe(torch: Any) -> Iterator[None]:
    """torch.profiler's ``prepare_trace`` (run when a window's warm-up or recording begins) asks
    ``hasattr(torch, "_inductor")`` only to read whether inductor's CUDA graphs are on. torch loads
    ``_inductor`` lazily on first attribute access, so that question imports inductor and dynamo: measured
    1.7 s of CPU (torch 2.13) on the step that opens the first window of every process that never used
    ``torch.compile`` (pytorch#155243 made the import deliberate, to keep inductor's own start-up out of
    traces). A process that never imported inductor cannot have its CUDA graphs on, so for the length of the
    call torch's lazy-module table does not offer ``_inductor``: the probe answers "no" and nothing is
    imported. Where inductor is loaded already, or this torch has no such table, nothing is changed."""
    lazy = getattr(torch, "_lazy_modules", None)
    if "torch._inductor" in sys.modules or not isinstance(lazy, set) or "_inductor" not in lazy:
        yield
        return
    lazy.discard("_inductor")
    try:
        yield
    finally:
        lazy.add("_inductor")


def trace_suffix(opts: TorchOptions) -> str:
    return ".pt.trace.json.gz" if opts.gzip else ".pt.trace.json"


class TorchBackend:
    name = "torch"

    def __init__(self, opts: TorchOptions):
        self.opts = opts
        self._prof: Any = None
        self._ctx: WindowContext | None = None
        self._ready: Any = None  # the profile whose trace torch has stopped, not yet written
        self._resolved: list[str] = []  # the activities the open window records (resolve_activities)
        self._none: Any = None  # torch.profiler's ProfilerAction.NONE (torch is imported at the first window)

    # ---- window lifecycle ---------------------------------------------------------------------------
    def _context(self) -> WindowContext:
        """The open window's context (begin() sets it before anything reads it)."""
        if self._ctx is None:
            raise RuntimeError("torch backend used before begin()")
        return self._ctx

    def _role(self) -> str:
        return self._ctx.role if self._ctx is not None else "?"

    def begin(self, window: Window, step: int, ctx: WindowContext) -> None:
        import torch
        from torch.profiler import ProfilerAction, profile

        global _capturing
        if _capturing is not None and _capturing is not self:
            # A second torch.profiler session would fail inside torch and, on the way out, end the first one's
            # session too (a segfault at its export). Refuse before touching torch: this profiler is switched
            # off with this message, the one capturing goes on.
            raise RuntimeError(
                f"another profiler in this process (role {_capturing._role()!r}) has a window open at the same "
                "time; torch.profiler records one session per process. Give the two roles disjoint steps, or select "
                "one of them (roles: [...])")
        self._ctx, self._ready = ctx, None
        self._none = ProfilerAction.NONE
        opts, flags_off = window_options(self.opts)

        def schedule(s: int) -> ProfilerAction:
            if s < window.warmup_start or s > window.end:
                return ProfilerAction.NONE
            if s < window.start:
                return ProfilerAction.WARMUP
            return ProfilerAction.RECORD if s < window.end else ProfilerAction.RECORD_AND_SAVE

        kwargs: dict[str, Any] = dict(
            activities=self._activities(torch),
            schedule=schedule,
            on_trace_ready=self._on_trace_ready,
            record_shapes=opts.record_shapes,
            profile_memory=opts.profile_memory,
            with_stack=opts.with_stack,
            with_flops=opts.with_flops,
            with_modules=opts.with_modules,
        )
        # Arguments that only some torch versions have: pass them only where they exist.
        accepted = _accepted_kwargs(profile)
        if "acc_events" in accepted:
            kwargs["acc_events"] = False  # one profile object per window: nothing to accumulate
        if self.opts.post_processing_timeout_s is not None and "post_processing_timeout_s" in accepted:
            kwargs["post_processing_timeout_s"] = self.opts.post_processing_timeout_s
        p = profile(**kwargs)

        # Start numbering at the global step (torch evaluated schedule(0) in its constructor).
        action = schedule(step)
        p.step_num = step
        p.current_action = action
        if hasattr(p, "_prev_schedule_action"):
            p._prev_schedule_action = action

        meta = {"role": ctx.role, "rank": ctx.rank, "world_size": ctx.world_size,
                "window": [window.start, window.end], "pid": os.getpid(),
                "activities": self._resolved}  # what "auto" became on this machine
        if flags_off:
            meta["flags_off"] = flags_off  # the trace says which requested flags it lacks (distprof.capture.compat)
        metadata = {"distprof": json.dumps(meta)}
        if not _dist_initialized():
            # torch writes distributedInfo only under torch.distributed; analysis tools key ranks by it.
            metadata["distributedInfo"] = json.dumps({"rank": ctx.rank, "world_size": ctx.world_size, "backend": None})
        preset = getattr(p, "preset_metadata_json", None)
        for k, v in metadata.items():
            if preset is not None:
                preset(k, v)
        with _without_inductor_probe(torch):
            p.start()
        self._prof = p  # only now: stop() must never be called on a profiler that did not start
        _capturing = self
        if preset is None:  # older torch: add while the profiler runs
            for k, v in metadata.items():
                p.add_metadata_json(k, v)

    def advance(self, step: int) -> None:
        p = self._prof
        if p.current_action is self._none:  # the step that may begin warm-up or recording (prepare_trace)
            with _without_inductor_probe(sys.modules["torch"]):
                p.step()
        else:
            p.step()

    def finish(self, first: int, last: int) -> WindowFiles:
        return self.detach(first, last)()

    def detach(self, first: int, last: int, fork: bool = False) -> Callable[[], WindowFiles]:
        """End the window after steps ``first..last`` on this thread (torch stops tracing and hands over its
        results) and return the writing of its files, to run once, on any thread (:mod:`..exporter`). From here
        the backend is free for the next window.

        ``fork``: a child forked now writes the files (:func:`..exporter.fork_child`: torch's writer holds the
        GIL), and this process drops torch's results at once (the child has its copy); the returned call waits
        for the child. If no child can be forked, the results stay with the returned call, which writes them."""
        p, self._prof = self._prof, None
        _release_session(self)
        ready = None
        try:
            if p is not None:
                p.stop()  # a window cut short: torch stops tracing here and calls on_trace_ready
            ready, self._ready = self._ready, None
        except BaseException:
            for done in (p, ready, self._ready):
                if done is not None:
                    release(done)
            self._ready = None
            raise
        ctx, activities = self._context(), list(self._resolved)
        child = None
        if fork and ready is not None and last >= first:
            results = ready
            try:
                child = fork_child(lambda: self._write(results, ctx, activities))
            except ChildFailed as e:
                self._warn_once(ctx, f"{e}; the window is written by a thread of this process instead (its export "
                                     "shares the GIL with training)")
            else:
                for done in (p, ready):
                    release(done)
                p = ready = None

        def write() -> WindowFiles:
            files: dict[str, str] = {}
            summary = None
            try:
                if child is not None:
                    exported, summary, failed = self._child_result(child, ctx, first, last)
                elif ready is not None and last >= first:  # nothing recorded (last < first): nothing to write
                    exported, summary, failed = self._write(ready, ctx, activities)
                else:
                    exported, failed = {}, None
                if failed is not None:  # the summary is a convenience; the trace is what matters: keep it
                    logger.warning("distprof: the op summary of %s rank %d failed (key_averages: %s); its trace "
                                   "is kept, without a summary", ctx.role, ctx.rank, failed)
                for suffix, tmp in exported.items():
                    files[window_file_name(first, last, suffix, ctx.label)] = tmp
            finally:
                for done in (p, ready):
                    if done is not None:
                        release(done)
            return WindowFiles(files=files, summary=summary)

        return write

    def _warn_once(self, ctx: WindowContext, message: str) -> None:
        if message.split(";")[0] not in _warned_missing:
            _warned_missing.add(message.split(";")[0])
            logger.warning("distprof: %s rank %d: %s", ctx.role, ctx.rank, message)

    @staticmethod
    def _child_result(child: Child, ctx: WindowContext, first: int, last: int) -> _Written:
        """What the child wrote; a child that died took the window with it (its temporaries are removed)."""
        try:
            exported, summary, failed = child.result()
            return dict(exported), summary, failed
        except ChildFailed as e:
            probe = ctx.tmp_path("probe")  # the rank folder's staging place, where the child wrote
            _unlink(probe)
            for tmp in glob.glob(os.path.join(glob.escape(os.path.dirname(probe)), temp_name(child.pid, "*"))):
                _unlink(tmp)
            raise OSError(f"window {first}-{last} was lost: {e} before its files were whole") from None

    def abort(self) -> None:
        p, ready, self._prof, self._ready = self._prof, self._ready, None, None
        _release_session(self)
        if p is not None:
            try:
                p.stop()
            except Exception:
                logger.debug("torch profiler stop() after a fault failed", exc_info=True)
        for done in (p, ready):
            if done is not None:
                release(done)

    # ---- torch callbacks ------------------------------------------------------------------------------
    def _on_trace_ready(self, prof: Any) -> None:
        self._ready = prof  # written by finish(); torch keeps the results on the object until then

    def _write(self, prof: Any, ctx: WindowContext, activities: list[str]) -> _Written:
        """Export the window into hidden temporaries of its own folder, verified: (suffix -> temporary, summary,
        why the summary failed). Runs in the child forked to write the window (:meth:`detach`): it logs nothing,
        the caller does.

        torch's ``export_chrome_trace(x.gz)`` writes the whole JSON uncompressed into ``$TMPDIR`` first (a node's
        /tmp fills up), and when that write fails the gzip it makes is empty while nothing raises. So torch writes
        plain JSON beside the final file, we check it is a whole trace, then gzip it ourselves. Any failure
        deletes every temporary of this window and raises: nothing half-made is left or published.

        What each part holds, measured with torch 2.13 on CPU (a 80 MB trace), on a thread beside a training
        loop: torch's JSON writer (C++) holds the GIL for all of its 0.7 s; the gzip releases it (the training
        thread ran on: longest pause 29 ms); the op summary (``key_averages``, Python) takes turns with it (16 s
        alone; the longest pause it caused was 1.4 s). That is why the background export forks a child for this
        (its own GIL). None of them touches the CUDA context: torch stopped tracing (and CUPTI handed its
        buffers over) in :meth:`detach`; on an H200 (torch 2.11, benchmarks/gpu_smoke.py cost/cost_big) the child
        of a CUDA process wrote both windows whole. What stays on the training thread, :meth:`detach`: torch's
        ``stop()`` (C++, holding the GIL; 0.65 s for a 12-step TransformerEncoder window with stacks on the H200)
        and freeing its results (0.28 s); both need the thread that started the profiler (torch keeps the
        profiler's state per thread: a ``profile`` started and stopped on another thread records none of this
        thread's ops).
        """
        exported: dict[str, str] = {}
        made: list[str] = []
        try:
            if self.opts.export_chrome_trace:
                suffix = trace_suffix(self.opts)
                raw = ctx.tmp_path("trace" + _PLAIN)
                made += [raw, raw + _KINETO_TMP]
                prof.export_chrome_trace(raw)
                check_trace(raw)
                if self.opts.gzip:
                    gz = ctx.tmp_path("trace" + suffix)
                    made.append(gz)
                    gzip_verified(raw, gz)
                    _unlink(raw)
                exported[suffix] = gz if self.opts.gzip else raw
            if self.opts.export_stacks:
                tmp = ctx.tmp_path("stacks.txt")
                made.append(tmp)
                prof.export_stacks(tmp, self.opts.stacks_metric)
                exported[".stacks.txt"] = tmp
        except BaseException:
            for tmp in made:
                _unlink(tmp)
            raise
        try:
            return exported, {**summarize(prof, self.opts.summary_top), "activities": activities}, None
        except Exception as e:
            return exported, None, f"{type(e).__name__}: {e}"[:300]

    def _activities(self, torch: Any) -> list[Any]:
        from torch.profiler import ProfilerActivity

        self._resolved = resolve_activities(self.opts.activities, accelerators_present(torch))
        return [getattr(ProfilerActivity, a.upper()) for a in self._resolved]


_PLAIN = ".pt.trace.json"
_Written = tuple[dict[str, str], "dict[str, Any] | None", "str | None"]  # files, summary, why it has none
_HEAD, _TAIL = 1 << 20, 4096  # bytes of a fresh trace read to check it (its start and its end)
_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_CHUNK = 1 << 20
_KINETO_TMP = ".tmp"  # Kineto writes PATH.tmp and renames it to PATH; a failed write leaves PATH.tmp behind


class TraceExportError(OSError):
    """A window's trace came out empty or cut off (a full disk under torch's writer): not published."""


def check_trace(path: str) -> None:
    """Raise :class:`TraceExportError` unless ``path`` is a whole Kineto JSON trace: an object whose
    ``traceEvents`` list starts near the top and that ends with its closing brace (Kineto writes the list's
    end and a few keys last, so a write cut short by a full disk fails here). Reads two bounded pieces,
    not the whole trace."""
    if not os.path.exists(path):
        raise TraceExportError(f"torch wrote no trace to {path} (is the disk full or read-only?); "
                               "the window is not published")
    size = os.path.getsize(path)
    if size == 0:
        raise TraceExportError(f"torch wrote an empty trace to {path} (is the disk full?); the window is not published")
    with open(path, "rb") as f:
        head = f.read(_HEAD)
        f.seek(max(0, size - _TAIL))
        tail = f.read(_TAIL)
    if not head.lstrip().startswith(b"{") or not _EVENTS.search(head):
        raise TraceExportError(f"the trace torch wrote to {path} has no traceEvents list; the window is not published")
    if not tail.rstrip().endswith(b"}"):
        raise TraceExportError(f"the trace torch wrote to {path} is cut off after {size} bytes (is the disk full?); "
                               "the window is not published")


def gzip_verified(src: str, dst: str) -> None:
    """Gzip ``src`` into ``dst`` in chunks, then read ``dst`` back: its CRC and length must match ``src``."""
    # Level 6 (zlib's default): about as small as torch's level 9 for trace JSON, several times faster.
    with open(src, "rb") as fin, open(dst, "wb") as raw_out:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=raw_out, mtime=0) as out:
            shutil.copyfileobj(fin, out, _CHUNK)
        raw_out.flush()
        os.fsync(raw_out.fileno())  # a full disk may only say so at write-back: find out before publishing
    n = 0
    try:
        with gzip.open(dst, "rb") as f:
            while chunk := f.read(_CHUNK):
                n += len(chunk)
    except (OSError, EOFError) as e:
        raise TraceExportError(f"the gzip written to {dst} does not read back ({e}); "
                               "the window is not published") from None
    if n != os.path.getsize(src):
        raise TraceExportError(f"the gzip written to {dst} holds {n} of {os.path.getsize(src)} bytes; "
                               "the window is not published")


def accelerators_present(torch: Any) -> list[str]:
    """The accelerator activities this process can record: cuda (NVIDIA, and AMD ROCm, whose HIP runtime torch
    exposes as torch.cuda with torch.version.hip set; Kineto traces it as CUDA activity), xpu (Intel)."""
    found = []
    if torch.cuda.is_available():
        found.append("cuda")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        found.append("xpu")
    return found


def resolve_activities(requested: list[str], present: list[str]) -> list[str]:
    """``requested`` as a machine with the accelerators ``present`` can record it. ``["auto"]`` (the default) is
    cpu plus the accelerators present, silently; one named explicitly but absent is dropped with one warning per
    process (a CPU-only run of a GPU config still captures the host side)."""
    if requested == [AUTO_ACTIVITIES]:
        return ["cpu", *present]
    out = [a for a in requested if a == "cpu" or a in present] or ["cpu"]
    for a in requested:
        if a not in out and a not in _warned_missing:
            _warned_missing.add(a)
            logger.warning("distprof: %s activity requested but %s is not available; capturing %s only",
                           a.upper(), a.upper(), ", ".join(x.upper() for x in out))
    return out


def summarize(prof: Any, top: int) -> dict[str, Any]:
    """Per-name self time (device and CPU) and count, plus device busy time with overlaps counted once."""
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:  # torch < 2.4
            dev = getattr(e, "self_cuda_time_total", 0.0)
        rows.append({
            "name": e.key,
            "count": int(e.count),
            "self_device_us": float(dev or 0.0),
            "self_cpu_us": float(e.self_cpu_time_total or 0.0),
        })
    rows.sort(key=lambda r: (r["self_device_us"], r["self_cpu_us"]), reverse=True)

    busy_us = 0.0
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is not None:
        device_spans = []
        for ev in results.events():
            if str(ev.device_type()) != "DeviceType.CPU":
                start = ev.start_ns()
                device_spans.append((start, start + ev.duration_ns()))
        busy_us = union_length(device_spans) / 1000.0
    return {
        "ops": rows if top <= 0 else rows[:top],
        "total_ops": len(rows),
        "self_device_us": sum(r["self_device_us"] for r in rows),
        "self_cpu_us": sum(r["self_cpu_us"] for r in rows),
        "device_busy_us": busy_us,
    }


def _accepted_kwargs(cls: Any) -> set[str]:
    try:
        return set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):  # pragma: no cover
        return set()


def _dist_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # pragma: no cover
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
