"""runtime_env(config, group=...): wrap a worker group's processes with a profiling tool."""

from __future__ import annotations

import logging
import os
import shlex
import sys
from typing import Any

from distprof.capture.backends.process import spec_for
from distprof.config.model import ProfilerConfig
from distprof.config.plan import rank_selected, role_selected
from distprof.rundir.layout import is_url, sanitize_role
from distprof.util.raynodes import names_variables

logger = logging.getLogger(__name__)


def runtime_env(config: ProfilerConfig, group: str, base: dict[str, Any] | None = None,
                rank: int | None = None) -> dict[str, Any]:
    """The runtime_env for ``group``'s actors.

    Wrapped when profiling is on, the backend is a process backend (nsys, rocprof_sys, py_spy,
    memray) and ``config.roles`` selects ``group`` (and ``config.ranks`` selects ``rank``, when
    given: pass it to wrap only some ranks of a group). Otherwise ``base`` comes back unchanged.
    An interpreter already set in ``base["py_executable"]`` (uv, venv, conda) runs both the
    wrapper and the worker. Raises ValueError naming the tool when it is not installed here.
    """
    base = dict(base or {})
    config = config.for_role(group)
    if not (config.enable and config.is_process_backend and role_selected(config.roles, group)):
        return base
    if rank is not None and isinstance(config.ranks, list) and not rank_selected(config.ranks, rank):
        return base
    group = sanitize_role(group)
    save_path = config.save_path
    if save_path is None:  # ProfilerConfig refuses enable: true without one
        raise ValueError("save_path is required when profiling is enabled; set save_path")
    if is_url(save_path):
        raise ValueError(
            f"save_path {config.save_path!r} is a URL, but {config.backend} writes files on each node; "
            "use a local path (then distprof.integrations.ray.collect brings them to one place)"
        )
    if names_variables(save_path):
        # The wrapper's output folder is fixed here, on the driver: a per-node variable cannot be honoured.
        raise ValueError(
            f"save_path {config.save_path!r} names an environment variable, but {config.backend}'s output folder "
            "is fixed on the driver; give a plain path for process backends (the torch backend expands it per node)"
        )
    python = shlex.split(base["py_executable"]) if base.get("py_executable") else [sys.executable]
    spec = spec_for(config, group, os.path.join(os.path.abspath(os.path.expanduser(save_path)), group), python)
    base["py_executable"] = spec.py_executable(python)
    logger.info("distprof: %s wraps group %r: %s", config.backend, group, base["py_executable"])
    return base
