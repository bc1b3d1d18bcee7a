"""collect(workers, dest): bring every worker's finished files into one run directory, through Ray.

Files are read on the node that wrote them by small tasks pinned to that node
(``NodeAffinitySchedulingStrategy``), streamed to the driver in chunks, written
under a hidden temporary name and renamed, and their sizes verified. No shared
filesystem is assumed. Node ids are remembered by ``ProfiledGroup`` at setup,
so files of a worker that has died since are still fetched; a worker that
cannot be reached at all is reported, never fatal.

Many nodes: every (node, folder) is listed once, all nodes at once, however many workers
share the folder; a relative path is brought from one place only (a shared save_path seen
from every node is copied once; ``run.json`` and ``role.json``, which every node writes for
itself, come from the first node, first writer wins; two different files claiming one path
are ``conflicts``). A node that is dead, or dies mid-copy, is one ``unreachable_nodes``
entry naming its id, address and the ranks whose files stayed there. Every wait is bounded.

Process backends write when the worker process ends: call ``ray.kill`` on the
group (or let the actors exit) before collecting. Outputs still being written
(a live ``.tmp-PID-`` file) are waited for up to ``timeout_s``: by default the largest
``finalize_timeout_s`` of the groups' process backends (120 s when none is known).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from distprof.integrations.ray.workers import ProfiledGroup
from distprof.rundir.layout import COLLECT_JSON, MANIFEST, ROLE_JSON, RUN_JSON, TMP_PREFIX, pid_of_temp
from distprof.rundir.manifest import MANIFEST_LIMIT
from distprof.rundir.safefile import AtomicWriter, no_links, write_bytes
from distprof.rundir.store import list_files
from distprof.rundir.walk import walk
from distprof.util.problem import Problem
from distprof.util.procfs import alive
from distprof.util.raynodes import cancel_quietly, node_lost, node_name, node_table, one_line, pinned

logger = logging.getLogger(__name__)

CHUNK = 32 * 1024 * 1024


@dataclass
class CollectReport:
    dest: str
    copied: list[dict[str, Any]] = field(default_factory=list)  # {"path", "bytes", "node_id"}
    unchanged: list[str] = field(default_factory=list)  # already at dest with the same size (manifests: content)
    unreachable: list[dict[str, Any]] = field(default_factory=list)  # workers never set up: {"role", "rank", "error"}
    # Nodes whose files could not be listed or read (dead, or gone mid-copy): {"node_id", "address", "save_paths",
    # "ranks": [{"role", "rank"}], "error", "not_copied": files listed there but not brought}
    unreachable_nodes: list[dict[str, Any]] = field(default_factory=list)
    # One relative path held by two places with different contents (two writers of one rank): the first kept.
    conflicts: list[dict[str, Any]] = field(default_factory=list)  # {"path", "node_id", "bytes", "kept_from"}
    pending: list[str] = field(default_factory=list)  # outputs still being written when we gave up
    # A file or folder that could not be brought: where = its path relative to dest, or the node; str() the line
    errors: list[Problem] = field(default_factory=list)
    # Each (node, folder) listed, once however many workers write there: {"node_id", "address", "save_path",
    # "ranks", "files"}
    listed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.unreachable or self.unreachable_nodes or self.conflicts or self.pending or self.errors)


def _pending(root: str) -> list[tuple[str, int]]:
    """Temporaries of processes that are still alive: outputs being written right now."""
    found = []
    for folder in walk(root, links="skip"):
        for n in folder.names:
            if n.startswith(TMP_PREFIX):
                pid = pid_of_temp(n)
                if pid is not None and alive(pid):
                    found.append((os.path.relpath(os.path.join(folder.path, n), root), pid))
    return found


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read(MANIFEST_LIMIT), digest_size=16).hexdigest()


def _node_list(root: str, wait_s: float, expect_pids: list[int]) -> dict[str, Any]:
    """Runs on the node: wait for in-flight outputs (bounded), then list finished files.

    Manifests carry a digest: they grow by appending, so a size alone could not tell an old copy from a new one."""
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
    files = list_files(root) if os.path.isdir(root) else []
    listed = []
    for f in files:
        full = os.path.join(root, f["path"])
        try:
            st = os.stat(full)
            if os.path.basename(f["path"]) == MANIFEST:
                f["digest"] = _digest(full)
        except OSError:  # gone since it was listed (another collect moved it?): nothing to bring
            continue
        # Which file this is: the same path seen from two nodes is one file (a shared folder) only if these agree.
        f["ident"] = [st.st_size, st.st_mtime_ns, st.st_ino]
        listed.append(f)
    return {"files": listed,
            "pending": [p for p, _ in _pending(root)]
            + [f"process {p} (still running)" for p in expect_pids if alive(p)]}


def _node_read(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


DEFAULT_FINALIZE_TIMEOUT_S = 120.0
LIST_GRACE_S = 60.0  # on top of the finalize wait: a node that lists nothing by then is reported, not waited for
CHUNK_TIMEOUT_S = 300.0  # one 32 MiB chunk; a node that hangs longer is reported

# Written once per node by the first process there (first writer wins, as on one node): every node holds its own,
# and the first one brought is the run's. Later ones are not copied over it.
_FIRST_WRITER_WINS = (RUN_JSON, ROLE_JSON)


@dataclass
class _Source:
    node: str
    root: str
    pids: set[int] = field(default_factory=set)  # process wrappers to wait for
    ranks: list[dict[str, Any]] = field(default_factory=list)  # {"role", "rank"} of the workers writing here


def collect(workers: Sequence[Any], dest: str, timeout_s: float | None = None) -> CollectReport:
    """Copy every file the workers' profilers (and process wrappers) wrote into ``dest``.

    ``workers``: ``ProfiledGroup`` objects and/or actor handles of ``ProfiledWorker`` actors. Each (node, folder)
    is listed once however many workers write there, every node in parallel; each relative path is brought from
    one place only, and a file already at ``dest`` with the same size (a manifest: the same contents) is not
    copied again. A dead node, or one that goes away mid-copy, is named in ``unreachable_nodes`` with the ranks
    it held; no wait on a node is unbounded.
    """
    import ray

    dest = os.path.abspath(dest)
    report = CollectReport(dest=dest)
    sources: dict[tuple[str, str], _Source] = {}

    def add(where: dict[str, Any]) -> None:
        root = where.get("save_root") or os.path.abspath(os.path.expanduser(where["save_path"]))
        src = sources.setdefault((where["node_id"], root), _Source(where["node_id"], root))
        src.ranks.append({"role": where.get("role"), "rank": where.get("rank")})
        wrapped = where.get("wrapped_by")
        if wrapped:
            src.pids.add(int(wrapped.split(":")[1]))

    for item in workers:
        if isinstance(item, ProfiledGroup):
            for _, where in sorted(item.where.items()):
                add(where)
            for rank in sorted(set(item.active) - set(item.where)):
                report.unreachable.append({"role": item.role, "rank": rank,
                                           "error": item.failed.get(rank, "never set up")})
            continue
        try:
            add(ray.get(item.profiler_where.remote(), timeout=30))
        except Exception as e:
            report.unreachable.append({"role": None, "rank": None, "error": f"{type(e).__name__}: {e}"})

    if timeout_s is None:
        timeout_s = finalize_timeout(workers)
    table = node_table()
    listings = _list_all(sorted(sources.values(), key=lambda s: (s.node, s.root)), table, timeout_s, report)
    read_task = ray.remote(num_cpus=0)(_node_read)
    here = ray.get_runtime_context().get_node_id()
    kept: dict[str, tuple[str, Any]] = {}  # relative path -> (node id, file identity) brought this call
    for src, listing in listings:
        report.listed.append({"node_id": src.node, "address": table.get(src.node, {}).get("address"),
                              "save_path": src.root, "ranks": src.ranks, "files": len(listing["files"])})
        report.pending += [f"{src.root}/{p}" for p in listing["pending"]]
        same_place = src.node == here and os.path.realpath(src.root) == os.path.realpath(dest)
        pin = read_task.options(scheduling_strategy=pinned(src.node))
        files = listing["files"]
        for k, f in enumerate(files):
            rel, size, digest = f["path"], f["bytes"], f.get("digest")
            if rel in kept:  # another node (or folder) already gave this path in this call
                first_node, first_ident = kept[rel]
                if first_ident != f.get("ident") and os.path.basename(rel) not in _FIRST_WRITER_WINS:
                    report.conflicts.append({"path": rel, "node_id": src.node, "bytes": size, "kept_from": first_node})
                continue
            kept[rel] = (src.node, f.get("ident"))
            if same_place or _unchanged(dest, rel, size, digest):
                report.unchanged.append(rel)
                continue
            try:
                _fetch(_remote_reader(pin, os.path.join(src.root, rel)), size, dest, rel)
                report.copied.append({"path": rel, "bytes": size, "node_id": src.node})
            except Exception as e:
                if node_lost(e) or isinstance(e, ray.exceptions.GetTimeoutError):  # nor can the rest of its files
                    _unreachable(report, src, table, f"lost while copying {rel}: {one_line(e)}", len(files) - k)
                    break
                report.errors.append(Problem.at(rel, one_line(e)))
    _write_note(dest, report)
    logger.info("distprof: collected %d files into %s (%d unchanged, %d unreachable workers, %d unreachable nodes, "
                "%d pending)", len(report.copied), dest, len(report.unchanged), len(report.unreachable),
                len(report.unreachable_nodes), len(report.pending))
    return report


def _list_all(sources: list[_Source], table: dict[str, dict[str, Any]], timeout_s: float,
              report: CollectReport) -> list[tuple[_Source, dict[str, Any]]]:
    """List every source on its own node, all at once; a dead or silent node is reported, never waited on
    past ``timeout_s`` + :data:`LIST_GRACE_S`."""
    import ray

    list_task = ray.remote(num_cpus=0)(_node_list)
    sent = []
    for src in sources:
        if not table.get(src.node, {}).get("alive", False):
            death = table.get(src.node, {}).get("death")
            _unreachable(report, src, table, "the node is dead" + (f" ({death})" if death else "")
                         if src.node in table else "the cluster does not know this node")
            continue
        sent.append((src, list_task.options(scheduling_strategy=pinned(src.node)).remote(src.root, timeout_s,
                                                                                       sorted(src.pids))))
    deadline = time.monotonic() + timeout_s + LIST_GRACE_S
    out = []
    for src, ref in sent:
        try:
            out.append((src, ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))))
        except Exception as e:
            if node_lost(e) or isinstance(e, ray.exceptions.GetTimeoutError):
                cancel_quietly(ref)
                _unreachable(report, src, table, f"cannot list {src.root}: {one_line(e)}")
            else:  # the listing itself failed there (a folder it may not read)
                report.errors.append(Problem.at(node_name(src.node, table), f"cannot list {src.root}: {one_line(e)}"))
    return out


def _unreachable(report: CollectReport, src: _Source, table: dict[str, dict[str, Any]], error: str,
                 not_copied: int | None = None) -> None:
    entry = next((u for u in report.unreachable_nodes if u["node_id"] == src.node), None)
    if entry is None:
        entry = {"node_id": src.node, "address": table.get(src.node, {}).get("address"), "save_paths": [],
                 "ranks": [], "error": error, "not_copied": None}
        report.unreachable_nodes.append(entry)
    entry["save_paths"].append(src.root)
    entry["ranks"] += src.ranks
    if not_copied is not None:
        entry["not_copied"] = (entry["not_copied"] or 0) + not_copied
    held = ", ".join(f"{r['role']} rank {r['rank']}" for r in src.ranks) or "no known rank"
    logger.error("distprof: collect: %s is unreachable (%s); files of %s under %s not collected",
                 node_name(src.node, table), error, held, src.root)


def _write_note(dest: str, report: CollectReport) -> None:
    """``collect.json`` in ``dest``: the nodes and workers this collect could not reach, so that ``distprof check``
    can say why a rank's windows are missing (rewritten by every collect: it describes the last one)."""
    import msgspec

    note = {"unreachable_nodes": [{k: u[k] for k in ("node_id", "address", "ranks", "error", "not_copied")}
                                  for u in report.unreachable_nodes],
            "unreachable_workers": report.unreachable, "time": time.time()}
    path = os.path.join(dest, COLLECT_JSON)
    try:
        os.makedirs(dest, exist_ok=True)
        write_bytes(dest, COLLECT_JSON, msgspec.json.encode(note))
    except (OSError, ValueError, TypeError, msgspec.EncodeError) as e:  # the copies stand; only check's reason is lost
        logger.warning("distprof: collect: cannot write %s (%s)", path, e)


def _unchanged(dest: str, rel: str, size: int, digest: str | None) -> bool:
    """Is ``dest/rel`` already what the node holds? Run and role files: present is enough (first writer wins).
    Never judged through a link (``_fetch`` then refuses it)."""
    target = os.path.join(dest, rel)
    if not no_links(dest, rel) or not os.path.isfile(target):
        return False
    if os.path.basename(target) in _FIRST_WRITER_WINS:
        return True
    if os.path.getsize(target) != size:
        return False
    return digest is None or _digest(target) == digest


def finalize_timeout(workers: Sequence[Any]) -> float:
    """How long to wait for outputs still being written: the largest ``finalize_timeout_s`` among the process
    backends the groups use (their config's section), else :data:`DEFAULT_FINALIZE_TIMEOUT_S`."""
    found = [getattr(g.config, g.config.backend).finalize_timeout_s for g in workers
             if isinstance(g, ProfiledGroup) and g.config.is_process_backend]
    return max(found, default=DEFAULT_FINALIZE_TIMEOUT_S)


def _remote_reader(task: Any, path: str) -> Callable[[int, int], bytes]:
    """``read(offset, length)`` of ``path`` on its node, through the pinned read ``task`` (bounded per chunk)."""
    import ray

    return lambda offset, length: ray.get(task.remote(path, offset, length), timeout=CHUNK_TIMEOUT_S)


def _fetch(read: Callable[[int, int], bytes], size: int, dest: str, rel: str) -> None:
    """Write ``dest/rel`` from ``read(offset, length)`` (chunks of the node's file) through a temporary that
    :class:`~distprof.rundir.safefile.AtomicWriter` creates exclusively, renamed when all ``size`` bytes came; a
    folder on the way that is a symbolic link is refused (UnsafePath), nothing written outside ``dest``."""
    os.makedirs(dest, exist_ok=True)  # the caller's folder (it may be a link); nothing below it may be
    with AtomicWriter(dest, rel) as out:
        offset = 0
        while offset < size:
            chunk = read(offset, min(CHUNK, size - offset))
            if not chunk:
                raise OSError(f"file shrank while copying ({offset} of {size} bytes)")
            out.write(chunk)
            offset += len(chunk)
        got = out.tell()
        if got != size:
            raise OSError(f"copied {got} bytes, expected {size}")
