"""RLinf's `cluster.profiling` over distprof: chosen worker groups wrapped by a profiling tool through Ray.

RLinf wraps the worker groups named in `cluster.profiling.worker_groups` in Nsight Systems (`options`,
`flags`, `env` rendered onto nsys's command line) by setting Ray's `py_executable`. distprof does the same
from its config: `runtime_env(config, group=...)`. nsys needs a GPU node, so this runs the same path with
py-spy (pip-installable, CPU): on a GPU node set `backend: nsys` and `nsys: {options: ..., flags: ...}`.

    python examples/rlinf_profiled_worker_groups.py OUT_DIR
"""

import logging
import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback

import ray

import distprof
from distprof.integrations.ray import ProfiledGroup, ProfiledWorker, collect, runtime_env

# RLinf: cluster.profiling = {worker_groups: [rollout], output_dir: ..., options: {...}, flags: [...]}
CONFIG = {"enable": True, "backend": "py_spy", "roles": ["rollout"], "ranks": "all",
          "py_spy": {"rate": 200, "format": "speedscope"}}


@ray.remote(num_cpus=0.25)
class Rollout(ProfiledWorker):
    def generate(self, n):
        return sum(i * i for i in range(n))

    def exit(self):
        ray.actor.exit_actor()  # the wrapped worker ends; the tool's output is finalized


def main(out: str) -> None:
    ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    config = distprof.ProfilerConfig(save_path=os.path.join(out, "scratch"), **CONFIG)
    workers = [Rollout.options(runtime_env=runtime_env(config, group="rollout")).remote()]
    group = ProfiledGroup(workers, config, "rollout")
    ray.get([w.generate.remote(200_000) for w in workers])
    for w in workers:
        try:
            ray.get(w.exit.remote())
        except ray.exceptions.RayActorError:
            pass  # exit_actor ends the call with the actor
    report = collect([group], os.path.join(out, "profile"))
    for f in sorted(c["path"] for c in report.copied):
        print(f)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
