"""A rank under ``distprof wrap`` (tests/e2e/test_wrap.py): it says who it is and who started it, runs a few steps
of a small loop with distprof's Profiler (the same DISTPROF_* settings the wrapper reads), then exits.

    python wrap_job.py OUT_DIR SECONDS_OF_WORK [EXIT_CODE]
"""
import json
import os
import sys
import time

from distprof import Profiler

out, seconds = sys.argv[1], float(sys.argv[2])
code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
rank = int(os.environ.get("RANK", "0"))
ppid = os.getppid()
with open(f"/proc/{ppid}/cmdline", "rb") as f:
    parent = [a.decode() for a in f.read().split(b"\0") if a]
with open(os.path.join(out, f"who-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "pid": os.getpid(), "ppid": ppid, "parent": parent,
               "wrapped_by": os.environ.get("DISTPROF_WRAPPED_BY")}, f)
print("app running", os.getpid(), file=sys.stderr, flush=True)
prof = Profiler().start()
steps = 5
for _ in range(steps):
    end = time.monotonic() + seconds / steps
    while time.monotonic() < end:  # busy: something for a sampling profiler to see
        sum(range(10_000))
    prof.step()
prof.stop()
sys.exit(code)
