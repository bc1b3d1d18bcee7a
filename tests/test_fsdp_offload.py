"""FSDP2 + CPU offload under the profiler (issue 10 item 10): real 2-process gloo FSDP2 jobs on CPU.

verl's and SkyRL's users report ``RuntimeError: _apply(): Couldn't swap ...weight`` with torch.profiler on
while an FSDP2 model is offloaded by hand (``model.cpu()``: ``nn.Module._apply`` swaps DTensor parameters
with ``torch.utils.swap_tensors``, which refuses tensors the profiler holds weak references to). The job
(tests/fsdp_job.py) reproduces it on CPU; distprof.compat turns the responsible flags off for such
processes and releases the profiler's references as soon as a window is written.
"""

import json
import os
import subprocess
import sys

import msgspec
import pytest
from conftest import load_trace, trace_files

JOB = os.path.join(os.path.dirname(__file__), "fsdp_job.py")
ALL_FLAGS = "record_shapes,profile_memory,with_stack,with_flops,with_modules"
WARNING = "turning off torch.record_shapes and torch.with_flops in capture windows"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fsdp_offload")]


def run_job(tmp_path, name, offload, *args):
    """Run the job; returns (per-rank results, stderr)."""
    result = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, JOB, str(result), offload, *args], check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(result) as f:
        return json.load(f)["ranks"], proc.stderr


def assert_trained(ranks):
    for r in ranks:
        assert r["error"] is None, r["error"]["traceback"]
        assert len(r["losses"]) == 5


def manifest(run, rank):
    with open(run / "train" / f"rank{rank:05d}" / "manifest.jsonl", "rb") as f:
        return [msgspec.json.decode(line) for line in f]


def test_plain_torch_profiler_crashes_the_manual_offload(tmp_path):
    """The reproduction itself: the job, profiled by torch.profiler alone with record_shapes, dies in its
    first recorded step exactly as SkyRL's report does. Without this, the distprof test below proves nothing."""
    ranks, _ = run_job(tmp_path, "plain", "manual", "--plain", "--profile", str(tmp_path / "plain"),
                       "--flags", "record_shapes")
    for r in ranks:
        assert r["error"] is not None and r["step"] == 2, r
        assert r["error"]["message"] == "_apply(): Couldn't swap FSDPLinear.weight"
        assert "Expected no weakrefs" in r["error"]["cause"]


def test_manual_offload_with_every_flag_trains_as_without_profiling(tmp_path):
    """Manual offload with every flag on: training finishes with the same losses and parameters as
    unprofiled, each rank writes its window, record_shapes and with_flops are off in it (said once per rank
    and in the trace), and the flags that are safe (memory, stacks, modules) still record."""
    base, _ = run_job(tmp_path, "base", "manual")
    run = tmp_path / "prof"
    ranks, stderr = run_job(tmp_path, "prof", "manual", "--profile", str(run), "--flags", ALL_FLAGS)
    assert_trained(base)
    assert_trained(ranks)
    assert [r["losses"] for r in ranks] == [r["losses"] for r in base]
    assert [r["params"] for r in ranks] == [r["params"] for r in base]

    assert stderr.count(WARNING) == 2, stderr  # once per rank
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


def test_cpu_offload_policy_keeps_every_flag(tmp_path):
    """FSDP2's own CPUOffloadPolicy never swaps: every flag stays on, training is unchanged, and the model can
    still be moved (a swap) after the window is written, which failed while torch's closed profile object
    waited for the cyclic garbage collector."""
    base, _ = run_job(tmp_path, "base", "policy", "--final-offload")
    run = tmp_path / "prof"
    ranks, stderr = run_job(tmp_path, "prof", "policy", "--profile", str(run), "--flags", ALL_FLAGS,
                            "--final-offload")
    assert_trained(base)
    assert_trained(ranks)  # includes the model.cpu() after the window
    assert [r["losses"] for r in ranks] == [r["losses"] for r in base]
    assert [r["params"] for r in ranks] == [r["params"] for r in base]
    assert WARNING not in stderr

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
