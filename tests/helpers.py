"""A tiny real training loop for profiler tests."""

import torch

import distprof

# A child's peak RSS in MB, printed as its last line. VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec
# from the forking parent, so a child of a big pytest worker (1 GB late in a CI run) would report the worker's.
PEAK_MB = ('print(next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") '
           'if line.startswith("VmHWM:")))')


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.steps_run = 0

    def train_step(self):
        with distprof.annotate("train/forward"):
            loss = self.model(torch.randn(8, 16)).pow(2).mean()
        with distprof.annotate("train/backward"):
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.steps_run += 1
        return loss.item()


def run(profiler, n, trainer=None, on_step=None):
    trainer = trainer or Trainer()
    with profiler:
        for _ in range(n):
            trainer.train_step()
            profiler.step()
            if on_step:
                on_step(profiler)
    return trainer
