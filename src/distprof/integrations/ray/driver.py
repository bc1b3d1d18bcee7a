"""The driver role: the process that runs the RL loop, profiled with its worker groups.

``DriverGroup(config, groups)`` is a :class:`~.workers.ProfiledGroup` whose one "worker" is this process (role
``driver``, rank 0 of 1): ``start_all`` / ``step_all`` / ``stop_all`` / ``profiling`` / ``collect`` drive it with
the other groups, at the same planned global steps and with the same config (``per_role: {driver: ...}``
applies; ``roles`` selects it, ``ranks`` does not: the driver is one process). ``with profiling(groups,
driver=True) as groups:`` adds one, so the loop needs no more lines; the driver's ``distprof.annotate`` phases
(``driver/generate``, ``driver/update`` ...) land in its own trace.

For every window it captures, the driver also keeps Ray's own task and actor-method timeline of the cluster,
cut to the window (:mod:`.timeline`): fetched after the window closes, on a thread of its own, never inside a
step; a failure is one logged warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from distprof.config.model import ProfilerConfig
from distprof.config.plan import role_selected
from distprof.integrations.ray.timeline import TimelineKeeper
from distprof.integrations.ray.workers import ProfiledGroup, ProfiledWorker, _as_groups, start_all, stop_all
from distprof.rundir.layout import DRIVER_ROLE

logger = logging.getLogger(__name__)

__all__ = ["DRIVER_ROLE", "DriverGroup", "profiling"]


class DriverGroup(ProfiledGroup):
    """The driver process as a group of one: its profiler runs here, its calls are local (never an RPC).

    ``groups``: the job's worker groups, whose actors and ranks name the workers in Ray's timeline.
    ``ray_timeline``: keep Ray's task timeline for every window (default True).
    """

    def __init__(self, config: ProfilerConfig | dict, groups: Iterable[ProfiledGroup] = (), global_step: int = 0,
                 ray_timeline: bool = True, timeline_timeout_s: float = 30.0):
        base = config if isinstance(config, ProfilerConfig) else ProfilerConfig.from_dict(config)
        own = base.for_role(DRIVER_ROLE)
        if own.ranks != "all" or own.per_node is not None:  # one process: rank 0 of 1, whatever ranks the workers use
            own = own.model_copy(update={"ranks": "all", "per_node": None})
        self.base_config = base
        self._start_step = global_step
        self.config = own
        self.role = DRIVER_ROLE
        self.timeout_s = timeline_timeout_s
        self.where: dict[int, dict[str, Any]] = {}
        self.failed: dict[int, str] = {}
        self._requested: dict[int, int] = {}
        self._local = ProfiledWorker()
        self.workers = [self._local]
        # A process backend wraps a worker process from its runtime_env: the driver's process is not wrapped.
        on = own.enable and role_selected(own.roles, DRIVER_ROLE) and not own.is_process_backend
        self.active = {0: self._local} if on else {}
        self._plan = own.plan() if on else None
        self._timeline = None
        self._results: dict[int, Any] = {}
        if not on:
            return
        try:
            self.where[0] = self._local.setup_profiler(own, DRIVER_ROLE, 0, 1, global_step)
        except ValueError:
            raise
        except Exception as e:  # Ray not initialised, a save_path it cannot create...: the job goes on
            self._fail("setup_profiler", 0, e)
            return
        save_path = self._local._profiler().config.save_path
        if ray_timeline and save_path is not None:  # (enable: true comes with a save_path)
            self._timeline = TimelineKeeper(save_path, list(groups), self.where[0], timeout_s=timeline_timeout_s)

    def _submit(self, method: str, args: tuple, only: set[int] | None = None) -> dict[int, Any]:
        """Run ``method`` here, now (the other groups' RPCs went out first: ``profiling`` puts the driver last)."""
        if 0 not in self.active or 0 in self.failed or (only is not None and 0 not in only):
            return {}
        try:
            result = getattr(self._local, method)(*args)
        except Exception as e:
            self._fail(method, 0, e)
            return {}
        if self._timeline is not None:
            self._note(method, result)
        return {0: result}

    def _gather(self, method: str, refs: dict[int, Any], deadline: float) -> dict[int, Any]:
        return refs  # already the results

    def _note(self, method: str, result: Any) -> None:
        """Step boundaries for the timeline: when each step began, and a window closing."""
        now, tl = time.time(), self._timeline
        if tl is None or self._plan is None:  # (called only while the timeline is kept)
            return
        if method == "start_profile":
            tl.step_began(result, now)
        elif method == "profile_step":  # result: the step about to run; the one before just ended
            ended = result - 1
            # Seen from the first step since the last window (next_window clips a window to the step it is asked
            # from): the window's first step, or the first this process ran (a resumed job).
            w = self._plan.next_window(min(min(tl.began, default=ended), ended))
            if w is not None and w.start <= ended == w.end:
                tl.window_closed(w.start, w.end, now)
            tl.step_began(result, now)
        elif method == "stop_profile":
            tl.flush()

    @property
    def timeline(self) -> Any:
        """The :class:`~.timeline.TimelineKeeper` (None when off): its ``written`` lists the files so far."""
        return self._timeline


@contextmanager
def profiling(groups: Iterable[ProfiledGroup], driver: bool = False) -> Iterator[list[ProfiledGroup]]:
    """``with profiling(groups):`` runs ``start_all(groups)`` on entry and ``stop_all(groups)``
    on exit (an exception included); call ``step_all(groups)`` at the end of every step inside.
    Yields the groups as a list. ``driver=True``: the list yielded ends with a
    :class:`~.driver.DriverGroup` (this process as role ``driver``, with the first group's config, and
    Ray's task timeline of every window): step and collect that list (``with profiling(groups,
    driver=True) as groups:``).
    """
    groups = _as_groups(groups)
    if driver and groups and not any(g.role == DRIVER_ROLE for g in groups):
        groups = _as_groups([*groups, DriverGroup(groups[0].base_config, groups, groups[0]._start_step)])
    start_all(groups)
    try:
        yield groups
    finally:
        stop_all(groups)
