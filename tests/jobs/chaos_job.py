"""A tiny training loop that tests/test_chaos.py runs as a real child process, and breaks from inside.

    python chaos_job.py SAVE_PATH STEPS [--steps-plan 1,2,4,5] [--global-step N] [--role R]

Profiles with the real torch backend, rank 0 of world size 1, then prints one line ``done STEPS_RUN`` on
stdout. What goes wrong comes from the environment (only this script reads these variables):

- ``CHAOS_KILL_AT=raw|gzip|manifest``: SIGKILL this process inside the export of the window ending at
  ``CHAOS_KILL_WINDOW`` (a step number): right after torch wrote the plain trace, half-way through our
  gzip, or after the file was published but before its manifest line.
- ``CHAOS_FILL_AT=N``: at the start of step N, fill the file system SAVE_PATH is on (a file beside it,
  written until the disk says ENOSPC; in ``CHAOS_FILL_DIR`` if set), as another process on the node would.
- ``CHAOS_READONLY_AT=N``: at the start of step N, make SAVE_PATH read-only with a read-only bind mount
  (needs a mount namespace: the test runs this script under ``unshare --user --map-root-user --mount``;
  chmod would not stop root).
"""

import argparse
import os
import signal
import subprocess
import sys

import torch

import distprof
from distprof.capture.backends import torch_backend
from distprof.rundir.store import RunDir

ap = argparse.ArgumentParser()
ap.add_argument("save")
ap.add_argument("steps", type=int)
ap.add_argument("--steps-plan", default="1,2,4,5")
ap.add_argument("--global-step", type=int, default=0)
ap.add_argument("--role", default="main")
args = ap.parse_args()

KILL_AT = os.environ.get("CHAOS_KILL_AT")
KILL_WINDOW = int(os.environ.get("CHAOS_KILL_WINDOW", "-1"))
READONLY_AT = int(os.environ.get("CHAOS_READONLY_AT", "-1"))
FILL_AT = int(os.environ.get("CHAOS_FILL_AT", "-1"))
closing = {"last": None}


TRAINING_PID = os.getpid()


def die() -> None:
    """SIGKILL the training process, and the child it forked to write the window if that is where we are."""
    os.kill(TRAINING_PID, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


if KILL_AT == "raw":
    real_check = torch_backend.check_trace

    def check_then_die(path):
        real_check(path)
        if closing["last"] == KILL_WINDOW:
            die()  # torch's plain JSON is on disk, under its hidden name; nothing is published yet

    torch_backend.check_trace = check_then_die
elif KILL_AT == "gzip":
    real_copy = torch_backend.shutil.copyfileobj

    class Copy:
        @staticmethod
        def copyfileobj(fin, fout, length=0):
            if closing["last"] != KILL_WINDOW:
                return real_copy(fin, fout, length)
            fout.write(fin.read(4096))
            fout.flush()
            die()  # half a gzip stream under its hidden name

    torch_backend.shutil = Copy
elif KILL_AT == "manifest":
    real_append = RunDir.append_manifest

    def append_or_die(self, rel_dir, record):
        if record.steps[1] == KILL_WINDOW:
            die()  # the trace is published; its manifest line never comes
        return real_append(self, rel_dir, record)

    RunDir.append_manifest = append_or_die

real_detach = torch_backend.TorchBackend.detach


def detach(self, first, last, **kw):  # every window's close starts here (finish() too); its writing may follow elsewhere
    closing["last"] = last
    return real_detach(self, first, last, **kw)


torch_backend.TorchBackend.detach = detach

cfg = distprof.ProfilerConfig(enable=True, save_path=args.save, steps=[int(s) for s in args.steps_plan.split(",")],
                              torch={"activities": ["cpu"]})
prof = distprof.Profiler(cfg, role=args.role, rank=0, world_size=1, global_step=args.global_step)
model = torch.nn.Linear(16, 16)
done = 0
with prof:
    for step in range(args.global_step, args.global_step + args.steps):
        if step == READONLY_AT:
            for cmd in (["mount", "--bind", args.save, args.save], ["mount", "-o", "remount,bind,ro", args.save]):
                subprocess.run(cmd, check=True)
        if step == FILL_AT:
            fill_dir = os.environ.get("CHAOS_FILL_DIR") or os.path.dirname(os.path.abspath(args.save))
            with open(os.path.join(fill_dir, "filler"), "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError:  # ENOSPC: the disk is full now
                    pass
        with distprof.annotate("train/compute"):
            model(torch.randn(8, 16)).sum().backward()
        prof.step()
        done += 1
print("done", done, "enabled" if prof.enabled else "disabled", flush=True)
sys.exit(0)
