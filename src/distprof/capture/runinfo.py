"""What ``run.json`` and ``{role}/role.json`` say about a run (first writer wins: see ``RunDir.write_run_json``).

One shape for every process that may write them first: the in-process Profiler (``capture/profiler.py``) and
``distprof wrap`` (``capture/wrapjob.py``), which writes them before the command it wraps starts.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from distprof.util.runtime import VERSION, host_name, torch_version

__all__ = ["role_info", "run_info"]


def run_info(config: Any, world_size: int, plan: Any) -> dict[str, Any]:
    """``run.json``: the config (a ProfilerConfig), the world size, the plan, when and where."""
    return {
        "config": config.model_dump(mode="json"),
        "world_size": world_size,
        "plan": plan.describe(),
        "start_time": time.time(),
        "host": host_name(),
        "versions": {"distprof": VERSION, "torch": torch_version(), "python": sys.version.split()[0]},
    }


def role_info(role: str, info: dict[str, Any], backend: str, mesh: Any = None) -> dict[str, Any]:
    """``{role}/role.json`` from ``info`` (:func:`run_info`'s): that role's world size, plan, backend, config and
    device mesh (for ``check``: which ranks should capture)."""
    return {"role": role, "world_size": info["world_size"], "plan": info["plan"], "backend": backend,
            "config": info["config"],
            **({"mesh": {"names": list(mesh.names), "shape": list(mesh.shape), "ranks": list(mesh.ranks)}}
               if mesh else {})}
