"""The nodes of a Ray cluster as distprof sees them: which are alive, how to name one, node-local paths.

A path may name environment variables (``$TMPDIR/profile``, ``${SCRATCH}/run``): they are expanded on the node
that uses the path, because node-local scratch directories differ from node to node (SLURM's ``$TMPDIR``).
Ray's own exceptions are told apart here: the node (or its worker process) is gone, versus the code run there
raised.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from distprof.util.runtime import host_name

__all__ = [
    "cancel_quietly",
    "expand_on_node",
    "names_variables",
    "node_lost",
    "node_name",
    "node_table",
    "one_line",
    "pinned",
]

logger = logging.getLogger(__name__)

_UNSET = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def names_variables(path: str) -> bool:
    """Does ``path`` name an environment variable (``$X`` / ``${X}``)?"""
    return bool(_UNSET.search(path))


def expand_on_node(path: str, what: str) -> str:
    """``path`` with ``~`` and ``$VARS`` expanded in this process (call it on the node that uses the path).

    A variable not set here is a ValueError naming ``what``, the variable and this node: expanding it to an
    empty string would write into, or read, the wrong folder.
    """
    out = os.path.expanduser(os.path.expandvars(path))
    left = _UNSET.search(out)
    if left:
        name = left.group(1).strip("{}")
        raise ValueError(f"{what} {path!r} names ${name}, which is not set on this node ({_here()}); set it in the "
                         "environment the node's Ray workers start with, or give a plain path")
    return out


def _here() -> str:
    try:
        import ray

        ctx = ray.get_runtime_context()
        return f"node {ctx.get_node_id()[:12]}, {ray.util.get_node_ip_address()}"
    except Exception:  # outside Ray (a plain process): the host is enough
        return host_name()


def node_table() -> dict[str, dict[str, Any]]:
    """Every node the cluster knows, alive or dead: node id -> {"address", "alive", "death", "cpus"}."""
    import ray

    out = {}
    for n in ray.nodes():
        out[n["NodeID"]] = {"address": n.get("NodeManagerAddress", "?"), "alive": bool(n.get("Alive")),
                            "death": n.get("DeathReasonMessage") or "",
                            "cpus": int((n.get("Resources") or {}).get("CPU", 0))}
    return out


def node_name(node_id: str, table: dict[str, dict[str, Any]]) -> str:
    """``node 57d99f6b67f3 (10.0.0.7)``: short enough for one line, the address to find the machine."""
    address = table.get(node_id, {}).get("address", "address unknown")
    return f"node {node_id[:12]} ({address})"


def node_lost(e: BaseException) -> bool:
    """Did a Ray call fail because its node or worker process went away (not because the code run there raised,
    and not a timeout of ours)?"""
    import ray

    return isinstance(e, ray.exceptions.RayError) and not isinstance(
        e, (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError))


def pinned(node_id: str) -> Any:
    """The scheduling strategy of a task that must run on ``node_id`` (the file is there, nowhere else): it fails
    at once, rather than run elsewhere or wait, when that node is gone."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def one_line(e: BaseException) -> str:
    """``Type: first line`` of an exception: Ray's own messages run to many lines (tracebacks, lease ids)."""
    first = next((x.strip() for x in str(e).splitlines() if x.strip()), "")
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


def cancel_quietly(ref: Any) -> None:
    """Stop a task we gave up waiting for (stuck on a silent node); one already finished or lost is left alone."""
    import ray

    try:
        ray.cancel(ref, force=True)
    except Exception as e:  # finished, or its node gone: nothing left to stop
        logger.debug("distprof: cancel: %s", one_line(e))
