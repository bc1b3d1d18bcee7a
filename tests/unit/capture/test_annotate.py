"""annotate(): decorator and context manager; exact semantics when inert and when a window is open."""

import asyncio
import subprocess
import sys
import threading
from functools import partial

import pytest
from conftest import config, trace_files, trace_names

import distprof
from distprof import Profiler, ProfilerConfig, annotate

STATE = sys.modules["distprof.capture.annotate"]._STATE


cfg = partial(config, steps=[1])


def test_inert_annotate_is_a_cached_noop():
    assert annotate("a") is annotate("a")
    calls = []
    with annotate("a") as a:
        calls.append(1)
    assert a is annotate("a") and calls == [1] and STATE.opened == 0


class Boom(Exception):
    pass


@pytest.mark.parametrize("window", [False, True])
def test_exception_propagates_untouched_range_closed_code_runs_once(tmp_path, window):
    p = Profiler(cfg(tmp_path, steps=[0]) if window else ProfilerConfig())
    runs = []
    err = Boom("x")

    @annotate("f")
    def f():
        runs.append(1)
        raise err

    with p:
        with pytest.raises(Boom) as e:
            f()
        assert e.value is err
        with pytest.raises(Boom) as e2:
            with annotate("g"):
                runs.append(2)
                raise err
        assert e2.value is err and STATE.opened == 0
        p.step()
    assert runs == [1, 2]
    if window:
        names = trace_names(trace_files(tmp_path / "run")[0])
        assert "f" in names and "g" in names, str(names)


@pytest.mark.slow
def test_first_window_in_a_process_without_torch_imported_records_annotations(tmp_path):
    import subprocess

    code = f"""
import sys, distprof
assert 'torch' not in sys.modules
p = distprof.Profiler(distprof.ProfilerConfig(enable=True, save_path={str(tmp_path / 'r')!r}, steps=[0], torch={{'activities': ['cpu']}}))
with p:
    with distprof.annotate('first/range'):
        pass
    p.step()
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    assert "first/range" in trace_names(trace_files(tmp_path / "r")[0])


def test_methods_functions_async_and_bare_decorator(tmp_path):
    class Worker:
        @annotate("worker/update")
        def update(self, x):
            return x + 1

    @annotate
    def plain(x):
        return x * 2

    @annotate("async/generate")
    async def gen(x):
        return x - 1

    assert plain.__name__ == "plain" and Worker.update.__name__ == "update"
    p = Profiler(cfg(tmp_path))
    with p:
        for _ in range(3):
            assert Worker().update(1) == 2 and plain(3) == 6 and asyncio.run(gen(5)) == 4
            p.step()
    names = trace_names(trace_files(tmp_path / "run")[0])
    qual = "test_methods_functions_async_and_bare_decorator.<locals>.plain"
    assert {"worker/update", qual, "async/generate"} <= set(names)
    t = p.annotation_times(total=True)
    assert t["worker/update"]["count"] == 1 and t[qual]["count"] == 1


def test_nested_and_threaded_ranges_recorded(tmp_path):
    p = Profiler(cfg(tmp_path))
    with p:
        for _ in range(3):
            with annotate("outer"):
                with annotate("inner"):
                    pass
            th = threading.Thread(target=lambda: annotate("thread/work").__enter__().__exit__(None, None, None))
            th.start()
            th.join()
            p.step()
    names = trace_names(trace_files(tmp_path / "run")[0])
    assert names.count("outer") == 1 and names.count("inner") == 1
    assert p.annotation_times()["thread/work"]["count"] == 1
    assert STATE.opened == 0 and STATE.active == 0


def test_range_entered_before_window_opens_is_harmless(tmp_path):
    p = Profiler(cfg(tmp_path, steps=[0]))
    with annotate("early"):
        p.start()  # a window opens while the range is open
    assert STATE.opened == 0
    p.step()
    p.stop()
    assert "early" not in trace_names(trace_files(tmp_path / "run")[0])


def test_bad_name():
    with pytest.raises(ValueError, match="non-empty string"):
        annotate("")


def test_public_api_names():
    assert {"ProfilerConfig", "Profiler", "annotate"} <= set(distprof.__all__)


def test_nvtx_ranges_when_cuda_is_available(tmp_path, monkeypatch):
    """No GPU here: torch.cuda's availability and NVTX calls are replaced by recorders (a stand-in for
    the real CUDA runtime); the range logic around them is the real code."""
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    monkeypatch.setattr("distprof.capture.backends.torch_backend.TorchBackend._activities",
                        lambda self, torch: [torch.profiler.ProfilerActivity.CPU])
    p = Profiler(cfg(tmp_path, steps=[0]))
    with p:
        with pytest.raises(Boom):
            with annotate("nv/outer"):
                with annotate("nv/inner"):
                    raise Boom()
        p.step()
    assert calls == [("push", "nv/outer"), ("push", "nv/inner"), ("pop",), ("pop",)]


# ---- pickling: annotated functions and classes travel to other processes (Ray, multiprocessing) ----------

_DEFINE = """
import distprof

class Actor:
    @distprof.annotate("actor/update")
    def update(self, x):
        import torch
        return float((torch.randn(8, 8) @ torch.randn(8, 8)).sum()) * 0 + x + 1

@distprof.annotate
def free(x):
    return x * 2
"""

_SEND = _DEFINE + """
import sys
from ray import cloudpickle
open(sys.argv[1], "wb").write(cloudpickle.dumps((Actor, free)))
"""

_RECEIVE = """
import pickle, sys, glob, gzip, json
import distprof
Actor, free = pickle.loads(open(sys.argv[1], "rb").read())
config = distprof.ProfilerConfig(enable=True, save_path=sys.argv[2], steps=[0], torch={"activities": ["cpu"]})
with distprof.Profiler(config, role="main") as prof:
    assert Actor().update(1) == 2 and free(3) == 6
    prof.step()
[path] = glob.glob(sys.argv[2] + "/main/rank00000/*.pt.trace.json.gz")
names = {e.get("name") for e in json.load(gzip.open(path, "rt"))["traceEvents"]}
assert "actor/update" in names and "free" in names, sorted(n for n in names if n and "/" in n)
"""


@pytest.mark.slow
def test_annotated_main_classes_pickle_by_value_and_annotate_in_the_receiving_process(tmp_path):
    """A class defined in a driver's __main__ (Ray pickles it by value) goes to a fresh process and its ranges
    land in that process's own window (the annotate state is the receiver's, not a copy of the sender's)."""
    blob = tmp_path / "blob"
    for code, args in ((_SEND, [str(blob)]), (_RECEIVE, [str(blob), str(tmp_path / "run")])):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]


def test_annotated_functions_pickle_with_plain_pickle_and_cloudpickle():
    import pickle

    from ray import cloudpickle

    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps(_module_level_annotated))
        assert back(2) == 4
        assert pickle.loads(dumps(annotate("x/y"))) is annotate("x/y")  # the receiver's cached range


@annotate("test/module_level")
def _module_level_annotated(x):
    return x * 2
