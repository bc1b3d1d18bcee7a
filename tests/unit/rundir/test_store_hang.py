"""An object store that accepts connections and never answers (issue 19, item 9): a real TCP server on loopback,
given as the S3 endpoint. Profiler.start() returns and the job's steps run (run.json is written by the upload
thread, every store call is bounded: rundir/netfs.py); the CLI's `summary` and `check` end in one line naming the
URL, exit 2. Each scenario runs in a child process under a generous wait: before the fix each hung for minutes
(start() 417 s in write_run_json, summary over 900 s), so the wait expiring is the failure, never a duration
asserted."""

import json
import logging
import os
import socket
import subprocess
import sys
import threading

import pytest
import warmfork

HANG_S = 120  # seconds: several times what the bounded code needs here; the old code waited 417 s and more
TIMEOUT = "0.5"  # DISTPROF_STORE_TIMEOUT_S for these tests: each request fails after 2 x 0.5 s
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class BlackHole:
    """A TCP server on 127.0.0.1 that accepts every connection and never reads or answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # stop() shut the listening socket
                return
            self.conns.append(conn)

    def stop(self):
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.sock.close()
        self._thread.join()
        for c in self.conns:
            c.close()


@pytest.fixture
def black_hole():
    server = BlackHole()
    yield server
    server.stop()


def _env(endpoint, **extra):
    return {**os.environ, **AWS, "AWS_ENDPOINT_URL": endpoint, "FSSPEC_S3_ENDPOINT_URL": endpoint,
            "DISTPROF_STORE_TIMEOUT_S": TIMEOUT, **extra}


def _train(endpoint, save, cache, out):
    """The job (a child process): start, 5 steps with a window at step 2, stop; what happened goes to ``out``."""
    os.environ.update({**AWS, "AWS_ENDPOINT_URL": endpoint, "DISTPROF_STORE_TIMEOUT_S": TIMEOUT,
                       "XDG_CACHE_HOME": cache})
    import fsspec

    fsspec.config.conf["s3"] = {"endpoint_url": endpoint}
    from helpers import Trainer

    from distprof import Profiler, ProfilerConfig
    from distprof.rundir import upload
    from distprof.rundir.manifest import read_manifest

    upload.RETRY_BUDGET_S = 1.0  # give up on the store soon (a real job: 60 s) ...
    upload.DRAIN_TIMEOUT_S = 200.0  # ... and let stop() wait for every give-up, so the outcome is one, not a race
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.levelname, record.getMessage()))

    logging.getLogger("distprof").addHandler(Keep(logging.WARNING))
    prof = Profiler(ProfilerConfig(enable=True, save_path=save, steps=[2], torch={"activities": ["cpu"]}),
                    rank=0, world_size=1)
    trainer = Trainer()
    prof.start()
    steps_run = 0
    for _ in range(5):
        trainer.train_step()
        prof.step()
        steps_run += 1
    prof.stop()
    kept = [os.path.join(d, "manifest.jsonl") for d, _, names in os.walk(cache) if "manifest.jsonl" in names]
    records = [r for k in kept for r in read_manifest(open(k, "rb").read()).records]
    with open(out, "w") as f:
        json.dump({"steps_run": steps_run, "windows_closed": prof.windows_closed, "logged": seen,
                   "kept": [{"steps": r.steps, "upload_error": r.upload_error, "local_path": r.local_path,
                             "file": r.files[0].path} for r in records]}, f)


@pytest.mark.slow
def test_profiler_start_and_steps_never_wait_for_a_store_that_never_answers(black_hole, tmp_path):
    ctx = warmfork.context()
    out = tmp_path / "out.json"
    save = "s3://bucket/run"
    p = ctx.Process(target=_train, args=(black_hole.endpoint, save, str(tmp_path / "cache"), str(out)))
    p.start()
    p.join(HANG_S)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail(f"the job was still running after {HANG_S} s against an object store that never answers")
    assert p.exitcode == 0
    got = json.loads(out.read_text())
    assert got["steps_run"] == 5 and got["windows_closed"] == 1  # start() returned, every step ran, window captured
    # The captured window is not lost: kept on this host with its manifest line saying why.
    [kept] = got["kept"]
    assert kept["steps"] == [2, 2] and kept["file"] == "main/rank00000/step00000002-00000002.pt.trace.json.gz"
    assert f"did not answer within {TIMEOUT} s" in kept["upload_error"]
    assert os.path.isfile(os.path.join(kept["local_path"], "step00000002-00000002.pt.trace.json.gz"))
    # One warning for the run's own files (run.json; role.json's failure is logged at info), naming the URL.
    warnings = [m for level, m in got["logged"] if level == "WARNING"]
    assert len(warnings) == 1, warnings
    assert f"could not write {save}/run.json (the object store did not answer within {TIMEOUT} s" in warnings[0]
    errors = [m for level, m in got["logged"] if level == "ERROR"]
    assert len(errors) == 1 and "could not upload window 2-2" in errors[0], errors  # the window, kept locally


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["summary", "check"])
@pytest.mark.parametrize("as_json", [False, True])
def test_cli_against_a_store_that_never_answers_ends_in_one_line(black_hole, verb, as_json):
    url = "s3://bucket/run"
    try:
        r = subprocess.run([sys.executable, "-m", "distprof.cli", verb, url] + (["--json"] if as_json else []),
                           env=_env(black_hole.endpoint), capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`distprof {verb} {url}` still waiting after {HANG_S} s")
    assert r.returncode == 2, r.stderr
    said = {"summary": "cannot be listed", "check": "cannot be read"}[verb]
    line = (f"{url}: {said} (the object store did not answer within {TIMEOUT} s, tried 2 times; set "
            "DISTPROF_STORE_TIMEOUT_S to wait longer)")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    if as_json:  # one object on stdout (check --json says it there only; summary on stderr too)
        doc = json.loads(r.stdout)
        assert doc["errors"] == [{"path": url, "message": line}]
        assert lines == ([] if verb == "check" else [f"error: {line}"])
    else:
        assert lines == [f"error: {line}"] and r.stdout == ""
    assert black_hole.conns  # it did reach the endpoint (and gave up on it)


def test_store_timeout_setting_is_read_checked_and_yields_to_fsspec_config(monkeypatch, caplog):
    """DISTPROF_STORE_TIMEOUT_S sets the wait (a bad value: one warning, the default); it is not a config field (the
    config's environment reading does not refuse it); a key the user set in fsspec's config wins."""
    import fsspec

    from distprof.config.model import env_overrides
    from distprof.rundir import netfs

    monkeypatch.setenv("DISTPROF_STORE_TIMEOUT_S", "2.5")
    assert netfs.timeout_s() == 2.5
    assert env_overrides({}, {"DISTPROF_STORE_TIMEOUT_S": "2.5"}) == {}
    fs, root = netfs.url_to_fs("s3://bucket/run")
    assert root == "bucket/run" and fs.retries == 1
    assert fs.config_kwargs == {"connect_timeout": 2.5, "read_timeout": 2.5, "retries": {"total_max_attempts": 2}}
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"read_timeout": 300}})
    fs, _ = netfs.url_to_fs("s3://bucket/run")
    assert fs.config_kwargs["read_timeout"] == 300 and fs.config_kwargs["connect_timeout"] == 2.5
    for bad in ("soon", "-1", "0", "1e9", "nan"):
        monkeypatch.setenv("DISTPROF_STORE_TIMEOUT_S", bad)
        caplog.clear()
        assert netfs.timeout_s() == netfs.DEFAULT_TIMEOUT_S and netfs.timeout_s() == netfs.DEFAULT_TIMEOUT_S
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(said) == 1 and "DISTPROF_STORE_TIMEOUT_S" in said[0], (bad, said)
