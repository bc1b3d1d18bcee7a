"""On-demand capture against a hostile or broken requests folder (issue 19, items 10-13): junk files, starts far in
the future, a folder the job may read but not write, and `distprof trigger` against a folder or store that fails.
Real files in tmp_path, real Profilers on torch.profiler (CPU), the CLI's real typer app, a real HTTP server."""

import contextlib
import ctypes
import http.server
import logging
import os
import re
import secrets
import threading
from functools import partial

import msgspec
from conftest import config
from helpers import Trainer, run
from tracekit import cli

import distprof
from distprof import Profiler
from distprof.capture.trigger import MAX_AHEAD, READS_PER_POLL, RequestStore, make_request
from distprof.rundir.store import manifest_records

cfg = partial(config, run=None, typed=False, enable=None, trigger=True, trigger_poll_s=0, ranks="all")


def trigger_warnings(caplog):
    return [r for r in caplog.records if r.name == "distprof.capture.trigger" and r.levelno >= logging.WARNING]


def junk(run_dir, n):
    """``n`` files named as requests are (16 hex digits), holding junk: what anyone who can write the folder can do."""
    folder = run_dir / ".requests"
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(n):
        (folder / f"{secrets.token_hex(8)}.json").write_bytes(b"junk")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def file_permissions_apply():
    """The tests run as root, which chmod does not stop. Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from this
    thread's effective capabilities (capset(2); they stay permitted and come back after), so the kernel applies
    the folder's mode bits to this thread as to any user's: the permission errors below are real EACCES."""
    libc = ctypes.CDLL(None, use_errno=True)
    hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3; pid 0: this thread
    assert libc.capget(ctypes.byref(hdr), data) == 0, os.strerror(ctypes.get_errno())
    saved = data[0].effective
    data[0].effective &= ~((1 << 1) | (1 << 2))
    assert libc.capset(ctypes.byref(hdr), data) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        data[0].effective = saved
        assert libc.capset(ctypes.byref(hdr), data) == 0, os.strerror(ctypes.get_errno())


# ---- item 10: 50,000 junk files stalled steps and logged one warning each ------------------------------------------
def test_junk_requests_are_read_a_bounded_number_per_poll_with_one_warning_each(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="distprof")
    junk(tmp_path, 1000)
    RequestStore(str(tmp_path)).put(real := make_request(steps=1, align=1, lead_steps=1))  # among the junk
    p = Profiler(cfg(tmp_path), role="train")  # trigger_poll_s 0: every step polls, on the training thread
    per_poll = []

    def count(prof):
        per_poll.append(trigger_warnings(caplog))
        caplog.clear()

    p.start()
    count(p)  # the first poll, at start()
    run(p, 30, on_step=count)
    assert all(len(w) <= 1 for w in per_poll), [len(w) for w in per_poll]  # one warning per poll, not one per file
    said = [int(re.search(r"ignored (\d+) file", w[0].getMessage()).group(1)) for w in per_poll if w]
    assert max(said) <= READS_PER_POLL and sum(said) == 1000  # each junk file read once, a bounded number per poll
    (rec,) = manifest_records(str(tmp_path))  # the real request was found among the junk, and served
    assert rec.trigger == real.id and rec.files


def test_junk_requests_are_read_on_the_poll_thread_not_in_steps(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="distprof")
    junk(tmp_path, 1000)
    RequestStore(str(tmp_path)).put(real := make_request(steps=1, align=1, lead_steps=1))
    p = Profiler(cfg(tmp_path, trigger_poll_s=3600), role="train").start()
    assert len(trigger_warnings(caplog)) == 1  # the first poll, at start(): at most READS_PER_POLL files
    caplog.clear()
    p._poll_timer.fire()  # what the poll thread does every trigger_poll_s: it reads the folder, then flags a poll
    assert len(trigger_warnings(caplog)) == 1
    caplog.clear()
    trainer = Trainer()
    for _ in range(5):
        trainer.train_step()
        p.step()
    p.stop()
    assert trigger_warnings(caplog) == []  # the steps read no request file
    (rec,) = manifest_records(str(tmp_path))
    assert rec.trigger == real.id and rec.files


# ---- item 11: a start far ahead kept the process busy for the rest of the job --------------------------------------
def test_status_over_junk_requests_warns_once_and_lists_the_real_one(tmp_path, caplog):
    d = run_dir(tmp_path)
    junk(d, 300)
    RequestStore(str(d)).put(real := make_request(steps=1, align=1, lead_steps=1))
    caplog.set_level(logging.WARNING)
    st = distprof.trigger_status(str(d))
    assert [r["id"] for r in st["requests"]] == [real.id]
    (said,) = trigger_warnings(caplog)  # one line for the 300 junk files, not one each
    assert "ignored 300 file(s)" in said.getMessage()
    code, _, err = cli("trigger", d, "--status")
    assert code == 0 and " ".join(err.split()).count("not trigger requests") == 1  # (the line may wrap)


def test_starts_beyond_the_lead_bound_are_refused_and_later_requests_still_capture(tmp_path):
    store = RequestStore(str(tmp_path))
    store.put(far := make_request(steps=1, start_step=2**62))  # accepted by make_request: it cannot know the step
    store.put(forged := make_request(steps=1, tag="forged"))
    (tmp_path / ".requests" / f"{forged.id}.start").write_bytes(msgspec.json.encode({"start": 10**18}))
    p = Profiler(cfg(tmp_path), role="train")
    sent = []
    run(p, 12, on_step=lambda prof: prof.global_step == 3 and sent.append(
        distprof.trigger(str(tmp_path), steps=2, align=1, lead_steps=1)))
    acks = {r["id"]: r["acks"] for r in distprof.trigger_status(str(tmp_path))["requests"]}
    for rid, start in ((far.id, 2**62), (forged.id, 10**18)):
        (ack,) = acks[rid]
        assert ack["state"] == "refused" and ack["seen_step"] == 0
        assert ack["detail"].startswith(f"its start step {start} is more than {MAX_AHEAD} steps after step 0")
    (ack,) = acks[sent[0]]
    assert (ack["state"], ack["steps"]) == ("captured", [5, 6])  # seen at step 4, one step of lead
    (rec,) = manifest_records(str(tmp_path))
    assert (rec.trigger, rec.steps) == (sent[0], [5, 6]) and rec.files


# ---- item 12: a request whose claim cannot be written turned all profiling off --------------------------------------
def test_a_request_it_cannot_claim_is_skipped_and_the_planned_window_is_captured(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="distprof")
    RequestStore(str(tmp_path)).put(req := make_request(steps=1))  # written by someone else...
    (tmp_path / ".requests").chmod(0o555)  # ...who left the folder readable, not writable, by this job
    p = Profiler(cfg(tmp_path, enable=True, steps=[3, 4]), role="train")
    with file_permissions_apply():  # this thread: the job's, with the permissions of a user who is not root
        trainer = run(p, 12)
    (tmp_path / ".requests").chmod(0o755)
    assert trainer.steps_run == 12 and p.enabled
    skipped = [r.getMessage() for r in caplog.records if "skips request" in r.getMessage()]
    assert len(skipped) == 1 and req.id in skipped[0] and "Permission denied" in skipped[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no fault: profiling stayed on
    (rec,) = manifest_records(str(tmp_path))
    assert (rec.trigger, rec.steps, rec.complete) == (None, [3, 4], True) and rec.files  # the planned window
    assert os.listdir(tmp_path / ".requests") == [f"{req.id}.json"]  # nothing claimed, nothing acknowledged


# ---- item 13: `distprof trigger` exited 3 "internal error", or wrote a request no job could read ---------------------
def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def run_dir(tmp_path):
    (tmp_path / "run.json").write_text('{"config": {"trigger": true}}')
    return tmp_path


def test_trigger_cli_a_requests_folder_that_is_a_file_exits_2(tmp_path):
    d = run_dir(tmp_path)
    (d / ".requests").write_text("not a folder")
    for args in (("--steps", "2"), ("--status",)):
        code, _, err = cli("trigger", d, *args)
        assert code == 2 and one_line(err) == f"error: {d}/.requests is not a folder; no job can read requests there: remove it"
    assert (d / ".requests").read_text() == "not a folder"


def test_trigger_cli_permission_errors_exit_2_naming_the_folder(tmp_path):
    d = run_dir(tmp_path)
    (d / ".requests").mkdir(mode=0o555)
    with file_permissions_apply():
        code, _, err = cli("trigger", d, "--steps", "2")
        assert code == 2
        line = one_line(err)
        assert line.startswith("error: cannot write trigger request ") and f" in {d}/.requests: Permission denied" in line
        (d / ".requests").chmod(0o000)
        code, out, err = cli("trigger", d, "--status", "--json")
    (d / ".requests").chmod(0o755)
    assert code == 2 and one_line(err) == f"error: cannot read the trigger requests in {d}/.requests: Permission denied"
    assert out["requests"] == [] and out["errors"][0]["message"].startswith("cannot read the trigger requests")
    assert os.listdir(d / ".requests") == []


def test_trigger_cli_refuses_a_request_no_job_could_read_before_writing_it(tmp_path):
    d = run_dir(tmp_path)
    roles = ",".join(f"role{i}" for i in range(10_000))
    code, _, err = cli("trigger", d, "--steps", "2", "--roles", roles)
    assert code == 2
    assert re.fullmatch(r"error: trigger request is \d+ bytes, over the 65536 a job reads \(0 ranks, 10000 roles\); "
                        r"give fewer ranks or roles, or globs such as rollout\*", one_line(err))
    assert not (d / ".requests").exists()


class _Always500(http.server.BaseHTTPRequestHandler):
    def _fail(self):
        body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                b"<Message>We encountered an internal error. Please try again.</Message></Error>")
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _fail

    def log_message(self, *args):
        pass


def test_trigger_cli_an_s3_store_answering_500_exits_2_naming_the_url(monkeypatch):
    # moto cannot be told to fail, so a real HTTP server on loopback that answers every S3 call with 500 InternalError.
    import fsspec

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Always500)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": endpoint, "FSSPEC_S3_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    try:
        for args in (("--steps", "2"), ("--status",)):
            code, _, err = cli("trigger", "s3://bucket/run", *args)
            assert code == 2 and one_line(err) == ("error: cannot read s3://bucket/run/run.json: We encountered an "
                                                  "internal error. Please try again.")
    finally:
        server.shutdown()
