"""Ray's own task and actor-method timeline of the cluster, kept for every window the driver captures.

What Ray offers (2.60, checked here): ``ray.timeline()`` reads every task's profile events from the GCS (no
dashboard needed, unless ``RAY_enable_task_events_to_dashboard_head`` is set, when it reads them from the
dashboard), but first sleeps one second and logs a warning on every call. The events behind it,
``ray._private.state.state.profile_events()``, come from the same GCS call without either (about 5 ms for a few
dozen tasks; it returns every event the GCS holds, up to ``RAY_task_events_max_num_task_in_gcs`` tasks, so its
cost grows with the cluster's history, not the window): used when present, ``ray.timeline()`` otherwise. The state
API (``ray.util.state.list_tasks``) needs the dashboard: not used.

Workers report their events to the GCS every ``RAY_task_events_report_interval_ms`` (1 s by default), so a
window's events are fetched on a thread of this module once that long has passed after the window closed (never
on the training thread; ``flush`` at ``stop`` waits for the last ones, bounded). Each window becomes one file of
the ``driver`` role, ``driver/rank00000/step{A}-{B}.ray_timeline.json.gz`` (:func:`~..rundir.layout.ray_timeline_name`),
published with its manifest line (``backend: ray_timeline``) by the one writer every window takes
(:func:`~..rundir.publish.publish`). Its JSON object: ``traceEvents`` (Chrome trace "X" events, ``ts``/``dur`` in
epoch µs, as ``ray.timeline()`` writes them: open it in Perfetto), ``window`` ``{"start_us", "end_us"}`` (epoch
µs), ``steps`` ``[A, B]``, ``own_methods`` (distprof's RPCs: not the job's work) and ``workers``: ``[{"role",
"rank", "worker_id", "actor_id", "pid", "node_id"}]``, the map from Ray's workers and actors to distprof's (role,
rank). :mod:`distprof.analysis.ray_timeline` reads it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import time
from typing import Any

from distprof.integrations.ray.workers import ProfiledWorker
from distprof.rundir.layout import RAY_TIMELINE, rank_dir, ray_timeline_name
from distprof.rundir.publish import publish
from distprof.rundir.store import RunDir
from distprof.util.runtime import host_name

logger = logging.getLogger(__name__)

__all__ = ["TimelineKeeper", "fetch_events", "own_methods", "window_events", "worker_map"]

_MARGIN_S = 0.5  # on top of Ray's report interval: a window's last events have reached the GCS


def report_interval_s() -> float:
    """How often Ray's workers send their task events to the GCS (``RAY_task_events_report_interval_ms``)."""
    try:
        return max(0.0, float(os.environ.get("RAY_task_events_report_interval_ms", "1000")) / 1e3)
    except ValueError:
        return 1.0


def worker_map(groups: list[Any], driver_where: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``[{"role", "rank", "worker_id", "actor_id", "pid", "node_id"}]`` for every worker of ``groups`` (those a
    group never set up, unselected ranks included, by their actor id alone) and the driver."""
    out = []
    for g in groups:
        for rank, handle in enumerate(g.workers):
            where = g.where.get(rank, {})
            actor = where.get("actor_id")
            if actor is None:
                aid = getattr(handle, "_actor_id", None)  # the handle's id (no public accessor on a handle)
                actor = aid.hex() if aid is not None and hasattr(aid, "hex") else None
            out.append({"role": g.role, "rank": rank, "worker_id": where.get("worker_id"), "actor_id": actor,
                        "pid": where.get("pid"), "node_id": where.get("node_id")})
    if driver_where:
        out.append({"role": driver_where.get("role", "driver"), "rank": 0, "worker_id": driver_where.get("worker_id"),
                    "actor_id": None, "pid": driver_where.get("pid"), "node_id": driver_where.get("node_id")})
    return out


def own_methods() -> list[str]:
    """distprof's own RPCs on a worker (``profile_step``, ``profile_export`` ...): profiling, not the job's work."""
    return sorted(n for n, v in vars(ProfiledWorker).items() if callable(v) and not n.startswith("_"))


def fetch_events() -> list[dict[str, Any]]:
    """Every task profile event the cluster holds, as ``ray.timeline()`` gives them (Chrome "X" events, epoch µs)."""
    try:
        from ray._private.state import state
    except ImportError:
        state = None
    if state is None or not hasattr(state, "profile_events"):
        import ray

        return list(ray.timeline())  # sleeps 1 s and warns; still correct
    out = []
    for component, events in state.profile_events().items():
        for e in events:
            if e.get("component_type") not in ("worker", "driver"):
                continue
            extra = e.get("extra_data") if isinstance(e.get("extra_data"), dict) else {}
            out.append({"cat": e["event_type"], "name": extra.get("name", e["event_type"]),
                        "ph": "X", "pid": e.get("node_ip_address"), "tid": f"{e['component_type']}:{component}",
                        "ts": e["start_time"] / 1e3, "dur": (e["end_time"] - e["start_time"]) / 1e3, "args": extra})
    return out


def window_events(events: list[dict[str, Any]], start_us: float, end_us: float) -> list[dict[str, Any]]:
    """The events that overlap ``[start_us, end_us]`` (kept whole), in time order."""
    kept = [e for e in events if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
            and e["ts"] <= end_us and e["ts"] + e["dur"] >= start_us]
    return sorted(kept, key=lambda e: e["ts"])


class TimelineKeeper:
    """The driver's keeper of Ray timelines: one file per closed window, fetched off the training thread."""

    def __init__(self, save_path: str, groups: list[Any], driver_where: dict[str, Any], timeout_s: float = 30.0):
        self.run = RunDir(save_path)
        self.groups = groups
        self.driver_where = driver_where
        self.timeout_s = timeout_s
        self.began: dict[int, float] = {}  # step -> wall time it began (only steps still needed)
        self.written: list[str] = []  # paths (relative to save_path) published so far
        self.failures: list[str] = []
        self._threads: list[threading.Thread] = []
        self._warned = False

    def step_began(self, step: int, now: float) -> None:
        self.began[step] = now

    def window_closed(self, first: int, last: int, now: float) -> None:
        """Fetch the timeline of steps ``first..last`` (began at ``began[first]``, ended ``now``) once Ray has it."""
        t0 = self.began.get(first, min(self.began.values(), default=now))
        self.began = {s: t for s, t in self.began.items() if s > last}
        due = now + report_interval_s() + _MARGIN_S
        t = threading.Thread(target=self._keep, args=(first, last, t0, now, due), daemon=True,
                             name=f"distprof-ray-timeline-{first}-{last}")
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait (bounded) for the windows' timelines still being fetched; False if one is still running."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s) + report_interval_s()
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        late = [t.name for t in self._threads if t.is_alive()]
        if late:
            self._warn(f"still fetching after {self.timeout_s:.0f} s: {', '.join(late)}; those windows' Ray "
                       "timeline may be missing")
        return not late

    def _keep(self, first: int, last: int, t0: float, t1: float, due: float) -> None:
        try:
            delay = due - time.time()
            if delay > 0:
                threading.Event().wait(delay)  # Ray's workers report their events to the GCS every interval
            events = window_events(fetch_events(), t0 * 1e6, t1 * 1e6)
            self._write(first, last, t0, t1, events)
        except Exception as e:  # never into the job: one warning
            self._warn(f"cannot keep Ray's timeline of steps {first}-{last}: {type(e).__name__}: {e}")

    def _write(self, first: int, last: int, t0: float, t1: float, events: list[dict[str, Any]]) -> None:
        doc = {"kind": RAY_TIMELINE, "steps": [first, last], "window": {"start_us": t0 * 1e6, "end_us": t1 * 1e6},
               "workers": worker_map(self.groups, self.driver_where), "own_methods": own_methods(),
               "traceEvents": events}
        rel_dir = rank_dir(self.driver_where.get("role", "driver"), 0)
        name = ray_timeline_name(first, last)
        tmp = self.run.temp_path(rel_dir, name)
        with open(tmp, "wb") as f:
            f.write(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6))
        line = publish(self.run, rel_dir, [(tmp, name)], dict(
            role=self.driver_where.get("role", "driver"), rank=0, world_size=1, steps=[first, last], complete=True,
            start_time=t0, end_time=t1, host=host_name(), pid=os.getpid(), backend=RAY_TIMELINE,
            summary={"events": len(events), "workers": len(doc["workers"])}), "driver rank 0 (Ray timeline)")
        if line is not None and line.file:
            self.written.append(line.file)

    def _warn(self, text: str) -> None:
        self.failures.append(text)
        if not self._warned:
            self._warned = True
            logger.warning("distprof: %s", text)
        else:
            logger.debug("distprof: %s", text)
