"""Worker-side RPCs (a mixin for Ray actor classes), their driver-side group, and several groups driven at once."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from distprof.capture.profiler import Profiler
from distprof.capture.trigger import aligned_start, make_request
from distprof.config.mesh import RankMesh
from distprof.config.model import ProfilerConfig
from distprof.config.plan import role_selected
from distprof.rundir.layout import is_url
from distprof.rundir.store import list_files
from distprof.util.envvars import WRAPPED_BY
from distprof.util.procfs import parent_pid
from distprof.util.raynodes import expand_on_node, names_variables

logger = logging.getLogger(__name__)

__all__ = ["ProfiledGroup", "ProfiledWorker", "start_all", "step_all", "stop_all", "trigger_all"]


class ProfiledWorker:
    """Mix into a Ray actor class: ``@ray.remote class Actor(ProfiledWorker): ...``.

    The group calls ``setup_profiler`` with the role and this worker's rank in the group;
    the worker's own code may also use ``self.profiler`` (e.g. ``self.profiler.step()``
    per micro-step) and ``distprof.annotate``.
    """

    profiler: Profiler | None = None

    def setup_profiler(self, config: ProfilerConfig | dict, role: str, rank: int, world_size: int,
                       global_step: int = 0, mesh: Any = None) -> dict[str, Any]:
        config = _save_path_on_this_node(config)
        self.profiler = Profiler(config, role=role, global_step=global_step, rank=rank, world_size=world_size,
                                 mesh=mesh, local_rank=0)  # per_node is refused for groups: no local rank needed
        return self.profiler_where()

    def start_profile(self) -> int:
        p = self._profiler()
        p.start()
        return p.global_step

    def profile_step(self, export: bool = True) -> int:
        """End the step (``Profiler.step``); ``export=False`` holds a closing window's writing for
        ``profile_export``."""
        p = self._profiler()
        p.step(export=export)
        return p.global_step

    def profile_export(self) -> bool:
        """Write the window a ``profile_step(export=False)`` closed (``Profiler.export``); False if none."""
        return self._profiler().export()

    def stop_profile(self) -> int:
        p = self._profiler()
        p.stop()
        p.wait_engine()  # the engine's last traces are on disk before collect lists this worker's files
        return p.global_step

    def profile_trigger(self, request: Any) -> dict[str, Any] | None:
        """Hand an on-demand capture request to this worker's profiler (``trigger_all``): its acknowledgement,
        also written under this worker's save_path; None when the request does not select this worker."""
        return self._profiler().trigger_request(request)

    def profiler_step(self) -> int:
        """The global step this worker's profiler is about to run."""
        return self._profiler().global_step

    def profiler_summary(self) -> dict[str, Any]:
        p = self._profiler()
        return {"role": p.role, "rank": p.rank, "global_step": p.global_step, "enabled": p.enabled,
                "windows": p.windows_closed, "summary": p.summary(), "annotations": p.annotation_times(total=True)}

    def profiler_where(self) -> dict[str, Any]:
        """Where this worker runs and writes: node, pid, parent pids (a process wrapper's pid names its output)."""
        import ray

        p = self._profiler()
        ppid = os.getppid()
        gppid = parent_pid(ppid)
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "ppid": ppid,
                # Ray's names for this process (its task timeline's): integrations/ray/timeline.py maps them to
                # role, rank.
                "worker_id": ctx.get_worker_id(), "actor_id": ctx.get_actor_id(),
                "gppid": gppid, "save_path": p.config.save_path, "role": p.role, "rank": p.rank,
                # The folder as this node resolves it (its own home, cwd): collect lists exactly this one.
                "save_root": None if is_url(self._save_path()) else
                os.path.abspath(os.path.expanduser(self._save_path().removeprefix("file://"))),
                "wrapped_by": os.environ.get(WRAPPED_BY)}

    def collect_profile(self) -> list[dict[str, Any]]:
        """The finished files under this worker's save_path on its node: ``[{"path", "bytes"}]``."""
        return list_files(os.path.abspath(os.path.expanduser(self._save_path())))

    def _profiler(self) -> Profiler:
        if self.profiler is None:
            raise RuntimeError("setup_profiler() was not called on this worker")
        return self.profiler

    def _save_path(self) -> str:
        path = self._profiler().config.save_path
        if path is None:
            raise RuntimeError("this worker's profiler has no save_path (profiling is off in its config)")
        return path


def _save_path_on_this_node(config: ProfilerConfig | dict) -> ProfilerConfig:
    """The config with ``$VARS`` and ``~`` of its save_path expanded here, on the worker's node: node-local
    scratch folders differ per node (``save_path: $TMPDIR/profile``). An unset variable is a ValueError."""
    if isinstance(config, dict):
        config = ProfilerConfig.from_dict(config)
    path = config.save_path
    if path and not is_url(path) and (names_variables(path) or path.startswith("~")):
        config = config.model_copy(update={"save_path": expand_on_node(path, "save_path")})
    return config


class ProfiledGroup:
    """Drive the profilers of one worker group (one role) from the driver.

    Calls go only to the ranks the config selects, and not at all when profiling is off
    or the role is not selected; with ``telemetry: true``, to every rank (each keeps its step
    telemetry, and the watcher may ask any of them for a capture). A worker whose RPC fails is
    logged (once per worker) and skipped from then on; the training step is never failed by
    the profiler.

    A job with several groups drives them together with ``step_all(groups)`` (and
    ``start_all`` / ``stop_all`` / ``with profiling(groups):``): the methods here are the
    one-group case of the same calls.
    """

    def __init__(self, workers: Sequence[Any], config: ProfilerConfig | dict, role: str,
                 global_step: int = 0, timeout_s: float = 300.0, mesh: Any = None):
        self.base_config = config if isinstance(config, ProfilerConfig) else ProfilerConfig.from_dict(config)
        self.config = self.base_config.for_role(role)
        self._start_step = global_step
        self.role = role
        self.workers = list(workers)
        self.timeout_s = timeout_s
        self.where: dict[int, dict[str, Any]] = {}  # rank -> profiler_where(), kept for collect()
        self.failed: dict[int, str] = {}
        self._requested: dict[int, int] = {}  # rank -> last step of an accepted on-demand window (step_all exports)
        capture = (self.config.enable or self.config.trigger) and role_selected(self.config.roles, role)
        telemetry = self.config.telemetry  # every rank of every role keeps its step telemetry, captured or not
        on = capture or telemetry
        if on:
            self.config.check_world_size(len(self.workers))
        if on and self.config.per_node is not None:
            raise ValueError(f"per_node={self.config.per_node} needs each worker's local rank, which a worker group "
                             "does "
                             "not know; select ranks with ranks: [...] or mesh coordinates instead")
        self.active = {r: w for r, w in enumerate(self.workers)
                       if telemetry or (capture and self.config.selects_rank(r, len(self.workers), mesh))}
        self._plan = self.config.plan() if self.active else None  # which steps close a window (step_all)
        if self.active:
            plain_mesh = RankMesh.of(mesh) if mesh is not None else None  # a DeviceMesh does not travel; this does
            results = self._call("setup_profiler", self.config, role, _OWN_RANK, len(self.workers), global_step,
                                 plain_mesh)
            self.where.update({r: v for r, v in results.items() if isinstance(v, dict)})

    def start(self) -> dict[int, Any]:
        return self._call("start_profile")

    def step(self) -> dict[int, Any]:
        return step_all([self])[0]

    def stop(self) -> dict[int, Any]:
        return self._call("stop_profile")

    def summary(self) -> list[dict[str, Any]]:
        return [v for _, v in sorted(self._call("profiler_summary").items())]

    def trigger(self, steps: int, **kw: Any) -> dict[str, Any]:
        """Capture ``steps`` steps on this group's workers on demand: ``trigger_all([self], ...)``."""
        return trigger_all([self], steps, **kw)

    def __enter__(self) -> ProfiledGroup:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.stop()
        return False

    def _call(self, method: str, *args: Any) -> dict[int, Any]:
        """Call ``method`` on every live selected worker; per-rank results, failures logged and dropped."""
        return _call_all([self], method, *args)[0]

    def _closes_window(self, step: int) -> bool:
        """Does the plan close a capture window at the end of global step ``step``?"""
        w = self._plan.next_window(step) if self._plan is not None else None
        return w is not None and w.start <= step == w.end

    def _closes_on(self, rank: int, step: int) -> bool:
        """Does ``rank`` close a window at the end of ``step`` (a planned one, or one it accepted on request)?"""
        if self._requested.get(rank) == step:
            del self._requested[rank]
            return True
        return self._closes_window(step)

    def _submit(self, method: str, args: tuple, only: set[int] | None = None) -> dict[int, Any]:
        """Send ``method`` to every live selected worker (of ``only``, if given) without waiting: rank -> ObjectRef."""
        refs = {}
        for r, w in self.active.items():
            if r in self.failed or (only is not None and r not in only):
                continue
            call_args = tuple(r if a is _OWN_RANK else a for a in args)
            try:
                refs[r] = getattr(w, method).remote(*call_args)
            except Exception as e:  # a handle that cannot take calls any more
                self._fail(method, r, e)
        return refs

    def _gather(self, method: str, refs: dict[int, Any], deadline: float) -> dict[int, Any]:
        """Wait for the refs ``_submit`` returned until ``deadline`` (monotonic); failures logged and dropped."""
        import ray

        out: dict[int, Any] = {}
        for r, ref in refs.items():
            try:
                out[r] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except Exception as e:  # a dead actor, a timeout, or the worker's own error
                self._fail(method, r, e)
        return out

    def _fail(self, method: str, rank: int, e: Exception) -> None:
        self.failed[rank] = f"{type(e).__name__}: {e}"
        logger.error("distprof: %s on %s rank %d failed; profiling of that worker is off from now on: %s",
                     method, self.role, rank, self.failed[rank])


# Stands for "each worker's own rank" in _call's arguments (setup_profiler takes it).
_OWN_RANK = object()


def start_all(groups: Iterable[ProfiledGroup]) -> list[dict[int, Any]]:
    """Start profiling on every selected worker of every group, all at once.

    Every ``start_profile`` RPC is sent before any is waited for, so no group's start
    (which opens a capture window when the plan says so) waits for another group's.
    Returns, per group in the order given, ``{rank: global_step}`` of the workers that
    answered; a failing worker is logged once and skipped from then on.
    """
    return _call_all(groups, "start_profile")


def step_all(groups: Iterable[ProfiledGroup]) -> list[dict[int, Any]]:
    """End the current step on every selected worker of every group, together.

    Call once per training step, after the step's work, in place of one ``group.step()``
    per group. Two rounds: every worker ends its step (``ProfilerStep#N`` closes) without
    writing anything, all RPCs sent before any is waited for; only then do the workers whose
    capture window closed at this step write their traces, in parallel. So a trace export
    never lands inside another group's step, which stepping groups one after another would
    do (each export inside the next group's ``ProfilerStep``). Returns, per group in the order
    given, ``{rank: global_step}`` of the workers that answered; a failing worker is logged
    once and skipped from then on, and the training step is never failed.
    """
    groups = _as_groups(groups)
    ended = _call_all(groups, "profile_step", False)
    # Second round only to the workers whose plan closed a window at the step that just ended.
    _call_all(groups, "profile_export", only=[{r for r, g in e.items() if grp._closes_on(r, g - 1)}
                                               for grp, e in zip(groups, ended, strict=True)])
    return ended


def stop_all(groups: Iterable[ProfiledGroup]) -> list[dict[int, Any]]:
    """Stop profiling on every selected worker of every group, all at once.

    A window still open is closed and exported by each worker in parallel, none waiting
    for another group's export. Returns per group ``{rank: global_step}``, as ``step_all``.
    """
    return _call_all(groups, "stop_profile")


def trigger_all(groups: Iterable[ProfiledGroup], steps: int, ranks: Any = None, roles: Any = None,
                backend: str = "torch", flags: Any = None, lead_steps: int = 2, align: int = 1,
                tag: str = "") -> dict[str, Any]:
    """Capture ``steps`` global steps on demand on every selected worker of ``groups``, through Ray (no shared
    filesystem needed). Call it from the driver between steps (as ``step_all``).

    The driver asks every worker its step, and names the start itself: the first multiple of ``align`` at
    least ``lead_steps`` after the furthest worker, so every worker captures the same global steps. Each worker
    answers by the rule of a polled request (refused over its ``trigger_max_steps``, ...) and writes its
    acknowledgement under its own save_path too. Returns ``{"id", "start_step", "acks": {role: {rank: ack}}}``.
    """
    groups = _as_groups(groups)
    now = [step for per_group in _call_all(groups, "profiler_step") for step in per_group.values()]
    if not now:
        raise ValueError("trigger_all: no worker of these groups takes requests (is trigger: true set, and are "
                         "they started?)")
    probe = make_request(steps, ranks, roles, backend, flags, lead_steps, align, tag=tag)  # validates arguments
    req = make_request(steps, probe.ranks, probe.roles, backend, probe.flags, lead_steps, align,
                       start_step=aligned_start(max(now), lead_steps, align), tag=tag)
    answers = _call_all(groups, "profile_trigger", req)
    acks: dict[str, dict[int, Any]] = {}
    for g, per_rank in zip(groups, answers, strict=True):
        for r, ack in per_rank.items():
            if ack is None:
                continue
            acks.setdefault(g.role, {})[r] = ack
            if ack["state"] == "accepted":
                g._requested[r] = ack["steps"][1]
    return {"id": req.id, "start_step": req.start_step, "acks": acks}


def _call_all(groups: Iterable[ProfiledGroup], method: str, *args: Any,
              only: list[set[int]] | None = None) -> list[dict[int, Any]]:
    """Send ``method`` to every group's live selected workers (per group, those in ``only``), then wait:
    per group, ``{rank: result}``."""
    groups = _as_groups(groups)
    # Every RPC goes out before the first wait: a slow worker delays only its own answer, never the
    # moment another worker's call runs.
    sent = [(g, g._submit(method, args, only[k] if only is not None else None), time.monotonic() + g.timeout_s)
            for k, g in enumerate(groups)]
    return [g._gather(method, refs, deadline) for g, refs, deadline in sent]


def _as_groups(groups: Iterable[ProfiledGroup]) -> list[ProfiledGroup]:
    if isinstance(groups, ProfiledGroup):
        raise ValueError(f"groups must be a list of ProfiledGroup, got one ProfiledGroup (role {groups.role!r}); "
                         "pass [group], or call group.step() / start() / stop()")
    out = list(groups)
    for g in out:
        if not isinstance(g, ProfiledGroup):
            raise ValueError(f"groups must hold ProfiledGroup objects, got {type(g).__name__} {g!r}; "
                             "wrap each worker list in ProfiledGroup(workers, config, role)")
    if len({id(g) for g in out}) != len(out):
        roles = [g.role for g in out]
        raise ValueError(f"groups lists the same ProfiledGroup more than once (roles {roles}); "
                         "pass each group once, or every worker would step twice")
    return out
