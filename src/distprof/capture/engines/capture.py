"""The controller: a role's planned windows drive its rollout engine's own profiler, and the engine's traces
become the role ``{role}/engine`` of the run directory.

The engine is asked to start on a thread of its own at the step *before* a planned window (its warm-up step:
an engine's profiler can take seconds to start, as torch.profiler's first start does, and that cost then lands
outside the window and never on a step boundary), or, with ``engine.iterations`` (its first N engine iterations
of the window), at the window's first step and before that step runs. At the step after the window's last it
is asked to stop. The stop, the engine's flush and the publication run on a thread of their own, bounded by
``engine.flush_timeout_s``: training never waits for them. A trace of a whole window may therefore begin with
the end of its warm-up step's generation (the analyses place engine work by time). Each engine rank's trace is
published under ``{role}/engine/rank{R:05d}/`` (R from the file name: capture/engines/contract.py) with one
manifest line carrying ``engine: {engine, version, replica, ranks, file}``, through the run directory's one writer
(rundir/publish.py). A failed start, a failed or slow flush, an engine that died: one warning and a manifest line
with ``complete: false`` (``stopped_by``: ``engine_error`` or ``flush_timeout``), never an exception into training.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from distprof.capture.engines.base import EngineAdapter, EngineError
from distprof.capture.engines.contract import local_rank, parse_ranks
from distprof.capture.engines.sglang import SglangAdapter
from distprof.capture.engines.vllm import VllmAdapter
from distprof.config.engine import EngineConfig
from distprof.config.plan import Window
from distprof.rundir.layout import ROLE_JSON, rank_dir, window_file_name
from distprof.rundir.publish import publish, write_json
from distprof.util.runtime import host_name

logger = logging.getLogger(__name__)

__all__ = ["ENGINE_ERROR", "FLUSH_TIMEOUT", "EngineCapture", "attach", "for_profiler", "make_adapter"]

FLUSH_TIMEOUT = "flush_timeout"
ENGINE_ERROR = "engine_error"


def make_adapter(config: EngineConfig, handle: Any = None, replica: int = 0) -> EngineAdapter:
    if config.kind == "vllm":
        return VllmAdapter(config, handle, replica)
    return SglangAdapter(config, handle, replica)


class EngineCapture:
    """Drives one engine replica from one Profiler's plan. Every method logs and swallows its own faults."""

    def __init__(self, adapter: EngineAdapter, prof: Any):
        self.adapter = adapter
        self.role = f"{prof.role}/engine"
        self._run, self._plan, self._config = prof._run, prof._plan, prof.config
        self._who = f"{prof.role}/engine (replica {adapter.replica})"
        self._open: Window | None = None
        self._opened_at = 0.0
        self._step = prof.global_step
        self._per_replica = 1
        self._role_json = False
        self._threads: list[threading.Thread] = []
        self._stage_root: str | None = None
        self._started: tuple[dict[str, Any], threading.Thread | None] = ({"ok": None}, None)  # the last window's start
        self._given_up = -1  # the last step of a window whose start failed
        self.windows: list[dict[str, Any]] = []
        """One entry per closed window, once published: {steps, complete, stopped_by, ranks} (for tests and tools)."""

    # ---- called by the Profiler ---------------------------------------------------------------------------
    def at(self, step: int) -> None:
        """Global step ``step`` is about to run."""
        try:
            self._step = step
            w = self._open
            if w is not None and step > w.end:
                self._close(w, w.end, None)
            if self._open is None and step > self._given_up:
                nw = self._plan.next_window(step)
                early = self.adapter.config.iterations is None  # whole windows start a step ahead, off-thread
                if nw is not None and (nw.start <= step <= nw.end or (early and step == nw.start - 1)):
                    self._begin(Window(start=max(step, nw.start), end=nw.end, warmup_start=step), background=early)
        except Exception:
            logger.warning("distprof: %s: driving the engine's profiler failed at step %d", self._who, step,
                           exc_info=True)

    def close(self, cause: str) -> None:
        """The Profiler stops: a window still open is stopped (``complete: false``, ``stopped_by`` ``cause``)."""
        try:
            w = self._open
            if w is not None:
                self._close(w, max(w.start, min(w.end, self._step - 1)), cause)
        except Exception:
            logger.warning("distprof: %s: stopping the engine's profiler failed", self._who, exc_info=True)

    def wait_started(self, timeout: float | None = None) -> bool | None:
        """Wait for the last window's start request (sent ahead of the window, on a thread): True when the engine
        started, False when it could not, None while still waiting."""
        started, starter = self._started
        if starter is not None:
            starter.join(timeout)
        return started["ok"]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every closed window's flush and publication (each bounded by flush_timeout_s); True when done."""
        for t in list(self._threads):
            t.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    # ---- windows -------------------------------------------------------------------------------------------
    def _begin(self, w: Window, background: bool = False) -> None:
        out_dir = self.adapter.out_dir_for((w.start, w.end), self._staging())
        self._open, self._opened_at = w, time.time()
        # "ok": set by the start (True, or False once its failure is recorded); "session": the window's, for its stop.
        started: dict[str, Any] = {"ok": None, "session": None}
        previous, self._started = self._started[0], (started, None)
        if not background:
            self._start(w, out_dir, started, None, None)
            return
        t = threading.Thread(target=self._start, name="distprof-engine-start", daemon=True,
                             args=(w, out_dir, started, self.adapter.config.flush_timeout_s, previous))
        self._started = (started, t)
        t.start()

    def _start(self, w: Window, out_dir: str, started: dict[str, Any], timeout_s: float | None,
               previous: dict[str, Any] | None) -> None:
        try:
            # An engine profiles one session at a time: the previous window's stop (its flush) comes first.
            sess = previous.get("session") if previous else None
            if sess is not None and not sess.done.wait(self.adapter.config.flush_timeout_s):
                raise EngineError("the previous window's flush had not ended")
            started["session"] = self.adapter.start((w.start, w.end), out_dir, timeout_s)
            started["ok"] = True
            logger.info("distprof: %s profiling steps %d-%d (traces in %s)", self._who, w.start, w.end, out_dir)
        except Exception as e:
            if self._open is w:
                self._open = None
            self._given_up = max(self._given_up, w.end)  # this window is recorded as failed: never started again
            started["ok"] = False
            logger.warning("distprof: %s could not start profiling steps %d-%d: %s", self._who, w.start, w.end, e)
            try:
                self._record(w, w.end, [], ENGINE_ERROR, str(e))
            except Exception:
                logger.warning("distprof: %s: recording the failed start failed", self._who, exc_info=True)

    def _close(self, w: Window, last: int, cause: str | None) -> None:
        self._open = None
        started, starter = self._started
        t = threading.Thread(target=self._flush, args=(w, last, cause, time.time(), started, starter),
                             name="distprof-engine-flush")
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _flush(self, w: Window, last: int, cause: str | None, t1: float, started: dict[str, Any],
               starter: threading.Thread | None) -> None:
        try:
            if starter is not None:
                starter.join(self.adapter.config.flush_timeout_s)  # a start still on its way (bounded by its timeout)
            if started["ok"] is False:
                return  # its failure is recorded
            sess = self.adapter.stop(started["session"])  # returns at once: the request runs on a daemon thread
            try:
                files = self.adapter.wait_flush(self.adapter.config.flush_timeout_s, sess)
            except EngineError as e:
                why = FLUSH_TIMEOUT if "did not finish" in str(e) else ENGINE_ERROR
                logger.warning("distprof: %s: steps %d-%d not captured: %s", self._who, w.start, last, e)
                self._record(w, last, [], why, str(e), t1)
                return
            if not files:
                logger.warning("distprof: %s: the engine wrote no trace for steps %d-%d", self._who, w.start, last)
                self._record(w, last, [], cause or ENGINE_ERROR, "the engine wrote no trace file", t1)
                return
            self._record(w, last, files, cause, None, t1)
        except Exception:
            logger.warning("distprof: %s: publishing the engine's traces of steps %d-%d failed", self._who, w.start,
                           last, exc_info=True)

    def _record(self, w: Window, last: int, files: list[str], stopped_by: str | None, error: str | None,
                t1: float | None = None) -> None:
        """One manifest line per engine rank (files), or one line saying why there are none."""
        desc = self.adapter.describe()
        parsed = [(f, r) for f in files if (r := parse_ranks(self.adapter.kind, f)) is not None]
        sizes = {k: 1 + max((int(r.get(k, 0)) for _, r in parsed), default=0) for k in ("tp", "dp", "pp")}
        by_rank: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for f, r in parsed:
            by_rank.setdefault(local_rank(self.adapter.kind, r, sizes), []).append((f, r))
        if by_rank:
            self._per_replica = max(by_rank) + 1
        base = self.adapter.replica * self._per_replica
        complete = stopped_by is None and last >= w.end and bool(by_rank)
        common = dict(steps=[w.start, last], complete=complete, stopped_by=stopped_by, start_time=self._opened_at,
                      end_time=t1 or time.time(), host=_host(), pid=os.getpid(), backend="torch")
        if not by_rank:
            rank = base
            publish(self._run, rank_dir(self.role, rank), [], dict(
                role=self.role, rank=rank, world_size=rank + 1, **common,
                engine={**desc, "error": error}), self._who)
            self.windows.append({"steps": [w.start, last], "complete": False, "stopped_by": stopped_by, "ranks": []})
            return
        world = base + self._per_replica
        if not self._role_json:
            self._write_role_json(sorted(base + r for r in by_rank), world)
        for local, entries in sorted(by_rank.items()):
            rank = base + local
            rel = rank_dir(self.role, rank)
            staged = self._stage(rel, w.start, last, entries)
            ranks = {k: v for k, v in entries[0][1].items() if k != "stage"}
            publish(self._run, rel, staged, dict(
                role=self.role, rank=rank, world_size=world, **common,
                engine={**desc, "ranks": ranks, "files": [os.path.basename(s) for s, _ in entries]}), self._who)
        self.windows.append({"steps": [w.start, last], "complete": complete, "stopped_by": stopped_by,
                             "ranks": sorted(base + r for r in by_rank)})
        logger.info("distprof: %s published steps %d-%d: %d engine rank(s)", self._who, w.start, last, len(by_rank))

    def _stage(self, rel: str, first: int, last: int,
               entries: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
        """Copy one engine rank's files into the run's staging folder under their window names: (temp, name)."""
        staged: list[tuple[str, str]] = []
        taken: set[str | None] = set()
        for i, (src, ranks) in enumerate(entries):
            label = f"engine-{ranks['stage']}" if "stage" in ranks else None
            if (i and label is None) or (label in taken and label is not None):
                label = f"engine-{i + 1}"
            taken.add(label)
            suffix = ".pt.trace.json.gz" if src.endswith(".gz") else ".pt.trace.json"
            name = window_file_name(first, last, suffix, label)
            tmp = self._run.temp_path(rel, name)
            shutil.copyfile(src, tmp)
            staged.append((tmp, name))
        return staged

    def _write_role_json(self, ranks: list[int], world: int) -> None:
        config = self._config.model_dump(mode="json")
        config.update(ranks=ranks, discrete=False, backend="torch", per_node=None)
        write_json(self._run, {"role": self.role, "world_size": world, "plan": self._plan.describe(),
                               "backend": "torch", "config": config}, rel=f"{self.role}/{ROLE_JSON}")
        self._role_json = True

    def _staging(self) -> str:
        if self._stage_root is None:
            self._stage_root = tempfile.mkdtemp(prefix="distprof-engine-")
        return self._stage_root


def _host() -> str:
    return host_name()


def for_profiler(prof: Any) -> EngineCapture | None:
    """The controller of a Profiler whose role has ``engine`` with a ``url`` (an in-process engine comes through
    :func:`attach`)."""
    cfg = prof.config.engine
    if cfg is None or cfg.url is None:
        return None
    return EngineCapture(make_adapter(cfg, replica=prof.rank), prof)


def attach(prof: Any, handle: Any, kind: str = "vllm", trace_dir: str | None = None,
           flush_timeout_s: float | None = None, version: str | None = None) -> bool:
    if not getattr(prof, "enabled", False):
        return False
    base = prof.config.engine.model_dump() if prof.config.engine is not None else {}
    base.update(kind=kind, url=None)
    for key, value in (("trace_dir", trace_dir), ("flush_timeout_s", flush_timeout_s), ("version", version)):
        if value is not None:
            base[key] = value
    cap = EngineCapture(make_adapter(EngineConfig(**base), handle, replica=prof.rank), prof)
    prof._engine = cap
    if prof._started:
        cap.at(prof.global_step)
    return True
