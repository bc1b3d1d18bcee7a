#!/usr/bin/env python3
"""A stand-in for `nsys profile` (Nsight Systems cannot run here: no GPU, no nsys).

It parses the options distprof renders, runs the application as its child like
nsys does, records its own argv, and writes the report (`-o PATH` + `.nsys-rep`)
when the application exits or when it receives SIGINT, as nsys does. SIGTERM
kills it without a report, which is exactly the behaviour the wrapper must handle.
"""
import json
import signal
import subprocess
import sys

args = sys.argv[1:]
assert args[0] == "profile", args
out, i, opts = None, 1, []
while i < len(args):
    a = args[i]
    if a == "-o":
        out = args[i + 1]
        i += 2
    elif a.startswith("--") or (a.startswith("-") and len(a) == 2):
        opts.append(a)
        if len(a) == 2:  # one-letter option takes a value
            opts.append(args[i + 1])
            i += 1
        i += 1
    else:
        break
app = args[i:]
child = None


def write_report(*_):
    with open(out + ".nsys-rep", "w") as f:
        json.dump({"argv": sys.argv, "options": opts, "app": app}, f)


def on_int(*_):
    write_report()
    if child is not None:
        child.terminate()
    sys.exit(0)


signal.signal(signal.SIGINT, on_int)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
sys.stderr.write("fake-nsys> collecting\n")
sys.stderr.flush()
child = subprocess.Popen(app)
rc = child.wait()
write_report()
sys.exit(rc)
