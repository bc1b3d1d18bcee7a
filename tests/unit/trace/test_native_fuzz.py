"""The native decoder fuzzed on its own (issue 24): whatever the bytes, ``native.reduce_native`` answers None or a
:class:`~distprof.trace.columns.Columns`, never crashes the process and never takes unbounded memory.

One child process (a crash is then a signal seen here, not the end of pytest) under an address-space limit (1 GiB
beyond what the interpreter holds once imported, plus the biggest input) is fed a few thousand inputs: random
bytes, mutations and truncations of a real run, a million nested ``[`` / ``{``, numbers of a million digits, a 50 MB
string, a run of 200,000 tiny events. The child writes each input before reducing it, so a crash names it.

The native half needs the library, built by ``pip install -e .`` where cargo exists; without it the child feeds
the same inputs to the Python path (``reduce_run``: the fallback must not raise either), and
``test_native_built_where_cargo_is`` in test_native_differential.py fails where cargo is on PATH but the library
is not loaded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import DATA
from nativekit import require_built

from distprof.trace import native
from distprof.trace.reader import TraceStream

try:
    from distprof.trace import nativelib  # (the loader: absent until the build half of issue 24 is merged)
except ImportError:
    nativelib = None
NATIVE = native.available()  # (at collection, before the tests' environment is cleaned: see conftest._clean_env)

CHILD = r'''
import os, random, resource, sys
from distprof.trace import native
from distprof.trace.columns import Columns, reduce_run

run_path, last_path, use_native = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
reduce = native.reduce_native if use_native else reduce_run
if use_native and not native.available():
    print("the native path is not available in the child")
    sys.exit(3)
BIG = 50 << 20


def vm_size():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


limit = vm_size() + (1 << 30) + 3 * BIG  # 1 GiB beyond the interpreter, plus the biggest input (and a copy)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
RUN = open(run_path, "rb").read()
rnd = random.Random(24)
ALPHABET = b'[]{}",:0123456789.eE-+ \\u/phXMintruefalsenul\xc3\xa9\xff'


def mutate(data):
    b = bytearray(data)
    for _ in range(rnd.randint(1, 3)):
        op, at = rnd.randrange(6), rnd.randrange(len(b) + 1)
        if op == 0 and at < len(b):
            b[at] ^= 1 << rnd.randrange(8)
        elif op == 1 and at < len(b):
            b[at] = rnd.choice(ALPHABET)
        elif op == 2:
            b[at:at] = bytes(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 4)))
        elif op == 3:
            del b[at:at + rnd.randint(1, 16)]
        elif op == 4:
            b[at:at] = b[at:at + rnd.randint(1, 64)]
        else:
            b[at:at] = rnd.choice([b"[", b"{", b"]", b"}", b'"', b"\\", b",", b":", b"\\ud800", b"1e999"])
    return bytes(b)


def inputs():
    for i in range(400):
        n = rnd.randint(0, 256)
        yield f"random {i}", (bytes(rnd.choice(ALPHABET) for _ in range(n)) if i % 2 else rnd.randbytes(n))
    for i in range(1200):
        yield f"mutation {i}", mutate(RUN)
    for k in range(0, len(RUN), 7):
        yield f"truncated at {k}", RUN[:k]
        yield f"truncated at {k}, closed", RUN[:k] + b"]"
    m = 10**6
    yield "a million [", b"[" * m
    yield "a million {", b"{" * m
    yield "a million [ closed", b"[" * m + b"]" * m
    yield "args a million [ deep", b'[{"ph":"X","args":' + b"[" * m + b"]" * m + b"}]"
    yield "args a million {\"a\": deep", b'[{"ph":"X","args":' + b'{"a":' * m + b"1" + b"}" * m + b"}]"
    yield "a million [{ alternating", b"[{" * m
    yield "ts of a million digits", b'[{"ph":"X","ts":' + b"1" * m + b"}]"
    yield "ts with a huge exponent", b'[{"ph":"X","ts":1e' + b"9" * 1000 + b"}]"
    yield "ts with a million-digit fraction", b'[{"ph":"X","ts":0.' + b"0" * m + b"1}]"
    yield "correlation of a million digits", b'[{"ph":"X","cat":"kernel","args":{"correlation":' + b"9" * m + b"}}]"
    yield "a size of a million digits", (b'[{"ph":"X","cat":"kernel","args":{"Collective name":"a","In msg nelems":' +
                                         b"7" * m + b"}}]")
    yield "a 50 MB name", b'[{"ph":"X","name":"' + b"a" * BIG + b'"}]'
    yield "a 50 MB name of escapes", b'[{"ph":"X","name":"' + b"\\n" * (BIG // 2) + b'"}]'
    yield "a 50 MB string, unterminated", b'[{"ph":"X","name":"' + b"a" * BIG
    yield "a 50 MB args string", (b'[{"ph":"X","cat":"kernel","args":{"Collective name":"' + b"\xc3\xa9" * (BIG // 2) +
                                   b'"}}]')
    yield "200,000 tiny events", b"[" + b",".join([b'{"ph":"X"}'] * 200_000) + b"]"
    yield "200,000 tiny named events", b"[" + b",".join(b'{"ph":"X","name":"n%d","ts":%d,"dur":1}' % (i, i)
                                                        for i in range(200_000)) + b"]"


count = answered = 0
with open(last_path, "wb") as last:
    for label, data in inputs():
        last.seek(0)
        last.write(label.encode() + b"\n" + data[:2000])
        last.truncate()
        last.flush()
        got = reduce(data)
        if got is not None and not isinstance(got, Columns):
            print(f"{label}: answered {type(got).__name__}, neither None nor Columns")
            sys.exit(2)
        count += 1
        answered += got is not None
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
print(f"ok {count} inputs, {answered} answered, peak RSS {peak} MB, native {use_native}")
'''


def _small_run(tmp_path) -> str:
    """A real run of a few KB (kernels, runtime calls, gloo collectives), cut as the reader cuts them."""
    t = TraceStream(os.path.join(DATA, "distprof-h100", "ddp-gloo-cuda-slow-rank1", "trainer", "rank00000",
                                 "step00000003-00000006.pt.trace.json.gz"), lean=True, batch_bytes=4096)
    run = next(b for b in t.batches(defer=True) if isinstance(b, (bytes, bytearray)))
    path = tmp_path / "run.json"
    path.write_bytes(bytes(run))
    return str(path)


def test_native_fuzz_in_a_child(tmp_path):
    require_built()
    last = tmp_path / "last.bin"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    use = "1" if NATIVE else "0"
    if NATIVE:  # the child loads the library this process uses (the tests' environment has no DISTPROF_* variables)
        env["DISTPROF_NATIVE_LIB"] = nativelib.load()._name
    proc = subprocess.run([sys.executable, "-c", CHILD, _small_run(tmp_path), str(last), use], capture_output=True,
                          text=True, env=env, timeout=300)
    if proc.returncode != 0:
        label, _, head = last.read_bytes().partition(b"\n") if last.exists() else (b"?", b"", b"")
        how = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exit status {proc.returncode}")
        raise AssertionError(f"the child {how} on input {label.decode()!r} (first bytes: {head[:300]!r}); "
                             f"stdout: {proc.stdout[-2000:]}; stderr: {proc.stderr[-3000:]}")
    assert proc.stdout.startswith("ok "), proc.stdout + proc.stderr
    print(proc.stdout.strip())
