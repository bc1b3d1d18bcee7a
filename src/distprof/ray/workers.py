"""Worker-side RPCs (a mixin for Ray actor classes) and their driver-side group."""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

from ..config import ProfilerConfig
from ..plan import rank_selected, role_selected
from ..profiler import Profiler

logger = logging.getLogger(__name__)

__all__ = ["ProfiledWorker", "ProfiledGroup"]


class ProfiledWorker:
    """Mix into a Ray actor class: ``@ray.remote class Actor(ProfiledWorker): ...``.

    The group calls ``setup_profiler`` with the role and this worker's rank in the group;
    the worker's own code may also use ``self.profiler`` (e.g. ``self.profiler.step()``
    per micro-step) and ``distprof.annotate``.
    """

    profiler: Profiler | None = None

    def setup_profiler(self, config: ProfilerConfig | dict, role: str, rank: int, world_size: int,
                       global_step: int = 0) -> dict[str, Any]:
        self.profiler = Profiler(config, role=role, global_step=global_step, rank=rank, world_size=world_size)
        return self.profiler_where()

    def start_profile(self) -> int:
        p = self._profiler()
        p.start()
        return p.global_step

    def profile_step(self) -> int:
        p = self._profiler()
        p.step()
        return p.global_step

    def stop_profile(self) -> int:
        p = self._profiler()
        p.stop()
        return p.global_step

    def profiler_summary(self) -> dict[str, Any]:
        p = self._profiler()
        return {"role": p.role, "rank": p.rank, "global_step": p.global_step, "enabled": p.enabled,
                "windows": p.windows_closed, "summary": p.summary(), "annotations": p.annotation_times(total=True)}

    def profiler_where(self) -> dict[str, Any]:
        """Where this worker runs and writes: node, pid, parent pids (a process wrapper's pid names its output)."""
        import ray

        from ..backends.process import parent_pid

        p = self._profiler()
        ppid = os.getppid()
        gppid = parent_pid(ppid)
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "ppid": ppid,
                "gppid": gppid, "save_path": p.config.save_path, "role": p.role, "rank": p.rank,
                "wrapped_by": os.environ.get("DISTPROF_WRAPPED_BY")}

    def collect_profile(self) -> list[dict[str, Any]]:
        """The finished files under this worker's save_path on its node: ``[{"path", "bytes"}]``."""
        from .collect import list_files

        return list_files(os.path.abspath(os.path.expanduser(self._profiler().config.save_path)))

    def _profiler(self) -> Profiler:
        if self.profiler is None:
            raise RuntimeError("setup_profiler() was not called on this worker")
        return self.profiler


class ProfiledGroup:
    """Drive the profilers of one worker group (one role) from the driver.

    Calls go only to the ranks the config selects, and not at all when profiling is off
    or the role is not selected. A worker whose RPC fails is logged (once per worker) and
    skipped from then on; the training step is never failed by the profiler.
    """

    def __init__(self, workers: Sequence[Any], config: ProfilerConfig | dict, role: str,
                 global_step: int = 0, timeout_s: float = 300.0):
        self.config = config if isinstance(config, ProfilerConfig) else ProfilerConfig.from_dict(config)
        self.role = role
        self.workers = list(workers)
        self.timeout_s = timeout_s
        self.where: dict[int, dict[str, Any]] = {}  # rank -> profiler_where(), kept for collect()
        self.failed: dict[int, str] = {}
        on = self.config.enable and role_selected(self.config.roles, role)
        if on:
            self.config.check_world_size(len(self.workers))
        self.active = {r: w for r, w in enumerate(self.workers) if on and rank_selected(self.config.ranks, r)}
        if self.active:
            results = self._call("setup_profiler", self.config, role, None, len(self.workers), global_step)
            self.where.update({r: v for r, v in results.items() if isinstance(v, dict)})

    def start(self) -> dict[int, Any]:
        return self._call("start_profile")

    def step(self) -> dict[int, Any]:
        return self._call("profile_step")

    def stop(self) -> dict[int, Any]:
        return self._call("stop_profile")

    def summary(self) -> list[dict[str, Any]]:
        return [v for _, v in sorted(self._call("profiler_summary").items())]

    def __enter__(self) -> "ProfiledGroup":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def _call(self, method: str, *args: Any) -> dict[int, Any]:
        """Call ``method`` on every live selected worker; per-rank results, failures logged and dropped."""
        import ray

        live = {r: w for r, w in self.active.items() if r not in self.failed}
        if not live:
            return {}
        refs = {}
        for r, w in live.items():
            # setup_profiler gets each worker's own rank in place of the None placeholder.
            call_args = tuple(r if (method == "setup_profiler" and i == 2) else a for i, a in enumerate(args))
            refs[r] = getattr(w, method).remote(*call_args)
        out: dict[int, Any] = {}
        for r, ref in refs.items():
            try:
                out[r] = ray.get(ref, timeout=self.timeout_s)
            except Exception as e:  # a dead actor, a timeout, or the worker's own error
                self.failed[r] = f"{type(e).__name__}: {e}"
                logger.error("distprof: %s on %s rank %d failed; profiling of that worker is off from now on: %s",
                             method, self.role, r, self.failed[r])
        return out
