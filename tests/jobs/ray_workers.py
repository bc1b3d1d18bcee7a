"""The Ray actor classes and task functions of tests/e2e/test_ray.py and test_multinode.py, in a module of their own.

A Ray worker imports the module that defines its actor's class. Defined in a test module, that was pytest,
hypothesis, the conftest and the analysis code too (about 0.6 s of CPU more per worker, and those tests start
some 30 workers); here it is ray, distprof and, when the work runs, torch: what the workers use."""

import os
import signal

import ray

import distprof
from distprof.integrations.ray import ProfiledWorker


def _work():
    import torch

    torch.set_num_threads(1)
    with distprof.annotate("w/work"):
        x = torch.randn(32, 32)
        for _ in range(10):
            x = torch.tanh(x @ x)


class Worker(ProfiledWorker):
    def work(self):
        _work()
        return 1

    def has_profiler(self):
        return self.profiler is not None

    def env(self, name):
        return os.environ.get(name)

    def exit(self):
        ray.actor.exit_actor()

    def break_profiler_backend(self):
        def boom(*a, **k):
            raise RuntimeError("backend broke")

        self.profiler._backend.advance = boom


class BrokenRPC(Worker):
    def profile_step(self, export=True):
        raise RuntimeError("this worker's profile_step is broken")


class Trainer(ProfiledWorker):
    """test_multinode's worker: its work answers the node it ran on."""

    def work(self):
        _work()
        return ray.get_runtime_context().get_node_id()


def where_read(f, on_read):
    """A map_files function: the node this file's task ran on."""
    return ray.get_runtime_context().get_node_id()


def read_or_die(path, offset, size):
    """collect's chunk reader, except that asked for a trace it kills its node's raylet, then itself: the node dies
    in the middle of a collect, after its other files were copied."""
    if path.endswith(".pt.trace.json.gz"):
        os.kill(os.getppid(), signal.SIGKILL)  # a Ray worker's parent is its node's raylet
        os._exit(1)
    from distprof.integrations.ray.collect import _node_read  # on the node: the real one

    return _node_read(path, offset, size)


class PhasedWorker(ProfiledWorker):
    """test_detect_e2e's Ray worker: one ``train/compute`` phase a step (a sleep standing in for the work), which
    rank ``slow_rank`` makes ``slow_s`` longer from step ``slow_from`` on."""

    def compute(self, rank, step, slow_rank, slow_from, slow_s):
        import time

        with distprof.annotate("train/compute"):
            time.sleep(0.01 + (slow_s if rank == slow_rank and step >= slow_from else 0.0))
        return rank
