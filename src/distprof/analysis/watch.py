"""The watcher: reads every rank's step telemetry, applies the rules, captures and diagnoses what they find.

``Watcher(run_dir, options, send=...)``; each :meth:`Watcher.poll` reads what the ranks' streams appended
(:class:`~.telemetry.TelemetryRun`), judges the steps every live rank reported (:class:`~.detect.Tracker`) and,
per detection (docs/telemetry.md, "The watcher"):

1. with capture allowed (``detection.capture``, a ``send`` given, within ``max_captures_per_hour`` and
   ``max_capture_mb``), asks for ``capture_steps`` steps of the slow rank(s) and one healthy peer (the rank closest
   to the median) through ``send(role, ranks, steps, lead_steps) -> request id`` (the caller builds it on
   :func:`distprof.capture.trigger.send`: analysis does not import capture), and logs one line;
2. once the requested windows are published (manifest lines carrying the request's id, or every rank answered:
   ``answers(request id) -> {(role, rank): state}``), or ``capture_timeout_s`` passed, runs the diagnosis on just
   those files and appends one line per detection to ``{run_dir}/detections.jsonl``: ``{"role", "rank", "step",
   "rule", "captured": [ranks], "finding": {...} | null, ...}`` (the ``straggler`` finding, else the top one, as
   ``diagnose --json`` prints it; ``finding: null`` and ``reason`` when nothing was captured or diagnosed).

One watcher per run directory records: :meth:`Watcher.lock` takes an exclusive ``flock`` on
``{run_dir}/.watcher.lock`` (False when another holds it). A watcher built with ``record=False`` (``distprof watch
--once``) judges and shows, and never writes or captures. It never adds anything to the job's path: it reads files.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import math
import os
import stat
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from distprof.analysis.detect import RULES, Detection, Tracker
from distprof.analysis.records import to_json
from distprof.analysis.telemetry import TelemetryRun
from distprof.rundir.layout import DETECTIONS, MANIFEST, RUN_JSON, rank_dir
from distprof.rundir.manifest import MANIFEST_LIMIT, read_manifest
from distprof.rundir.store import append_line
from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = ["CAPTURE_TIMEOUT_S", "LOCK", "RankRow", "RoleView", "Snapshot", "Watcher", "options_from_config",
           "options_from_run", "read_detections"]

LOCK = ".watcher.lock"
CAPTURE_TIMEOUT_S = 600.0  # a request no rank answered within this is recorded without a finding
SHOWN_STEPS = 20  # steps per rank kept for the view
_READ_LIMIT = 16 << 20  # bytes of run.json / detections.jsonl read at most (untrusted files)
Send = Callable[[str, list[int], int, int], str]
Answers = Callable[[str], dict[tuple[str, int], str]]


def _read_small(path: str, limit: int = _READ_LIMIT) -> bytes | None:
    """At most ``limit`` bytes of a regular file (its newest part), never through a link; None when missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def options_from_run(run_dir: str) -> tuple[Any, dict[str, Any]]:
    """The run's ``detection`` options (defaults where run.json has none) and its whole config ({} without
    run.json). ValueError naming the field when run.json's ``detection`` is not valid."""
    cfg: dict[str, Any] = {}
    try:
        data = _read_small(os.path.join(run_dir, RUN_JSON))
        got = msgspec.json.decode(data).get("config") if data else None
        cfg = got if isinstance(got, dict) else {}
    except (OSError, msgspec.DecodeError, AttributeError) as e:
        logger.warning("distprof: watch: cannot read %s (%s); using the default detection settings",
                       os.path.join(run_dir, RUN_JSON), e)
    return options_from_config(cfg, os.path.join(run_dir, RUN_JSON)), cfg


def options_from_config(cfg: dict[str, Any], source: str) -> Any:
    """The ``detection`` options of a job's config (defaults where it has none); ValueError naming ``source`` and
    the field when they are not valid."""
    # Kept here: config.watch is pydantic, and `distprof watch` is an analysis verb (the CLI imports this module).
    from distprof.config.watch import DetectOptions

    det = cfg.get("detection")
    if det is None:
        return DetectOptions()
    if not isinstance(det, dict):
        raise ValueError(f"{source}: config.detection is {det!r:.200}; it must be a mapping of the detection "
                         "settings (docs/telemetry.md)")
    try:
        return DetectOptions.model_validate(det)
    except Exception as e:  # pydantic's ValidationError names the field and the fix (config/watch.py)
        raise ValueError(f"{source}: config.detection: {e}") from None


def read_detections(run_dir: str) -> list[dict[str, Any]]:
    """The lines of ``{run_dir}/detections.jsonl`` that are JSON objects (torn or foreign lines skipped)."""
    data = _read_small(os.path.join(run_dir, DETECTIONS)) or b""
    out = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("rule"), str):
            out.append(obj)
    return out


@dataclass
class RankRow:
    """One rank in the view: its step time and busy time (phases' sum) over the last steps (None: not reported)."""

    rank: int
    step_us: list[int | None]
    busy_us: list[int | None]
    last_us: int | None
    slow: bool = False
    """In a slow_rank episode now."""


@dataclass
class RoleView:
    role: str
    steps: list[int]
    """The last steps shown (oldest first), the columns of each rank's lists."""
    ranks: list[RankRow]
    newest_step: int | None
    judged_step: int | None
    """The last step the rules judged."""
    median_us: int | None
    """The median rank's step time in the newest step every rank reported."""
    slowest_rank: int | None
    """The rank that was busiest (phases; else step time) over the steps shown."""
    slowest_busy_us: int | None


@dataclass
class Snapshot:
    """What the watcher knows now: per role the last steps per rank; the detections (``recorded``: written to
    detections.jsonl); captures waiting; totals; what could not be read."""

    run_dir: str
    time: float
    roles: list[RoleView]
    detections: list[dict[str, Any]]
    pending: list[dict[str, Any]]
    detections_total: dict[str, int]
    captures_total: int
    errors: list[dict[str, Any]]
    recording: bool

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


@dataclass
class _Pending:
    detections: list[Detection]
    role: str
    ranks: list[int]
    request: str
    sent: float
    detected: float


@dataclass
class Watcher:
    run_dir: str
    options: Any
    send: Send | None = None
    answers: Answers | None = None
    capture: bool | None = None
    """Capture on detections; None: ``options.capture``."""
    record: bool = True
    """Write detections.jsonl and capture; False: judge and show only."""
    capture_timeout_s: float = CAPTURE_TIMEOUT_S
    clock: Callable[[], float] = time.time
    job_poll_s: float = 0.0
    """How often the job's processes look for capture requests (its ``trigger_poll_s``): sets the lead."""
    workers: int = 1
    """Processes the diagnosis of a capture reads with (the watcher may share a node with training)."""
    telemetry: TelemetryRun = field(default_factory=TelemetryRun)
    tracker: Tracker = field(init=False)
    recorded: list[dict[str, Any]] = field(default_factory=list)
    unrecorded: list[dict[str, Any]] = field(default_factory=list)
    pending: list[_Pending] = field(default_factory=list)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    captures_total: int = 0
    _lock_fd: int | None = None
    _seen: set[tuple[Any, ...]] = field(default_factory=set)
    _sent: collections.deque[float] = field(default_factory=collections.deque)
    _bytes: int = 0
    # role -> (first, last) steps not judged: a capture the watcher asked for slows the steps it records and the
    # export after them (the profiled ranks most); judging them would detect the watcher's own capture
    _quiet: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tracker = Tracker(self.options)
        if self.capture is None:
            self.capture = bool(self.options.capture)
        for line in read_detections(self.run_dir):
            self._remember(line)

    def _remember(self, line: dict[str, Any]) -> None:
        """A detection line (loaded or written): counted, never reported again, its capture against the limits."""
        self.recorded.append(line)
        self._seen.add((line.get("rule"), line.get("role"), line.get("rank"), line.get("step")))
        if line.get("rule") in RULES:
            self.counts[line["rule"]] += 1
        if line.get("request") and line.get("first_of_capture", True):
            self.captures_total += 1
            t = line.get("time")
            if isinstance(t, (int, float)):
                self._sent.append(float(t))
            b = line.get("bytes")
            if isinstance(b, int) and b > 0:
                self._bytes += b

    # ---- the lock ------------------------------------------------------------------------------------------------
    def lock(self) -> bool:
        """Become the run directory's recording watcher: True, or False when another watcher holds the lock.
        ValueError naming the file when ``.watcher.lock`` is not a regular file (a link, a FIFO)."""
        path = os.path.join(self.run_dir, LOCK)
        fix = "it must be a regular file (remove it: a watcher makes a new one)"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        except OSError as e:  # a link (ELOOP), a folder, no permission
            raise ValueError(f"{path}: cannot open the watcher's lock ({e.strerror}); {fix}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{path} is not a regular file; {fix}")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        return True

    def lock_holder(self) -> str:
        """Who holds the lock, as its file says (``pid N``), for the message of a second watcher."""
        data = _read_small(os.path.join(self.run_dir, LOCK), 64) or b""
        pid = data.decode(errors="replace").strip()
        return f"pid {pid}" if pid.isdigit() else "another process"

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # ---- one poll ------------------------------------------------------------------------------------------------
    def poll(self, final: bool = False) -> Snapshot:
        """Read, judge, act; the snapshot after it. ``final``: judge every step some rank reported (a snapshot of a
        finished or stopped run)."""
        self.telemetry.refresh(self.run_dir)
        series = list(self.telemetry.series.values())
        found = [d for d in self.tracker.update(series, final=final)
                 if (d.rule, d.role, d.rank, d.step) not in self._seen and not self._in_quiet(d)]
        groups: dict[tuple[str, str, int], list[Detection]] = {}
        for d in found:
            self._seen.add((d.rule, d.role, d.rank, d.step))
            groups.setdefault((d.rule, d.role, d.step), []).append(d)
        for group in groups.values():
            if self.record:
                self._act(group)
            else:
                for d in group:
                    self.counts[d.rule] += 1
                    self.unrecorded.append({**d.to_dict(), "recorded": False})
        if self.record:
            self._progress()
        self._trim(series)
        return self.snapshot()

    def _in_quiet(self, d: Detection) -> bool:
        """``d`` comes from steps around a capture the watcher asked for (slow_steps before its step)."""
        first = d.step - int(self.options.slow_steps) + 1
        roles = list(self._quiet) if d.rule == "bounding_role" else [d.role]
        return any(q[0] <= d.step and first <= q[1] for r in roles if (q := self._quiet.get(r)) is not None)

    def _trim(self, series: list[Any]) -> None:
        """Forget steps the rules judged and the view no longer shows (a watcher runs as long as the job)."""
        for s in series:
            cut = self.tracker.next_step.get(s.role, 0) - SHOWN_STEPS
            if s.steps and s.steps[0].step < cut:
                i = next((k for k, r in enumerate(s.steps) if r.step >= cut), len(s.steps))
                del s.steps[:i]

    # ---- acting on a detection -----------------------------------------------------------------------------------
    def _why_not(self) -> str | None:
        """Why no capture may be requested now (None: it may)."""
        o = self.options
        if not self.capture:
            return "capture is off (detection.capture false, or watch --no-capture)"
        if self.send is None:
            return "no way to send a capture request (the job has no trigger: true)"
        now = self.clock()
        while self._sent and self._sent[0] < now - 3600:
            self._sent.popleft()
        if len(self._sent) >= int(o.max_captures_per_hour):
            return (f"limit: {len(self._sent)} captures in the last hour (detection.max_captures_per_hour "
                    f"{o.max_captures_per_hour})")
        if self._bytes >= float(o.max_capture_mb) * 1e6:
            return (f"limit: the detections' captures hold {self._bytes / 1e6:.1f} MB (detection.max_capture_mb "
                    f"{o.max_capture_mb:g})")
        return None

    def _act(self, group: list[Detection]) -> None:
        first = group[0]
        ranks = sorted({d.rank for d in group if d.rank is not None})
        peer = next((d.peer for d in group if d.peer is not None and d.peer not in ranks), None)
        want = ranks + ([peer] if peer is not None else [])
        why = self._why_not()
        if why is None and not want:
            why = f"no rank to capture ({first.role} is not a role with telemetry)"
        if why is None and first.rule != "bounding_role" and not self.tracker.detector.in_episode(first.key):
            why = "the condition had cleared when the watcher read the steps (an old episode)"
        now = self.clock()
        if why is not None:
            logger.info("distprof: watch: %s: %s; not captured: %s", first.rule, first.message, why)
            for d in group:
                self._write(d, now, captured=[], finding=None, reason=why)
            return
        try:
            rid = self.send(first.role, want, int(self.options.capture_steps), self._lead(first.role))  # type: ignore[misc]
        except (ValueError, OSError) as e:
            why = f"the capture request failed: {e}"
            logger.warning("distprof: watch: %s: %s; not captured: %s", first.rule, first.message, why)
            for d in group:
                self._write(d, now, captured=[], finding=None, reason=why)
            return
        self._sent.append(now)
        self.captures_total += 1
        self._quiet[first.role] = (first.step + 1, 1 << 62)  # until its windows are published (_finish)
        logger.info("distprof: watch: %s: %s; capturing %s ranks %s (request %s)", first.rule, first.message,
                       first.role, ",".join(map(str, want)), rid)
        self.pending.append(_Pending(group, first.role, want, rid, time.monotonic(), now))

    def _lead(self, role: str) -> int:
        """Steps before the capture starts: ``lead_steps``, or more when the job's processes look for requests less
        often than that many steps take (every ``job_poll_s``: each selected rank must see the request before the
        agreed start, or it skips it)."""
        lead = int(self.options.lead_steps)
        if self.job_poll_s <= 0:
            return lead
        times = [r.dur_us for s in self.telemetry.series.values() if s.role == role for r in s.steps[-SHOWN_STEPS:]]
        if not times:
            return lead
        step_s = max(statistics.median(times) / 1e6, 1e-6)
        return min(max(lead, math.ceil(2 * self.job_poll_s / step_s) + 1), 1000)

    def _windows(self, p: _Pending) -> dict[int, list[Any]]:
        """The published windows of request ``p`` per rank (manifest lines carrying its id)."""
        out: dict[int, list[Any]] = {}
        for rank in p.ranks:
            try:
                data = _read_small(os.path.join(self.run_dir, rank_dir(p.role, rank), MANIFEST), MANIFEST_LIMIT)
            except OSError:
                continue
            recs = [r for r in read_manifest(data or b"").records if r.trigger == p.request and r.files]
            if recs:
                out[rank] = recs
        return out

    def _progress(self) -> None:
        """Finish the captures whose windows are all published (or answered otherwise, or timed out)."""
        still = []
        for p in self.pending:
            windows = self._windows(p)
            answered = set(windows)
            if self.answers is not None and len(answered) < len(p.ranks):
                try:
                    states = self.answers(p.request)
                except (ValueError, OSError) as e:
                    logger.debug("distprof: watch: trigger status of %s: %s", p.request, e)
                    states = {}
                answered |= {r for r in p.ranks if states.get((p.role, r)) in ("refused", "skipped")}
            late = time.monotonic() - p.sent > self.capture_timeout_s
            if len(answered) < len(p.ranks) and not late:
                still.append(p)
                continue
            self._finish(p, windows, late and len(answered) < len(p.ranks))
        self.pending = still

    def _finish(self, p: _Pending, windows: dict[int, list[Any]], late: bool) -> None:
        files = sorted({f.path for recs in windows.values() for r in recs for f in r.files})
        size = sum(f.bytes for recs in windows.values() for r in recs for f in r.files)
        self._bytes += size
        captured = sorted(windows)
        q = self._quiet.pop(p.role, None)  # no window: nothing was slowed; else the steps after the windows are
        if windows:  # quiet for as long as a rule needs to hold (the export runs beside them)
            last = max(r.last for recs in windows.values() for r in recs)
            self._quiet[p.role] = ((q[0] if q else p.detections[0].step + 1), last + 2 * int(self.options.slow_steps))
        finding, reason = None, None
        if not windows:
            reason = (f"no rank published a window for request {p.request} within {self.capture_timeout_s:g} s"
                      if late else f"every rank refused or skipped request {p.request}")
        else:
            steps = {s for recs in windows.values() for r in recs for s in range(r.first, r.last + 1)}
            finding, reason = self._diagnose(p.role, captured, steps)
            if late and reason is None:
                reason = f"ranks {sorted(set(p.ranks) - set(captured))} never published a window"
        what = finding["id"] if finding else f"no finding ({reason})"
        logger.info("distprof: watch: %s on %s ranks %s: %s", p.detections[0].rule, p.role,
                       ",".join(map(str, captured)) or "-", what if not finding else f"{what}: {finding['claim']}")
        for i, d in enumerate(p.detections):
            self._write(d, p.detected, captured=captured, finding=finding, reason=reason, request=p.request,
                        files=files, size=size, first=i == 0)

    def _diagnose(self, role: str, ranks: list[int], steps: set[int]) -> tuple[dict[str, Any] | None, str | None]:
        # analyze reads traces with the whole analysis stack; imported when a capture is diagnosed (it is heavy and
        # a watcher that never captures does not need it)
        from distprof.analysis.analyze import diagnose_result
        from distprof.trace.selection import Selection

        sel = Selection(ranks=frozenset(ranks), roles=(role,), steps=frozenset(steps), steps_only=True)
        try:
            res = diagnose_result(self.run_dir, sel, workers=self.workers)
        except Exception as e:  # untrusted files: the detection is recorded whatever the diagnosis says
            return None, f"the diagnosis failed: {type(e).__name__}: {e}"
        findings = list(res.findings)
        if not findings:
            return None, "the diagnosis found nothing on the captured steps"
        best = next((f for f in findings if f.id == "straggler"), findings[0])
        return to_json(best), None

    def _write(self, d: Detection, when: float, captured: list[int], finding: dict[str, Any] | None,
               reason: str | None, request: str | None = None, files: list[str] | None = None, size: int = 0,
               first: bool = True) -> None:
        extra = {k: v for k, v in d.to_dict().items() if k not in ("role", "rank", "step", "rule")}
        line: dict[str, Any] = {"role": d.role, "rank": d.rank, "step": d.step, "rule": d.rule, "captured": captured,
                                "finding": finding, **extra, "time": round(when, 3), "request": request,
                                "files": files or [], "bytes": size}
        if not first:
            line["first_of_capture"] = False  # one capture shared by detections of one step: counted once
        if reason is not None:
            line["reason"] = reason
        try:
            append_line(os.path.join(self.run_dir, DETECTIONS), msgspec.json.encode(line) + b"\n")
        except OSError as e:
            logger.warning("distprof: watch: cannot append to %s: %s", os.path.join(self.run_dir, DETECTIONS), e)
        self.recorded.append(line)
        self.counts[d.rule] += 1

    # ---- the view ------------------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        by_role: dict[str, list[Any]] = {}
        for s in self.telemetry.series.values():
            by_role.setdefault(s.role, []).append(s)
        roles = [self._role_view(role, sorted(ss, key=lambda s: s.rank)) for role, ss in sorted(by_role.items())]
        pending = [{"rule": p.detections[0].rule, "role": p.role, "ranks": p.ranks, "request": p.request,
                    "step": p.detections[0].step} for p in self.pending]
        return Snapshot(self.run_dir, self.clock(), roles, self.recorded + self.unrecorded, pending,
                        {r: self.counts.get(r, 0) for r in RULES}, self.captures_total,
                        [p.file_dict() if isinstance(p, Problem) else p for p in self.telemetry.errors],
                        self.record and self._lock_fd is not None)

    def _role_view(self, role: str, ranks: list[Any]) -> RoleView:
        newest = max((s.steps[-1].step for s in ranks if s.steps), default=None)
        steps = sorted({r.step for s in ranks for r in s.steps[-SHOWN_STEPS:]})[-SHOWN_STEPS:]
        rows, busy_mean = [], {}
        for s in ranks:
            by = {r.step: r for r in s.steps[-2 * SHOWN_STEPS:]}
            st = [by[k].dur_us if k in by else None for k in steps]
            bu = [(sum(by[k].phases.values()) if by[k].phases else by[k].dur_us) if k in by else None for k in steps]
            known = [b for b in bu if b is not None]
            if known:
                busy_mean[s.rank] = sum(known) / len(known)
            slow = self.tracker.detector.in_episode(("slow_rank", role, s.rank))
            rows.append(RankRow(s.rank, st, bu, s.steps[-1].dur_us if s.steps else None, slow))
        complete = [i for i in range(len(steps)) if all(r.step_us[i] is not None for r in rows)]
        med = None
        if complete:
            med = round(statistics.median(r.step_us[complete[-1]] or 0 for r in rows))
        slowest = max(busy_mean, key=lambda k: (busy_mean[k], -k)) if busy_mean else None
        judged = self.tracker.next_step.get(role)
        return RoleView(role, steps, rows, newest, judged - 1 if judged is not None else None, med, slowest,
                        round(busy_mean[slowest]) if slowest is not None else None)
