"""Ray integration: profile an RL job's worker groups from one config.

- ``ProfiledWorker``: a mixin giving any Ray actor class ``setup_profiler``,
  ``start_profile``, ``profile_step``, ``stop_profile``, ``profiler_summary``
  and ``collect_profile``.
- ``ProfiledGroup``: the driver side; calls them on a whole worker group, logs
  a failing worker and goes on, and dispatches nothing when profiling is off.
- ``runtime_env(config, group=...)``: the runtime_env that wraps a group's
  worker processes with nsys / rocprof-sys / py-spy / memray.
- ``collect(workers, dest)``: brings every file the workers wrote, on whatever
  node, into one run directory on the driver, through Ray.

Ray itself is imported lazily, by the functions that need it.
"""

from .collect import CollectReport, collect
from .runtime_env import runtime_env
from .workers import ProfiledGroup, ProfiledWorker

__all__ = ["ProfiledWorker", "ProfiledGroup", "runtime_env", "collect", "CollectReport"]
