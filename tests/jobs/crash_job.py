"""A training loop that dies at step 4, inside the 3-5 capture window, in the way argv[1] names.

Run by tests/test_crash.py as a real child process (alone, or under torchrun): distprof must still
write the steps it captured, and the process must end exactly as it would without distprof.

    python crash_job.py HOW SAVE_PATH [STYLE]

HOW: raise | exit | sigterm_wait (print "ready" at step 4, then block on stdin until SIGTERM) | ok |
sigterm_in_step (SIGTERM arrives inside the profiler's step that starts step 4) |
peer_dies (under torchrun, 2 ranks: rank 1 raises at step 4 while rank 0 is still busy in it, until torchrun
tears rank 0 down with SIGTERM) |
short (the loop ends after step 4: stop() / the end of the with block cuts the window short) |
fork (a raw os.fork() at step 4 inside the window; the child runs the rest of the loop and leaves the with block,
then runs the atexit handlers and ends; the parent prints "child exit N") |
train_on (the window 3-5 closes and is written in the background; step 6 prints "training on" and blocks, as a
long step does, until a signal ends it) |
exit_after (sys.exit(0) at step 6, right after the window 3-5 closed: its background export may still run).
INLINE_EXPORT=1 in the environment: windows are written inside the closing step (torch.background_export: false).
STYLE: startstop (default) | with | callback.

With HOLD_EXPORT=1 in the environment, every window export stops once torch has written its temporary trace: the
job prints "exporting" and reads stdin: "more" prints "again" and reads on (the test sends one more signal before
each), "go" lets the export finish. The test signals the job exactly while it exports, with no sleep.
"""

import os
import signal
import sys
import threading

import torch

import distprof

# The tests send SIGINT as a terminal's Ctrl-C does. A suite started in the background by a shell without job
# control hands every process SIGINT ignored, and Python then installs no KeyboardInterrupt handler: put Python's
# own back, as a job started from a terminal has it.
signal.signal(signal.SIGINT, signal.default_int_handler)

HOW, SAVE = sys.argv[1], sys.argv[2]
STYLE = sys.argv[3] if len(sys.argv) > 3 else "startstop"


class Callback:
    """Callback style: a trainer starts the profiler in one hook and would stop it in another."""

    def __init__(self, config):
        self.config = config
        self.prof = None

    def on_train_begin(self):
        self.prof = distprof.Profiler(self.config, role="main").start()

    def on_step_end(self):
        self.prof.step()

    def on_train_end(self):  # never reached when the loop dies
        self.prof.stop()


def step_body(step: int) -> None:
    global child
    with distprof.annotate("train/compute"):
        if child == 0:  # a forked child does no torch math: libgomp's thread pool hangs after a fork (not distprof)
            return
        x = torch.randn(32, 32) @ torch.randn(32, 32)
    if dist_on and step != 4:
        torch.distributed.all_reduce(x)
    if step == 6 and HOW == "train_on":
        print("training on", flush=True)
        threading.Event().wait()  # interruptible, as Python code is: the test's signal ends it
    if step == 6 and HOW == "exit_after":
        sys.exit(0)
    if step != 4:
        return
    if HOW == "raise" or (HOW == "peer_dies" and rank == 1):
        raise RuntimeError("boom at step 4")
    if HOW == "peer_dies":
        threading.Event().wait()  # a long step (interruptible, as Python code is); torchrun's SIGTERM ends it
    if HOW == "exit":
        sys.exit(3)
    if HOW == "fork":
        child = os.fork()
    if HOW == "sigterm_wait":
        print("ready", flush=True)
        sys.stdin.readline()  # the parent sends SIGTERM now; nothing ever arrives on stdin


if HOW == "sigterm_in_step":
    # SIGTERM lands inside the profiler's own step (torch.profiler's state change) at step 4.
    import signal

    from distprof.capture.backends import torch_backend

    _advance = torch_backend.TorchBackend.advance

    def advance(self, step):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))  # Python code runs on: the handler has run by now
        _advance(self, step)

    torch_backend.TorchBackend.advance = advance

if os.environ.get("HOLD_EXPORT"):
    from distprof.capture.backends import torch_backend

    _check_trace = torch_backend.check_trace

    def _tick():
        pass  # a Python call: the handler of a signal that came during the read has run by its return

    def check_trace(path):
        print("exporting", flush=True)  # torch's temporary trace is on disk; the window is not published yet
        while sys.stdin.readline().strip() == "more":
            _tick()
            print("again", flush=True)
        _check_trace(path)

    torch_backend.check_trace = check_trace

child = None
STEPS = 5 if HOW == "short" else 8
dist_on = "RANK" in os.environ
if dist_on:
    torch.distributed.init_process_group("gloo")
rank = int(os.environ.get("RANK", 0))
config = distprof.ProfilerConfig(enable=True, save_path=SAVE, steps="3-5", ranks="all",
                                 torch={"activities": ["cpu"], "background_export": not os.environ.get("INLINE_EXPORT")})

if STYLE == "with":
    with distprof.Profiler(config, role="main") as prof:
        for step in range(STEPS):
            step_body(step)
            prof.step()
elif STYLE == "callback":
    cb = Callback(config)
    cb.on_train_begin()
    for step in range(STEPS):
        step_body(step)
        cb.on_step_end()
    cb.on_train_end()
else:
    prof = distprof.Profiler(config, role="main")
    prof.start()
    for step in range(STEPS):
        step_body(step)
        prof.step()
    prof.stop()

if HOW == "fork":
    if child == 0:
        # Python's exit path (atexit: distprof's handler runs in the child too), without C++'s static destructors:
        # a child forked while torch's profiler ran hangs in Kineto's ConfigLoader destructor (torch 2.13, with or
        # without distprof), so it ends by os._exit, as multiprocessing's children do.
        import atexit
        import logging

        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    _, status = os.waitpid(child, 0)
    print(f"child exit {os.waitstatus_to_exitcode(status)}", flush=True)

if HOW == "ok" and dist_on:
    # torch 2.13 (CPU) aborts about one gloo process exit in fifteen, profiler on or off ("terminate called
    # without an active exception" once Python has finalized; see distprof/demo/gloo_job.py): the run is over and
    # every file written, so a clean run skips interpreter teardown rather than fail the test that reads its logs.
    import logging

    torch.distributed.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
