#!/usr/bin/env python3
"""A stand-in for `rocprof-sys-python` (ROCm Systems Profiler cannot run here: no AMD GPU).

Interface as distprof uses it: `rocprof-sys-python [options] -- <python> <args>`, output directory
from ROCPROFSYS_OUTPUT_PATH. It runs the application and writes a result file there at exit.
"""
import json
import os
import subprocess
import sys

args = sys.argv[1:]
sep = args.index("--")
opts, app = args[:sep], args[sep + 1:]
rc = subprocess.call(app)
out = os.environ["ROCPROFSYS_OUTPUT_PATH"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "wall_clock.json"), "w") as f:
    json.dump({"options": opts, "app": app, "sampling_freq": os.environ.get("ROCPROFSYS_SAMPLING_FREQ")}, f)
sys.exit(rc)
