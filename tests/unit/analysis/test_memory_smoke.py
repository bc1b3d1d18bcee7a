"""benchmarks/gpu_smoke.py's memory check (it needs a GPU for the real OOM) on a stand-in OOM snapshot: the same code
path, so the script is import-checked and its checks exercised without a device."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "jobs"))
from memsnap_standin import Builder, frame, write

SMOKE = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_smoke.py"


def _smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SMOKE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _oom_run(tmp_path, annotations: bool) -> str:
    b = Builder()
    b.segment(8 << 30)
    b.annotate("ProfilerStep#3", "START")
    b.annotate("fill", "START")
    for _ in range(3):
        b.alloc(2 << 30, [frame("/repo/benchmarks/gpu_smoke.py", 240, "check_oom")])
    b.oom(2 << 30, device_free=1 << 30, frames=[frame("/repo/benchmarks/gpu_smoke.py", 240, "check_oom")])
    write(str(tmp_path / "oom-20261127T000000-pid1.memory.pickle"), b.snapshot(annotations=annotations))
    return str(tmp_path)


def test_memory_check_passes_on_a_stand_in_oom(tmp_path, capsys):
    smoke = _smoke()
    smoke.FAILED.clear()
    smoke.check_memory_answers(_oom_run(tmp_path, True), request_bytes=2 << 30, held_bytes=6 << 30, phase="fill")
    out = capsys.readouterr().out
    assert smoke.FAILED == [], out
    assert "OOM: at the OOM (step 3, in fill), 6.4 GB allocated" in out


def test_memory_check_without_annotations_names_the_frame_and_fails_a_wrong_request(tmp_path, capsys):
    smoke = _smoke()
    smoke.FAILED.clear()
    smoke.check_memory_answers(_oom_run(tmp_path, False), request_bytes=1 << 30, held_bytes=6 << 30, phase="fill")
    assert smoke.FAILED == ["memory: the request is the block that failed"], capsys.readouterr().out
