"""verl's profiler over distprof: Ray worker groups, per-role settings, discrete per-stage traces.

verl profiles each role (actor, rollout, ref) on chosen global steps (1-based), with its own ranks and
tool options, and in discrete mode writes one trace per annotated stage. Here the same job shape on a
local Ray cluster (CPU, loopback), configured as verl users would, through distprof:

    python examples/verl_discrete_worker_groups.py OUT_DIR
"""

import logging
import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback

import ray
import torch

import distprof
from distprof.integrations.ray import ProfiledGroup, ProfiledWorker, collect, profiling, step_all

CONFIG = {
    "enable": True,
    "steps": [1, 2],          # verl's global steps start at 1
    "discrete": True,         # one trace per stage run (verl's tool_config.torch.discrete)
    "torch": {"activities": ["cpu"]},
    "per_role": {
        "actor": {"ranks": "all", "torch": {"record_shapes": True}},  # verl: actor.profiler.all_ranks
        "rollout": {"ranks": [0]},
    },
}


@ray.remote(num_cpus=0.25)
class Actor(ProfiledWorker):
    def __init__(self):
        torch.set_num_threads(1)
        self.model = torch.nn.Linear(32, 32)

    @distprof.annotate("actor/compute_log_prob")
    def log_prob(self, x):
        with torch.no_grad():
            return self.model(x).log_softmax(-1)

    @distprof.annotate("actor/update_actor")
    def update(self, x):
        loss = self.model(x).pow(2).mean()
        loss.backward()
        return float(loss)


@ray.remote(num_cpus=0.25)
class Rollout(ProfiledWorker):
    @distprof.annotate("rollout/generate")
    def generate(self, seed):
        torch.manual_seed(seed)
        return torch.randn(16, 32).tanh()


def main(out: str, steps: int = 3) -> None:
    ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    config = distprof.ProfilerConfig(save_path=os.path.join(out, "scratch"), **CONFIG)
    actors, rollouts = [Actor.remote() for _ in range(2)], [Rollout.remote()]
    groups = [ProfiledGroup(actors, config, "actor", global_step=1), ProfiledGroup(rollouts, config, "rollout",
                                                                                   global_step=1)]
    with profiling(groups):
        for step in range(1, steps + 1):
            batch = ray.get(rollouts[0].generate.remote(step))
            ray.get([a.log_prob.remote(batch) for a in actors])
            ray.get([a.update.remote(batch) for a in actors])
            step_all(groups)
    report = collect(groups, os.path.join(out, "profile"))
    for f in sorted(c["path"] for c in report.copied):
        print(f)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
