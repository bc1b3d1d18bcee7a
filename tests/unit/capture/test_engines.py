"""Rollout engines' profilers driven at the planned steps (distprof.capture.engines), tested against the STAND-IN engine
(distprof.demo.engine_standin): vLLM and SGLang need CUDA, so their documented API is served by real worker
processes recording real torch.profiler traces instead."""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import urllib.request

import pytest
from conftest import config
from hypothesis import given, settings
from hypothesis import strategies as st

import distprof
from distprof.analysis.check import check_run
from distprof.capture.engines.contract import parse_ranks, sglang_file_name, vllm_file_name
from distprof.demo.engine_standin import StandinLLM, StandinServer
from distprof.rundir.manifest import read_manifest


def _generate(url: str, n: int = 3) -> None:
    req = urllib.request.Request(url + "/generate", data=json.dumps({"iterations": n}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def _config(tmp_path, steps, engine) -> distprof.ProfilerConfig:
    return config(tmp_path, steps=steps, per_role={"rollout": {"engine": engine}})


def _train(prof, steps: int, work, sync: bool = True) -> int:
    """``steps`` steps of ``work``. ``sync``: before each step, the engine's start (sent a step ahead, on a thread)
    has landed: the test's steps last milliseconds, a real RL step seconds to minutes."""
    ran = 0
    with prof:
        for _ in range(steps):
            if sync and prof._engine is not None:
                prof._engine.wait_started(30)
            work()
            ran += 1
            prof.step()
    assert prof._engine.wait(60)
    return ran


def _lines(run, rank: int, role: str = "rollout/engine"):
    with open(os.path.join(run, role, f"rank{rank:05d}", "manifest.jsonl"), "rb") as f:
        got = read_manifest(f.read())
    assert not got.problems
    return got.records


def _trace_events(path: str) -> list[str]:
    with gzip.open(path, "rt") as f:
        return [e.get("name") for e in json.load(f)["traceEvents"]]


def test_contract_file_names_round_trip():
    assert parse_ranks("vllm", vllm_file_name("ab12", 3, 1700000000000000000)) == {"rank": 3}
    assert parse_ranks("sglang", sglang_file_name("1700.5", tp=1, dp=2, pp=1, ep=3, dp_size=4, pp_size=2,
                                                  ep_size=8, prefix="exp")) == {"tp": 1, "dp": 2, "pp": 1, "ep": 3}
    assert parse_ranks("sglang", sglang_file_name("1700.5", tp=0, stage="decode")) == {
        "tp": 0, "dp": 0, "pp": 0, "ep": 0, "stage": "decode"}
    assert parse_ranks("sglang", "merged-1700.5.trace.json.gz") is None
    assert parse_ranks("vllm", "ab12-rank-0.txt") is None


def test_sglang_http_windows_land_in_rollout_engine(tmp_path):
    with StandinServer("sglang", ranks=2) as srv:
        cfg = _config(tmp_path, [1, 3], {"kind": "sglang", "url": srv.url, "trace_dir": str(tmp_path / "eng")})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
        assert _train(prof, 5, lambda: _generate(srv.url)) == 5
        starts = [b for p, b in srv.requests if p == "/start_profile"]
    run = str(tmp_path / "run")
    assert len(starts) == 2 and all(b["output_dir"].startswith(str(tmp_path / "eng")) for b in starts)
    for rank in (0, 1):
        recs = _lines(run, rank)
        assert [r.steps for r in recs] == [[1, 1], [3, 3]]
        assert all(r.complete and r.engine["engine"] == "sglang" and r.engine["version"] == "0.5.0-standin"
                   and r.engine["replica"] == 0 and r.engine["ranks"]["tp"] == rank for r in recs)
        for r in recs:
            names = _trace_events(os.path.join(run, r.files[0].path))
            assert "prefill" in names and "decode" in names  # the worker's real generation, recorded there
    res = check_run(run)
    assert res.ok, [i for i in res.items if i.status != "ok"]
    assert {"role": "rollout/engine", "world_size": 2, "backend": "torch"} in res.roles


def test_rl_step_view_counts_engine_iterations_once_over_its_tensor_parallel_ranks(tmp_path):
    """The engine's traces join the RL step view as the role rollout/engine: its iterations are those of one
    step's generation, not multiplied by its 2 TP ranks, with prefill and decode time from the engine's work."""
    from distprof.analysis import analyze

    with StandinServer("sglang", ranks=2) as srv:
        cfg = _config(tmp_path, [2, 2], {"kind": "sglang", "url": srv.url, "trace_dir": str(tmp_path / "eng")})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)

        def step():
            with distprof.annotate("rollout/generate"):
                _generate(srv.url, n=3)

        _train(prof, 4, step)
    (rl,) = analyze.steps(str(tmp_path / "run"), workers=1)["rl_steps"]
    assert rl["step"] == 2 and {r["role"] for r in rl["roles"]} == {"rollout", "rollout/engine"}
    (eng,) = rl["engine"]
    assert eng["role"] == "rollout/engine" and eng["engine_iterations"] == 3
    assert eng["prefill_us"] > 0 and eng["decode_us"] > 0


def test_vllm_http_window_from_server_trace_dir(tmp_path):
    tdir = tmp_path / "vllm-traces"
    with StandinServer("vllm", ranks=2, trace_dir=str(tdir)) as srv:
        cfg = _config(tmp_path, [2], {"kind": "vllm", "url": srv.url, "trace_dir": str(tdir)})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
        _train(prof, 4, lambda: _generate(srv.url))
        assert all(b is None for p, b in srv.requests if p.endswith("_profile"))  # vLLM's routes take no body
    run = str(tmp_path / "run")
    for rank in (0, 1):
        (rec,) = _lines(run, rank)
        assert rec.steps == [2, 2] and rec.complete and rec.engine["ranks"] == {"rank": rank}
        assert rec.engine["version"] == "0.13.0-standin" and rec.engine["files"][0].endswith(".pt.trace.json.gz")
    assert check_run(run).ok


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_in_process_engine_attached(tmp_path, kind):
    llm = StandinLLM(kind, ranks=2, trace_dir=str(tmp_path / "t"))
    try:
        cfg = distprof.ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[1],
                                      torch={"activities": ["cpu"]})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
        assert distprof.capture.engines.attach(prof, llm, kind=kind, trace_dir=str(tmp_path / "t"))
        _train(prof, 3, lambda: llm.generate(2))
    finally:
        llm.close()
    run = str(tmp_path / "run")
    assert [len(_lines(run, r)) for r in (0, 1)] == [1, 1]
    assert _lines(run, 1)[0].engine["engine"] == kind and check_run(run).ok


def test_sglang_first_n_iterations(tmp_path):
    with StandinServer("sglang", ranks=2) as srv:
        cfg = _config(tmp_path, [1], {"kind": "sglang", "url": srv.url, "iterations": 2})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
        _train(prof, 3, lambda: _generate(srv.url, 5))
        assert [b.get("num_steps") for p, b in srv.requests if p == "/start_profile"] == [2]
    (rec,) = _lines(str(tmp_path / "run"), 0)
    names = _trace_events(os.path.join(str(tmp_path / "run"), rec.files[0].path))
    assert rec.complete and names.count("prefill") + names.count("decode") == 2  # 2 of the step's 5 iterations


def test_flush_timeout_never_blocks_training(tmp_path, caplog):
    gate = threading.Event()  # the engine's flush does not finish until the test lets it
    srv = StandinServer("sglang", ranks=2, flush_gate=gate)
    try:
        cfg = _config(tmp_path, [1], {"kind": "sglang", "url": srv.url, "flush_timeout_s": 0.2})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
        with caplog.at_level(logging.WARNING, logger="distprof"):
            assert _train(prof, 4, lambda: _generate(srv.url)) == 4
        assert not gate.is_set()  # training and the recorded timeout both happened while the flush was still held
        (rec,) = _lines(str(tmp_path / "run"), 0)
        assert not rec.complete and rec.stopped_by == "flush_timeout" and rec.files == []
        assert sum("did not finish writing" in r.getMessage() for r in caplog.records) == 1
        assert not check_run(str(tmp_path / "run")).ok  # the window is reported incomplete
    finally:
        gate.set()
        srv.close()


def test_the_start_is_sent_a_step_ahead_and_a_slow_start_never_holds_a_step(tmp_path):
    """An engine's profiler can take seconds to start: the request goes out at the step before the window, on a
    thread, so the step boundaries never wait for it and the window's own steps are profiled whole."""
    gate = threading.Event()
    with StandinServer("sglang", ranks=2, start_gate=gate) as srv:
        cfg = _config(tmp_path, [2, 3], {"kind": "sglang", "url": srv.url, "trace_dir": str(tmp_path / "eng")})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
        seen = []

        def work():
            step = prof.global_step
            if step == 2:
                gate.set()  # step 1 (the warm-up step) ran to its end with the start still held
                assert prof._engine.wait_started(30) is True
            seen.append((step, srv.engine.profiling))
            _generate(srv.url)

        _train(prof, 5, work, sync=False)
        order = [p for p, _ in srv.requests if p in ("/start_profile", "/generate", "/stop_profile")]
    assert seen[:4] == [(0, False), (1, False), (2, True), (3, True)]  # (the stop, too, is sent off-thread)
    assert order.index("/start_profile") < 3 and order.count("/generate") == 5  # sent during step 1 at the latest
    (rec,) = _lines(str(tmp_path / "run"), 0)
    assert rec.steps == [2, 3] and rec.complete


def test_engine_dies_mid_window(tmp_path, caplog):
    srv = StandinServer("sglang", ranks=2)
    cfg = _config(tmp_path, [1, 2], {"kind": "sglang", "url": srv.url, "flush_timeout_s": 30})
    prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
    calls = []

    def work():
        calls.append(1)
        if len(calls) == 2:  # step 1: the engine dies in the window's middle
            assert prof._engine.wait_started(30) is True  # (its start was sent ahead, in step 0)
            srv.kill()
        elif len(calls) < 2:
            _generate(srv.url)

    with caplog.at_level(logging.WARNING, logger="distprof"):
        assert _train(prof, 4, work) == 4
    (rec,) = _lines(str(tmp_path / "run"), 0)
    assert rec.steps == [1, 2] and not rec.complete and rec.stopped_by == "engine_error"
    assert "stop_profile" in rec.engine["error"]
    assert any("not captured" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("hostile", ["garbage", "500", "escape"])
def test_hostile_engine_replies(tmp_path, hostile, caplog):
    with StandinServer("sglang", ranks=2, hostile=hostile, trace_dir=str(tmp_path / "eng")) as srv:
        cfg = _config(tmp_path, [1], {"kind": "sglang", "url": srv.url, "trace_dir": str(tmp_path / "eng")})
        prof = distprof.Profiler(cfg, role="rollout", rank=0, world_size=1)
        with caplog.at_level(logging.WARNING, logger="distprof"):
            assert _train(prof, 3, lambda: _generate(srv.url)) == 3
    run = str(tmp_path / "run")
    recs = _lines(run, 0)
    if hostile == "garbage":  # only the status is believed: the traces are taken
        assert recs[0].complete and len(_lines(run, 1)) == 1 and check_run(run).ok
        return
    (rec,) = recs
    assert not rec.complete and rec.files == [] and rec.stopped_by == "engine_error"
    if hostile == "500":
        assert "answered 500" in rec.engine["error"]
    else:  # links to files outside the folder the engine was given are never followed
        assert any("not a regular file" in r.getMessage() for r in caplog.records)
        assert not os.path.exists(os.path.join(run, "rollout", "engine", "rank00001"))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["vllm", "sglang"]),
       st.text(max_size=80) | st.builds(lambda a, b: f"{a}-TP-{b}.trace.json.gz", st.text(max_size=20), st.text(max_size=8))
       | st.builds(lambda a, b: f"{a}-rank-{b}.1.pt.trace.json.gz", st.text(max_size=20), st.text(max_size=8)))
def test_any_file_name_gives_ranks_or_none(kind, name):
    """An engine's output folder is untrusted: any name gives small non-negative ranks or None, never an error."""
    assert parse_ranks("sglang", "1.5-TP-\u0663.trace.json.gz") is None  # an Arabic-Indic 3 is no rank
    got = parse_ranks(kind, name)
    assert got is None or all((k == "stage" and isinstance(v, str)) or (type(v) is int and 0 <= v < 2**31)
                              for k, v in got.items())
