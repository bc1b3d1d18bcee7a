"""FSDP2 + CPU offload under the profiler (issue 10 item 10): real 2-process gloo FSDP2 jobs on CPU.

verl's and SkyRL's users report ``RuntimeError: _apply(): Couldn't swap ...weight`` with torch.profiler on
while an FSDP2 model is offloaded by hand (``model.cpu()``: ``nn.Module._apply`` swaps DTensor parameters
with ``torch.utils.swap_tensors``, which refuses tensors the profiler holds weak references to). The job
(tests/jobs/fsdp_job.py) reproduces it on CPU; distprof.capture.compat turns the responsible flags off for such
processes and releases the profiler's references as soon as a window is written.
"""

import json
import os
import subprocess
import sys

import msgspec
import pytest
from conftest import JOBS, load_trace, trace_files

JOB = os.path.join(JOBS, "fsdp_job.py")
ALL_FLAGS = ["record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"]
WARNING = "turning off torch.record_shapes and torch.with_flops in capture windows"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fsdp_offload")]


# The runs, in the order one job launch (two processes) trains them: launching the processes is most of the cost.
# The policy runs come first, in processes that never held a hand-offloaded model (distprof looks at the live
# FSDP2 modules); the plain torch.profiler run crashes, so it comes last (a failed run ends the job).
VARIANTS = [
    {"name": "policy-base", "offload": "policy", "final_offload": True},
    {"name": "policy-prof", "offload": "policy", "profiler": "distprof", "flags": ALL_FLAGS, "final_offload": True},
    {"name": "manual-base", "offload": "manual"},
    {"name": "manual-prof", "offload": "manual", "profiler": "distprof", "flags": ALL_FLAGS},
    {"name": "plain", "offload": "manual", "profiler": "plain", "flags": ["record_shapes"]},
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Every run's per-rank results, the job's stderr, and the folder holding each run's traces (by name)."""
    out = tmp_path_factory.mktemp("fsdp")
    proc = subprocess.run([sys.executable, JOB, str(out), json.dumps(VARIANTS)], check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "result.json") as f:
        results = json.load(f)
    return results, proc.stderr, out


def ran(job, name):
    """The per-rank results of one run (a run that failed ended the job: the runs after it have none)."""
    results, stderr, _ = job
    failed = [(n, r["error"]["message"]) for n, ranks in results.items() for r in ranks if r["error"]]
    assert name in results, f"run {name!r} did not run: the job ended after {failed[:1]}\n{stderr[-3000:]}"
    return results[name]


def assert_trained(ranks):
    for r in ranks:
        assert r["error"] is None, r["error"]["traceback"]
        assert len(r["losses"]) == 5


def manifest(run, rank):
    with open(run / "train" / f"rank{rank:05d}" / "manifest.jsonl", "rb") as f:
        return [msgspec.json.decode(line) for line in f]


def test_plain_torch_profiler_crashes_the_manual_offload(job):
    """The reproduction itself: the job, profiled by torch.profiler alone with record_shapes, dies in its
    first recorded step exactly as SkyRL's report does. Without this, the distprof test below proves nothing."""
    for r in ran(job, "plain"):
        assert r["error"] is not None and r["step"] == 2, r
        assert r["error"]["message"] == "_apply(): Couldn't swap FSDPLinear.weight"
        assert "Expected no weakrefs" in r["error"]["cause"]


def test_manual_offload_with_every_flag_trains_as_without_profiling(job):
    """Manual offload with every flag on: training finishes with the same losses and parameters as
    unprofiled, each rank writes its window, record_shapes and with_flops are off in it (said once per rank
    and in the trace), and the flags that are safe (memory, stacks, modules) still record."""
    _, stderr, out = job
    base, ranks, run = ran(job, "manual-base"), ran(job, "manual-prof"), out / "manual-prof"
    assert_trained(base)
    assert_trained(ranks)
    assert [r["losses"] for r in ranks] == [r["losses"] for r in base]
    assert [r["params"] for r in ranks] == [r["params"] for r in base]

    assert stderr.count(WARNING) == 2, stderr  # once per rank (in the whole job: the other runs say nothing)
    assert [sum(WARNING in w for w in r["warnings"]) for r in ranks] == [1, 1]  # in this run
    for rank in (0, 1):
        line = next(ln for ln in stderr.splitlines() if ln.startswith(f"rank{rank} ") and WARNING in ln)
        assert "Couldn't swap" in line and "CPUOffloadPolicy" in line and "FSDPLinear" in line
    files = trace_files(run)
    assert len(files) == 2
    for rank in (0, 1):
        (rec,) = manifest(run, rank)
        assert rec["steps"] == [2, 3] and rec["complete"]
    for path in files:
        doc = load_trace(path)
        assert doc["distprof"]["flags_off"] == ["record_shapes", "with_flops"]
        evs = doc["traceEvents"]
        assert not any("Input Dims" in e.get("args", {}) for e in evs)
        assert any(e.get("name") == "[memory]" for e in evs)  # profile_memory
        assert any(e.get("cat") == "python_function" for e in evs)  # with_stack
        assert any(e.get("name", "").startswith("nn.Module: FSDPLinear") for e in evs)  # with_modules
        assert any(e.get("name") == "ProfilerStep#3" for e in evs)


def test_cpu_offload_policy_keeps_every_flag(job):
    """FSDP2's own CPUOffloadPolicy never swaps: every flag stays on, training is unchanged, and the model can
    still be moved (a swap) after the window is written, which failed while torch's closed profile object
    waited for the cyclic garbage collector."""
    base, ranks, run = ran(job, "policy-base"), ran(job, "policy-prof"), job[2] / "policy-prof"
    assert_trained(base)
    assert_trained(ranks)  # includes the model.cpu() after the window
    assert [r["losses"] for r in ranks] == [r["losses"] for r in base]
    assert [r["params"] for r in ranks] == [r["params"] for r in base]
    assert not [w for r in ranks for w in r["warnings"] if WARNING in w]

    files = trace_files(run)
    assert len(files) == 2
    for path in files:
        doc = load_trace(path)
        assert "flags_off" not in doc["distprof"]
        evs = doc["traceEvents"]
        assert any("Input Dims" in e.get("args", {}) for e in evs)  # record_shapes (torch 2.13 writes no flops on CPU)
        assert any(e.get("name") == "[memory]" for e in evs)
        assert any(e.get("cat") == "python_function" for e in evs)
        assert any(e.get("name", "").startswith("nn.Module: FSDPLinear") for e in evs)
