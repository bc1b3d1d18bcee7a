"""distprof open's server (report/viewer.py) against what the red-team pass sent it: a Range of thousands of
digits, a client that hangs up mid-body, a --timeout past what the platform can wait."""

import os
import threading

from test_viewer import ask

from distprof.report.viewer import TraceServer


def test_a_range_of_thousands_of_digits_is_answered_not_a_handler_traceback(tmp_path, capfd):
    p = tmp_path / "t.json"
    p.write_bytes(os.urandom(1000))
    s = TraceServer(str(p), port=0, timeout_s=60).start()
    try:
        r, body = ask(s, headers={"Range": "bytes=10-" + "9" * 5000})
        assert r.status == 206 and body == p.read_bytes()[10:]
        r, _ = ask(s, headers={"Range": "bytes=" + "9" * 5000 + "-"})
        assert r.status == 416
        r, body = ask(s, headers={"Range": "bytes=-" + "9" * 5000})
        assert r.status == 206 and body == p.read_bytes()
    finally:
        s.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_a_client_that_hangs_up_is_logged_not_printed(tmp_path, capfd):
    p = tmp_path / "t.json"
    p.write_bytes(b"{}")
    s = TraceServer(str(p), port=0, timeout_s=60).start()
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            s._httpd.handle_error(None, ("127.0.0.1", 1))  # what socketserver calls for a handler's exception
    finally:
        s.stop()
    assert capfd.readouterr().err == ""


def test_a_timeout_past_what_the_platform_waits_is_as_long_as_it_can(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(b"{}")
    for t in (float("inf"), 1e300):
        s = TraceServer(str(p), port=0, timeout_s=t).start()
        assert s.timeout_s == threading.TIMEOUT_MAX  # Event.wait(inf) raises OverflowError: an internal error
        s.stop("interrupted")
        assert s.wait() == "interrupted"
