"""collect(workers, dest): bring every worker's finished files into one run directory, through Ray.

Files are read on the node that wrote them by small tasks pinned to that node
(``NodeAffinitySchedulingStrategy``), streamed to the driver in chunks, written
under a hidden temporary name and renamed, and their sizes verified. No shared
filesystem is assumed. Node ids are remembered by ``ProfiledGroup`` at setup,
so files of a worker that has died since are still fetched; a worker that
cannot be reached at all is reported, never fatal.

Process backends write when the worker process ends: call ``ray.kill`` on the
group (or let the actors exit) before collecting. Outputs still being written
(a live ``.tmp-PID-`` file) are waited for up to ``timeout_s``: by default the largest
``finalize_timeout_s`` of the groups' process backends (120 s when none is known).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..procfs import alive
from ..rundir.layout import MANIFEST, TMP_PREFIX, pid_of_temp, temp_name
from ..rundir.store import list_files

logger = logging.getLogger(__name__)

CHUNK = 32 * 1024 * 1024


@dataclass
class CollectReport:
    dest: str
    copied: list[dict[str, Any]] = field(default_factory=list)  # {"path", "bytes", "node_id"}
    unchanged: list[str] = field(default_factory=list)  # already at dest with the same size
    unreachable: list[dict[str, Any]] = field(default_factory=list)  # {"role", "rank", "error"}
    pending: list[str] = field(default_factory=list)  # outputs still being written when we gave up
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.unreachable or self.pending or self.errors)


def _pending(root: str) -> list[tuple[str, int]]:
    """Temporaries of processes that are still alive: outputs being written right now."""
    found = []
    for d, dirs, names in os.walk(root):
        for n in names + dirs:
            if n.startswith(TMP_PREFIX):
                pid = pid_of_temp(n)
                if pid is not None and alive(pid):
                    found.append((os.path.relpath(os.path.join(d, n), root), pid))
    return found


def _node_list(root: str, wait_s: float, expect_pids: list[int]) -> dict[str, Any]:
    """Runs on the node: wait for in-flight outputs (bounded), then list finished files."""
    deadline = time.monotonic() + wait_s
    while True:
        pending = _pending(root)
        # A wrapper that is alive but has not started writing yet (its worker still runs) is pending too.
        waiting = [p for p in expect_pids if alive(p)]
        if not pending and not waiting:
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)  # polling another process's files: there is nothing to wait on
    return {"files": list_files(root) if os.path.isdir(root) else [],
            "pending": [p for p, _ in _pending(root)] + [f"process {p} (still running)" for p in expect_pids if alive(p)]}


def _node_read(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


DEFAULT_FINALIZE_TIMEOUT_S = 120.0


def collect(workers: Sequence[Any], dest: str, timeout_s: float | None = None) -> CollectReport:
    """Copy every file the workers' profilers (and process wrappers) wrote into ``dest``.

    ``workers``: ``ProfiledGroup`` objects and/or actor handles of ``ProfiledWorker`` actors.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .workers import ProfiledGroup

    dest = os.path.abspath(dest)
    report = CollectReport(dest=dest)
    sources: dict[tuple[str, str], set[int]] = {}  # (node_id, save_path root) -> wrapper pids to wait for

    def add(where: dict[str, Any]) -> None:
        root = os.path.abspath(os.path.expanduser(where["save_path"]))
        pids = sources.setdefault((where["node_id"], root), set())
        wrapped = where.get("wrapped_by")
        if wrapped:
            pids.add(int(wrapped.split(":")[1]))

    for item in workers:
        if isinstance(item, ProfiledGroup):
            for rank, where in sorted(item.where.items()):
                add(where)
            for rank in sorted(set(item.active) - set(item.where)):
                report.unreachable.append({"role": item.role, "rank": rank, "error": item.failed.get(rank, "never set up")})
            continue
        try:
            add(ray.get(item.profiler_where.remote(), timeout=30))
        except Exception as e:
            report.unreachable.append({"role": None, "rank": None, "error": f"{type(e).__name__}: {e}"})

    list_task = ray.remote(num_cpus=0)(_node_list)
    read_task = ray.remote(num_cpus=0)(_node_read)
    here = ray.get_runtime_context().get_node_id()
    if timeout_s is None:
        timeout_s = finalize_timeout(workers)
    for (node, root), pids in sorted(sources.items()):
        pin = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        try:
            listing = ray.get(list_task.options(scheduling_strategy=pin).remote(root, timeout_s, sorted(pids)))
        except Exception as e:
            report.errors.append(f"node {node[:12]}: cannot list {root}: {type(e).__name__}: {e}")
            continue
        report.pending += [f"{root}/{p}" for p in listing["pending"]]
        same_place = node == here and os.path.realpath(root) == os.path.realpath(dest)
        for f in listing["files"]:
            target = os.path.join(dest, f["path"])
            if same_place or (os.path.exists(target) and os.path.getsize(target) == f["bytes"]
                              and os.path.basename(f["path"]) != MANIFEST):
                report.unchanged.append(f["path"])
                continue
            try:
                _fetch(read_task.options(scheduling_strategy=pin), os.path.join(root, f["path"]), f["bytes"], target)
                report.copied.append({"path": f["path"], "bytes": f["bytes"], "node_id": node})
            except Exception as e:
                report.errors.append(f"{f['path']}: {type(e).__name__}: {e}")
    logger.info("distprof: collected %d files into %s (%d unchanged, %d unreachable workers, %d pending)",
                len(report.copied), dest, len(report.unchanged), len(report.unreachable), len(report.pending))
    return report


def finalize_timeout(workers: Sequence[Any]) -> float:
    """How long to wait for outputs still being written: the largest ``finalize_timeout_s`` among the process
    backends the groups use (their config's section), else :data:`DEFAULT_FINALIZE_TIMEOUT_S`."""
    from .workers import ProfiledGroup

    found = [getattr(g.config, g.config.backend).finalize_timeout_s for g in workers
             if isinstance(g, ProfiledGroup) and g.config.is_process_backend]
    return max(found, default=DEFAULT_FINALIZE_TIMEOUT_S)


def _fetch(read_task: Any, src: str, size: int, target: str) -> None:
    import ray

    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = os.path.join(os.path.dirname(target), temp_name(os.getpid(), os.path.basename(target)))
    try:
        with open(tmp, "wb") as out:
            offset = 0
            while offset < size:
                chunk = ray.get(read_task.remote(src, offset, min(CHUNK, size - offset)))
                if not chunk:
                    raise OSError(f"file shrank while copying ({offset} of {size} bytes)")
                out.write(chunk)
                offset += len(chunk)
        got = os.path.getsize(tmp)
        if got != size:
            raise OSError(f"copied {got} bytes, expected {size}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
