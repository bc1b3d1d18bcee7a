"""On-demand capture as one Profiler sees it (``trigger: true``): polling for requests, answering them, opening
the accepted window. The request format, the folder and the acceptance rule shared by every process are in
:mod:`distprof.capture.trigger`; this module applies that rule to one profiler's plan and state.

A request is answered once per process: ``accepted`` (with its steps), ``refused`` (why), ``skipped`` (seen after
its agreed start: said in the manifest too, so whoever reads the run sees why this rank lacks the steps), then
``captured`` once the window's files are where they stay. One request at a time: a second is refused while one is
pending. An accepted request opens its window at its warm-up step on its own backend (a copy of the config with
the request's backend and flags) when that differs from the plan's, and is timed like a planned window.

The folder is read on a thread (:class:`PollTimer`, every ``trigger_poll_s``), never in a step; the training
thread reads it only at the first poll and with ``trigger_poll_s: 0``, a bounded number of files.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from distprof.capture.backends import create_backend
from distprof.capture.owner import Owner
from distprof.capture.trigger import (
    FINAL_STATES,
    READS_PER_POLL,
    READS_PER_SCAN,
    RequestScanner,
    RequestStore,
    TriggerAck,
    TriggerRequest,
    aligned_start,
    too_far,
)
from distprof.config.plan import Window, role_selected
from distprof.rundir.manifest import WindowRecord
from distprof.util.runtime import host_name

logger = logging.getLogger(__name__)

__all__ = ["OnDemand", "PollTimer"]

AckState = Literal["accepted", "captured", "refused", "skipped"]  # trigger.ACK_STATES


class OnDemand:
    """The requests one Profiler answers: the store it polls, the request accepted and not open yet
    (:attr:`pending`), and the one whose window is open (:attr:`open_trigger`, with the plan's backend)."""

    def __init__(self, prof: Owner, save_path: str) -> None:
        self._prof = prof
        self.store = RequestStore(save_path)
        self.scanner = RequestScanner(self.store, prof._who())
        self.poll_due = True  # time to look at the requests folder (set every trigger_poll_s by the PollTimer)
        self.timer: PollTimer | None = None
        self._seen: set[str] = set()  # request ids this process has answered (or that are not for it)
        self.pending: tuple[TriggerRequest, Window] | None = None  # an accepted request and its window, not open yet
        self.open_trigger: tuple[TriggerRequest, Any] | None = None  # (request, the plan's backend) of the open window

    @property
    def busy(self) -> bool:
        """A request is accepted and not captured yet."""
        return self.pending is not None or self.open_trigger is not None

    # ---- polling -------------------------------------------------------------------------------------------
    def poll(self) -> None:
        """Answer the requests found (capture/trigger.py RequestScanner): the poll thread reads the folder; this
        thread reads it only at the first poll and with trigger_poll_s 0, a bounded number of files."""
        interval = self._prof.config.trigger_poll_s
        self.poll_due = interval == 0  # 0: at every step
        if interval == 0 or self.timer is None:
            self.scanner.scan(limit=READS_PER_POLL)
        if interval > 0 and self.timer is None:
            self.timer = PollTimer(self, interval)
        for req in self.scanner.take():
            if req.id not in self._seen:
                self.take(req, stored=True)

    def cancel(self) -> None:
        """Stop the poll thread (the profiler stops or faulted)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def hand(self, request: Any) -> dict[str, Any] | None:
        """``Profiler.trigger_request``: answer a request handed in-process; this process's acknowledgement."""
        p = self._prof
        out: list[Any] = []
        p._guard("trigger", lambda: out.append(self.take(request, stored=False)))
        if self.busy:  # (a fault answered and dropped it)
            p._use_full_step(if_idle=True)  # a window to open: leave the idle fast path
        return msgspec.to_builtins(out[0]) if out and out[0] is not None else None

    # ---- answering ------------------------------------------------------------------------------------------
    def take(self, req: TriggerRequest, stored: bool) -> TriggerAck | None:
        """Answer one request: accepted (with its steps), refused, skipped, or None when it is not for us."""
        p = self._prof
        store = self.store
        self._seen.add(req.id)
        if (req.ranks is not None and p.rank not in req.ranks) or not role_selected(req.roles, p.role):
            return None
        g = p.global_step  # the step about to run
        try:
            if not stored:
                store.put(req)
            prev = store.my_ack(req.id, p.role, p.rank)
            if prev is not None and prev.state in FINAL_STATES:
                return prev  # answered by an earlier process of this rank (a restarted job)
            why = self._refusal(req)
            if why:
                return self.ack(req, "refused", why, seen_step=g)
            start = req.start_step if req.start_step is not None else store.claim_start(
                req.id, aligned_start(g, req.lead_steps, req.align))
        except (OSError, ValueError) as e:  # a folder it may read, not write: this request only, not profiling
            logger.warning("distprof: %s skips request %s: it cannot write its claim in %s: %s", p._who(),
                           req.id, store.save_path, e)
            return None
        why = too_far(start, g)
        if why:
            return self.ack(req, "refused", why, seen_step=g)
        return self._accept(req, start, g)

    def _accept(self, req: TriggerRequest, start: int, g: int) -> TriggerAck:
        """The request fits this process's state so far: skipped when its start is past, refused when it overlaps
        the plan, else accepted (pending until its warm-up step)."""
        p = self._prof
        end = start + req.steps - 1
        if g > start:
            detail = f"saw the request at step {g}, after the agreed start {start}"
            # Said in the manifest too (no files, stopped_by trigger_skipped): whoever reads the run sees why
            # this rank lacks the steps the others captured.
            p._run.append_manifest(p._dir, WindowRecord(
                role=p.role, rank=p.rank, world_size=p.world_size, steps=[start, end], complete=False,
                stopped_by="trigger_skipped", written_time=time.time(), host=host_name(), pid=os.getpid(),
                backend=req.backend, trigger=req.id))
            return self.ack(req, "skipped", detail, steps=[start, end], seen_step=g)
        w = Window(start=start, end=end, warmup_start=max(start - 1, g))
        planned = p._plan.next_window(w.warmup_start)
        opened = p._open if p._open is not None and p._open.end >= w.warmup_start else None
        other = opened or (planned if planned is not None and planned.warmup_start <= w.end else None)
        if other is not None:
            return self.ack(req, "refused", f"steps {start}-{end} overlap the planned window {other.start}-{other.end}",
                            steps=[start, end], seen_step=g)
        self.pending = (req, w)
        p._clock.plan_request(w, g)
        return self.ack(req, "accepted", f"will record steps {start}-{end}", steps=[start, end], seen_step=g)

    def _refusal(self, req: TriggerRequest) -> str | None:
        p = self._prof
        cfg = p.config
        if p._memory is not None and p._memory.tripped:
            return "the memory guard stopped profiling on this rank earlier in the run; it captures no more windows"
        if req.steps > cfg.trigger_max_steps:
            return (f"asks for {req.steps} steps, over this job's trigger_max_steps={cfg.trigger_max_steps}; "
                    "ask for fewer steps")
        busy = self.pending or self.open_trigger
        if busy is not None:
            return f"request {busy[0].id} is still pending here; send this one after it is captured"
        if req.backend == "cuda_memory":
            import torch  # only for a request that asks for this backend: torch stays unimported otherwise

            if not torch.cuda.is_available():
                return "backend cuda_memory needs a CUDA device, and this process has none"
        return None

    def ack(self, req: TriggerRequest, state: AckState, detail: str, steps: list[int] | None = None,
            seen_step: int | None = None, file: str | None = None, store: RequestStore | None = None) -> TriggerAck:
        """``store``: where to write it (default this one; the upload thread passes the one the request came from,
        since a later fault drops this OnDemand)."""
        p = self._prof
        ack = TriggerAck(id=req.id, role=p.role, rank=p.rank, state=state, detail=detail, steps=steps,
                         seen_step=seen_step, file=file, time=time.time(), host=host_name(), pid=os.getpid())
        (logger.warning if state in ("refused", "skipped") else logger.info)(
            "distprof: %s %s request %s: %s", p._who(), state, req.id, detail)
        try:
            (store or self.store).ack(ack)
        except Exception as e:  # the acknowledgement is for people; failing to write it must not stop the capture
            logger.warning("distprof: %s could not write its acknowledgement of request %s: %s", p._who(), req.id, e)
        return ack

    # ---- the requested window ---------------------------------------------------------------------------------
    def open_due(self) -> None:
        """Open the accepted request's window when its warm-up step has come and no window is open."""
        p = self._prof
        if self.pending is None or p._open is not None or p.global_step < self.pending[1].warmup_start:
            return
        req, w = self.pending
        self.pending = None
        w = w.clipped(p.global_step)
        cfg = p.config
        if req.backend != cfg.backend or req.flags:
            backend = create_backend(cfg.model_copy(update={
                "backend": req.backend, "torch": cfg.torch.model_copy(update={f: True for f in req.flags})}))
        else:
            backend = p._backend
        self.open_trigger = (req, p._backend)
        p._backend = backend
        p._begin_window(w, backend)
        logger.info("distprof: %s opened requested window %d-%d (request %s)", p._who(), w.start, w.end, req.id)

    def closing(self) -> tuple[TriggerRequest, Any] | None:
        """The window being closed: (its request, the plan's backend to go back to) if it was requested."""
        requested, self.open_trigger = self.open_trigger, None
        return requested

    def uploaded(self, req: TriggerRequest, stopped_by: str | None) -> Callable[[WindowRecord], None]:
        """The acknowledgement of a requested window whose manifest line ``rec`` was written: captured, with the
        file where it stays (its published name, or the local folder it was kept in when the upload failed)."""
        store = self.store

        def done(rec: WindowRecord) -> None:
            detail = f"recorded steps {rec.steps[0]}-{rec.steps[1]}" + (
                "" if stopped_by is None else f", cut short ({stopped_by})")
            if rec.local_path is not None:
                detail += (f"; the upload failed ({rec.upload_error}), so the files stay on {rec.host} in "
                           f"{rec.local_path}")
            self.ack(req, "captured", detail, steps=list(rec.steps), file=rec.file, store=store)
        return done

    def unrecorded(self, req: TriggerRequest, w: Window, last: int, stopped_by: str | None,
                   guard: dict[str, Any] | None) -> None:
        """A requested window that closed with no file: cut short before its first step (the memory guard in its
        warm-up, stop()), or a backend that wrote nothing. Said in the ack and, when cut short, in the manifest."""
        if stopped_by is None:
            self.ack(req, "refused", "the backend wrote no file")
            return
        p = self._prof
        p._run.append_manifest(p._dir, WindowRecord(
            role=p.role, rank=p.rank, world_size=p.world_size, steps=[w.start, w.end], complete=False,
            stopped_by=stopped_by, written_time=time.time(), host=host_name(), pid=os.getpid(), backend=req.backend,
            trigger=req.id, guard=guard))
        self.ack(req, "skipped", f"cut short ({stopped_by}) after step {last}, " + (
            f"before the requested steps {w.start}-{w.end}: nothing recorded" if last < w.start else
            f"steps {w.start}-{last} not exported: {(guard or {}).get('reason', 'no file')}"))

    def stop(self, cause: str) -> None:
        """The Profiler stops: a request accepted and not open yet is answered skipped."""
        if self.pending is not None:
            req, pw = self.pending
            self.pending = None
            self.ack(req, "skipped", f"stopped ({cause}) at step {self._prof.global_step}, before the requested "
                                     f"steps {pw.start}-{pw.end}")

    def due(self) -> None:
        """The poll timer fired (on its thread): read the folder there, and poll at the next step boundary."""
        if self.timer is None:
            return  # cancelled: the profiler stopped or faulted
        self.scanner.scan(READS_PER_SCAN)  # on the timer's thread: the folder is read here, never in a step
        self.poll_due = True
        self._prof._use_full_step(if_idle=True)  # leave the idle fast path: the next step() polls

    def fault(self, where: str) -> None:
        """The Profiler faulted: the sender of a waiting request gets its answer; no more polling."""
        waiting = self.open_trigger or self.pending
        if waiting is not None:
            self.ack(waiting[0], "refused", f"profiling failed during {where} at step {self._prof.global_step}; "
                                            "see this process's log")
        self.pending = self.open_trigger = None
        self.cancel()


class PollTimer:
    """Every ``interval`` seconds (Event.wait: a monotonic clock), tells a profiler to look for requests at its
    next step boundary (:meth:`OnDemand.due`): raises ``poll_due`` and puts the full step() back in place of the
    idle one, so an idle step() reads no clock and no flag. The thread holds its OnDemand weakly and ends with it
    (and with its profiler, which owns it)."""

    def __init__(self, owner: OnDemand, interval: float) -> None:
        self._stop = threading.Event()
        self._ref = weakref.ref(owner)

        def run() -> None:
            while not self._stop.wait(interval) and self.fire():
                pass

        self._thread = threading.Thread(target=run, name="distprof-trigger-poll", daemon=True)
        self._thread.start()

    def fire(self) -> bool:
        """Time to poll; False once the profiler is gone."""
        od = self._ref()
        if od is None:
            return False
        od.due()
        return True

    def cancel(self) -> None:
        self._stop.set()
