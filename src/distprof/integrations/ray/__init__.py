"""Ray integration: profile an RL job's worker groups from one config.

- ``ProfiledWorker``: a mixin giving any Ray actor class ``setup_profiler``,
  ``start_profile``, ``profile_step``, ``stop_profile``, ``profiler_summary``
  and ``collect_profile``.
- ``ProfiledGroup``: the driver side; calls them on a whole worker group, logs
  a failing worker and goes on, and dispatches nothing when profiling is off.
- ``step_all(groups)``, ``start_all(groups)``, ``stop_all(groups)`` and
  ``with profiling(groups):``: drive several groups together, every RPC sent
  before any is waited for, so one group's trace export never lands inside
  another group's step.
- ``DriverGroup(config, groups)`` / ``profiling(groups, driver=True)``: the driver process as role ``driver``,
  stepped with the groups, keeping Ray's task timeline of every window (``integrations/ray/timeline.py``).
- ``trigger_all(groups, steps=N)`` / ``group.trigger(steps=N)``: capture N steps
  on demand (workers configured with ``trigger: true``), the same global steps
  on every worker, through Ray: no shared filesystem needed.
- ``runtime_env(config, group=...)``: the runtime_env that wraps a group's
  worker processes with nsys / rocprof-sys / py-spy / memray.
- ``collect(workers, dest)``: brings every file the workers wrote, on whatever
  node, into one run directory on the driver, through Ray; a dead node is named; a
  file or node it could not bring is a ``distprof.util.problem.Problem`` in ``CollectReport.errors``.
- ``distprof.analysis.rayfiles.find_traces_on_nodes(path, problems)``: what the analysis verbs' ``--ray``
  read: the traces under ``path`` on every node (``$VARS`` expanded per node), each
  to be read on the node that holds it.

Ray itself is imported lazily, by the functions that need it.
"""

from distprof.integrations.ray.collect import CollectReport, collect
from distprof.integrations.ray.driver import DriverGroup, profiling
from distprof.integrations.ray.runtime_env import runtime_env
from distprof.integrations.ray.workers import ProfiledGroup, ProfiledWorker, start_all, step_all, stop_all, trigger_all

__all__ = [
           "CollectReport",
           "DriverGroup",
           "ProfiledGroup",
           "ProfiledWorker",
           "collect",
           "profiling",
           "runtime_env",
           "start_all",
           "step_all",
           "stop_all",
           "trigger_all",
]
