"""Trace files that live on the nodes of a Ray cluster: found on each node, read on the node that holds them.

The analysis verbs' ``--ray ADDRESS`` (``analyze.read(..., ray_address=...)``) do not assume a shared
filesystem. Design:

1. **Listing on every node.** One small task per alive node (``NodeAffinitySchedulingStrategy``, ``soft=False``,
   ``num_cpus=0``) runs ``find_traces`` on the path *on that node*. The path may name environment variables
   (``'$SCRATCH/run'``, ``'$TMPDIR/profile'``), expanded on each node, since node-local scratch folders differ
   per node (SLURM's ``$TMPDIR``); a relative path is made absolute on the driver first. A node where the path
   does not exist (or its variable is unset) simply holds no file; only when no node holds any is it an error.
   Every listing is bounded (:data:`LIST_TIMEOUT_S`): a node that dies or does not answer is one problem line
   naming it, never a hang.
2. **One file, read once.** A shared path is seen by every node: the same file (same path, size, modification
   time and inode) listed by several nodes is read once, by one of them (spread round-robin). Files at one path
   that differ between nodes (node-local folders with the same name) are different files, each read where it is.
3. **Read where it lives.** Each :class:`~distprof.trace.listing.TraceFile` carries the ``node`` that holds
   it, and ``map_files``'s Ray path pins that file's task there. A node lost between listing and reading gives
   one :class:`~distprof.util.problem.Problem` per file it held, naming the node; the other files are read.

Without node-local files (an fsspec URL, or ``map_files(files, ray_address=...)`` given files with no node) the
tasks run anywhere, as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from distprof.util.problem import Problem
from distprof.util.raynodes import (
    cancel_quietly,
    expand_on_node,
    names_variables,
    node_lost,
    node_name,
    node_table,
    one_line,
    pinned,
)

logger = logging.getLogger(__name__)

__all__ = ["LIST_TIMEOUT_S", "find_traces_on_nodes", "ray_session"]

LIST_TIMEOUT_S = 600.0  # every node's listing together; a huge folder on a slow shared filesystem fits


@contextmanager
def ray_session(address: str) -> Iterator[None]:
    """Ray connected for the duration: an existing connection is used as it is (and left open); otherwise
    ``address`` is joined ("local" starts a loopback cluster) and shut down on exit."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local cluster stays on loopback
    import ray

    if ray.is_initialized():
        yield
        return
    if address == "local":
        # address="local" starts one even where another cluster runs on this machine (ray.init would join it).
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    else:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


def _list_here(path: str) -> dict[str, Any]:
    """Runs on one node: the trace files under ``path`` as this node sees them, each with its identity."""
    import ray

    from distprof.trace.listing import find_traces
    from distprof.trace.source import TraceError

    node = ray.get_runtime_context().get_node_id()
    try:
        local = expand_on_node(path, "path")
    except ValueError as e:
        return {"node": node, "absent": str(e)}
    problems: list[Problem] = []  # sent back to the driver pickled (MISSING stays MISSING)
    try:
        files = find_traces(local, problems)
    except TraceError as e:
        return {"node": node, "absent": str(e)}
    idents: list[tuple[int, int, int] | None] = []
    for f in files:
        try:
            st = os.stat(f.path.removeprefix("file://"))
            idents.append((st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            idents.append(None)  # gone since: the read reports it
    return {"node": node, "files": files, "idents": idents, "problems": problems}


def find_traces_on_nodes(path: str, problems: list[Problem], timeout_s: float = LIST_TIMEOUT_S) -> list:
    """``find_traces`` run on every alive node of the connected cluster; each file's ``node`` names where to read it.

    ``problems`` receives a :class:`~distprof.util.problem.Problem` (``Problem.at(where, reason)``) for each entry
    that is not a readable trace (where: its path) and each node that could not be listed (where: the path on
    that node); one seen by several nodes (a shared folder) is listed once. Raises ``TraceError`` when no node
    holds any trace under ``path``.
    """
    import time

    import ray

    from distprof.trace.source import TraceError

    if not (names_variables(path) or path.startswith("~") or os.path.isabs(path.removeprefix("file://"))):
        path = os.path.abspath(path)  # relative to where the command was typed, not to a Ray worker's folder
    table = node_table()
    alive = sorted(n for n, v in table.items() if v["alive"])
    task = ray.remote(num_cpus=0)(_list_here)
    sent = [(n, task.options(scheduling_strategy=pinned(n)).remote(path)) for n in alive]
    deadline = time.monotonic() + timeout_s
    listings, absent = [], []
    seen_problems: set[tuple[str, str]] = set()  # (where, line) of the problems already listed
    for n, ref in sent:
        try:
            got = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except Exception as e:
            if not (node_lost(e) or isinstance(e, ray.exceptions.GetTimeoutError)):
                raise  # the listing code itself failed: a bug, not the input
            cancel_quietly(ref)
            problems.append(Problem.at(f"{path} on {node_name(n, table)}",
                                       f"the node could not be listed ({one_line(e)}); its files are not read"))
            continue
        if "absent" in got:
            absent.append(f"{node_name(n, table)}: {got['absent']}")
            continue
        listings.append(got)
        for p in got["problems"]:
            if (p.path, p.message) not in seen_problems:
                seen_problems.add((p.path, p.message))
                problems.append(p)
    holders: dict[tuple[str, Any], list[Any]] = {}  # (path, identity) -> [(node, TraceFile)]
    for got in listings:
        for f, ident in zip(got["files"], got["idents"], strict=False):
            key = (f.path, ident if ident is not None else got["node"])
            holders.setdefault(key, []).append((got["node"], f))
    if not holders:
        if problems:
            return []  # the caller reports what was found unreadable
        why = "; ".join(absent[:3]) or "no alive node"
        raise TraceError(f"{path}: no trace files on any of the {len(alive)} nodes ({why})")
    out = []
    for k, key in enumerate(sorted(holders, key=lambda x: (x[0], str(x[1])))):
        node, f = holders[key][k % len(holders[key])]  # one node reads it; spread a shared folder's files
        out.append(f._replace(node=node))
    nodes_used = {f.node for f in out}
    logger.info("distprof: %d trace files under %s on %d of %d nodes", len(out), path, len(nodes_used), len(alive))
    return out
