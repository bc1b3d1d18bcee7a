"""Uploads to an object store that stops answering: a real S3 server (moto) on loopback, killed in the middle of
a run and started again on the same port. Training steps never wait for it; no window is lost."""

import gzip
import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import Trainer
from s3server import _die_with_parent, _free_port

from distprof import Profiler, ProfilerConfig
from distprof.rundir import upload
from distprof.rundir.manifest import read_manifest

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class Moto:
    """``moto_server -H 127.0.0.1 -p PORT`` as a child process, which can be killed and started again on its port."""

    def __init__(self):
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=_die_with_parent)
        for line in self.proc.stderr:  # werkzeug announces the bound address once it accepts connections
            if "Running on" in line:
                break
        else:
            raise RuntimeError("moto server did not start")
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=subprocess.DEVNULL,
                                       preexec_fn=_die_with_parent)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._drain.wait(timeout=30)


@pytest.fixture
def moto(monkeypatch, tmp_path):
    import fsspec

    server = Moto()
    for k, v in {**ENV, "AWS_ENDPOINT_URL": server.endpoint}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where windows that could not be sent are kept
    conf = fsspec.config.conf.setdefault("s3", {})
    saved = dict(conf)
    # A dead endpoint answers "connection refused" at once; keep botocore's own retries short so our retry loop
    # is what is exercised.
    conf.update(endpoint_url=server.endpoint, skip_instance_cache=True,
                config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10})
    yield server
    if (u := upload.active()) is not None:
        u.drain(5)  # a test that failed half-way: settle its uploads while this test's folders are in place
    conf.clear()
    conf.update(saved)
    if server.proc.poll() is None:
        server.kill()


def _fs():
    import fsspec

    return fsspec.filesystem("s3")


def _steps_of(opener):
    with opener() as f:
        events = json.load(f)["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#")})


@pytest.mark.slow
def test_object_store_down_mid_run_loses_nothing_and_never_blocks_a_step(moto, tmp_path):
    fs = _fs()
    fs.mkdir("bkt")
    url = "s3://bkt/run"
    prof = Profiler(ProfilerConfig(enable=True, save_path=url, steps=[1, 4, 7], torch={"activities": ["cpu"]}),
                    rank=0, world_size=1)
    trainer = Trainer()
    prof.start()

    def steps(n):
        for _ in range(n):
            trainer.train_step()
            prof.step()

    steps(3)  # window 1 closes at the end of step 1 and is uploaded in the background
    assert upload.uploader().drain(60)
    first = fs.ls("bkt/run/main/rank00000", detail=False)
    assert "bkt/run/main/rank00000/step00000001-00000001.pt.trace.json.gz" in first

    moto.kill()
    done_while_down = 0
    for _ in range(3):  # window 4 closes at the end of step 4, with nothing to upload it to
        trainer.train_step()
        prof.step()
        done_while_down += 1
    # Every step returned while window 4's upload was still waiting for the dead server.
    assert done_while_down == 3 and prof.windows_closed == 2 and upload.uploader().pending() == 1
    assert prof.enabled

    moto.start()  # a new, empty server on the same port
    fs = _fs()
    fs.makedirs("bkt", exist_ok=True)  # the uploader's retry may have made the bucket already
    steps(3)  # window 7
    assert upload.uploader().drain(90)  # both windows leave the queue: uploaded, or window 4 kept locally
    prof.stop()
    assert upload.uploader().pending() == 0

    uploaded = read_manifest(fs.cat_file("bkt/run/main/rank00000/manifest.jsonl")).records
    kept_dirs = [d for d, _, names in os.walk(tmp_path / "cache") if "manifest.jsonl" in names]
    kept = [r for d in kept_dirs for r in read_manifest(open(os.path.join(d, "manifest.jsonl"), "rb").read()).records]
    by_window = {r.steps[0]: r for r in uploaded + kept}
    assert by_window[7].local_path is None and by_window[7].upload_error is None
    assert _steps_of(lambda: gzip.open(fs.open("bkt/run/" + by_window[7].files[0].path))) == [7]
    w4 = by_window[4]  # uploaded once the server was back, or kept on this host: never lost
    if w4.local_path is None:
        assert _steps_of(lambda: gzip.open(fs.open("bkt/run/" + w4.files[0].path))) == [4]
    else:
        assert w4.upload_error
        assert _steps_of(lambda: gzip.open(os.path.join(w4.local_path, os.path.basename(w4.files[0].path)))) == [4]


@pytest.mark.slow
def test_upload_that_finally_fails_is_kept_locally_and_says_where(moto, tmp_path, monkeypatch):
    """The server never comes back: after the retry budget the window's files move to the unsent folder, intact,
    with a manifest line there naming local_path and upload_error."""
    monkeypatch.setattr(upload, "RETRY_BUDGET_S", 1.0)
    fs = _fs()
    fs.mkdir("bkt2")
    prof = Profiler(ProfilerConfig(enable=True, save_path="s3://bkt2/run", steps=[2], torch={"activities": ["cpu"]}),
                    rank=0, world_size=1)
    trainer = Trainer()
    prof.start()
    trainer.train_step()
    prof.step()
    moto.kill()
    for _ in range(3):
        trainer.train_step()
        prof.step()
    prof.stop()
    assert upload.uploader().pending() == 0
    [d] = [d for d, _, names in os.walk(tmp_path / "cache") if "manifest.jsonl" in names]
    [rec] = read_manifest(open(os.path.join(d, "manifest.jsonl"), "rb").read()).records
    assert rec.steps == [2, 2] and rec.complete and rec.local_path == d and rec.upload_error
    assert rec.files[0].path == "main/rank00000/step00000002-00000002.pt.trace.json.gz"
    kept = os.path.join(d, "step00000002-00000002.pt.trace.json.gz")
    assert os.path.getsize(kept) == rec.files[0].bytes
    assert _steps_of(lambda: gzip.open(kept)) == [2]
    assert d.endswith(os.path.join("main", "rank00000")) and "bkt2" in d


def test_stop_keeps_what_the_dead_store_did_not_take_within_its_wait(moto, tmp_path, monkeypatch):
    """stop() waits a bounded time: the windows still queued then are kept locally (the training process may be
    about to be killed), each with its manifest line beside the files."""
    monkeypatch.setattr(upload, "DRAIN_TIMEOUT_S", 0.5)
    fs = _fs()
    fs.mkdir("bkt3")
    prof = Profiler(ProfilerConfig(enable=True, save_path="s3://bkt3/run", steps=[1, 3, 5],
                                   torch={"activities": ["cpu"]}), rank=0, world_size=1)
    trainer = Trainer()
    prof.start()
    assert upload.uploader().drain(60)  # run.json and role.json: written by the upload thread, not by start()
    moto.kill()
    for _ in range(7):  # three windows close while the store is down
        trainer.train_step()
        prof.step()
    assert prof.windows_closed == 3  # waits for the windows written in the background: each handed to the upload
    assert upload.uploader().pending() == 3
    prof.stop()
    assert upload.uploader().drain(60) and upload.uploader().pending() == 0
    [d] = [d for d, _, names in os.walk(tmp_path / "cache") if "manifest.jsonl" in names]
    records = read_manifest(open(os.path.join(d, "manifest.jsonl"), "rb").read()).records
    assert sorted(r.steps[0] for r in records) == [1, 3, 5]
    assert all(r.local_path == d and r.upload_error for r in records)
    for r in records:
        assert _steps_of(lambda: gzip.open(os.path.join(d, os.path.basename(r.files[0].path)))) == [r.steps[0]]


@pytest.mark.slow
def test_window_in_flight_when_stop_gives_up_is_kept_locally_with_its_line(moto, tmp_path, monkeypatch, caplog):
    """The store accepts connections and never answers (the moto server stopped with SIGSTOP: the kernel still
    accepts on its port): window 2's put hangs in flight. stop() waits its bounded time, then keeps that window
    itself: its file moves to the unsent folder with its manifest line (local_path, upload_error) beside it, the
    log says where, and nothing is left hidden in the staging folder."""
    import logging

    import fsspec

    caplog.set_level(logging.INFO, logger="distprof")
    monkeypatch.setattr(upload, "DRAIN_TIMEOUT_S", 0.5)
    # A hung request is not cut short by a read timeout during the test (botocore would give up after 120 s).
    fsspec.config.conf["s3"]["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 120,
                                                 "read_timeout": 120}
    fs = _fs()
    fs.mkdir("bkt4")
    prof = Profiler(ProfilerConfig(enable=True, save_path="s3://bkt4/run", steps=[2], torch={"activities": ["cpu"]}),
                    rank=0, world_size=1)
    trainer = Trainer()
    prof.start()
    assert upload.uploader().drain(60)  # run.json and role.json (the upload thread's) written while the store answers
    staging = prof._run.local_dir("")
    moto.proc.send_signal(signal.SIGSTOP)
    try:
        u = upload.uploader()
        for _ in range(4):  # window 2 closes at the end of step 2 and goes to the upload thread
            trainer.train_step()
            prof.step()
        assert prof.windows_closed == 1  # waits for the window's writing (background): its upload is handed over
        with u._q.not_full:  # the thread has taken it off the queue: its upload is in flight, not queued
            assert u._q.not_full.wait_for(lambda: u._q._qsize() == 0, timeout=60)
        assert u.pending() == 1
        prof.stop()  # gives up after 0.5 s, with the put still hanging
        assert u.pending() == 0
        kept = [d for d, _, names in os.walk(tmp_path / "cache") if "manifest.jsonl" in names]
        assert len(kept) == 1, f"no manifest line in the unsent folder; staging holds {list(os.walk(staging))}"
        d = kept[0]
        [rec] = read_manifest(open(os.path.join(d, "manifest.jsonl"), "rb").read()).records
        assert rec.steps == [2, 2] and rec.local_path == d and "within 0.5 s of stop()" in rec.upload_error
        assert rec.files[0].path == "main/rank00000/step00000002-00000002.pt.trace.json.gz"
        path = os.path.join(d, "step00000002-00000002.pt.trace.json.gz")
        assert os.path.getsize(path) == rec.files[0].bytes and _steps_of(lambda: gzip.open(path)) == [2]
        assert not os.path.exists(staging) or not [n for _, _, ns in os.walk(staging) for n in ns]
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "window 2-2" in r.getMessage()]
        assert len(said) == 1 and d in said[0] and os.path.join(d, "manifest.jsonl") in said[0]
    finally:
        moto.proc.send_signal(signal.SIGCONT)  # the hung put now ends; the thread's late result is ignored
