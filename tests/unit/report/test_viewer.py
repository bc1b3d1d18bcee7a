"""distprof open's server (report/viewer.py) over real loopback HTTP: the one file, CORS for the UI, byte ranges,
nothing else served, and it stops by itself once the file has been sent (or at its timeout). The same server in
headless Chromium from a page of another origin: tests/e2e/test_open_browser.py."""

import http.client
import os
import socket

import pytest
from tracekit import cli

from distprof.report.viewer import UI_ORIGIN, TraceServer, open_command, ui_link


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "rank 0.json.gz"
    p.write_bytes(os.urandom(3000) + b"end")
    return p


def ask(server, method="GET", path=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request(method, path or server.url.split(str(server.port), 1)[1], headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r, body


def test_whole_file_with_cors_then_the_server_stops_by_itself(trace):
    s = TraceServer(str(trace), port=0, timeout_s=60).start()
    r, body = ask(s)
    assert r.status == 200 and body == trace.read_bytes()
    assert r.getheader("Access-Control-Allow-Origin") == UI_ORIGIN
    assert r.getheader("Content-Length") == str(len(body)) and r.getheader("Accept-Ranges") == "bytes"
    assert r.getheader("Content-Type") == "application/gzip" and r.getheader("Content-Encoding") is None
    assert s.wait() == "fetched"
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", s.port), timeout=5).close()


def test_ranges_preflight_and_refusals(trace):
    data = trace.read_bytes()
    s = TraceServer(str(trace), port=0, timeout_s=60).start()
    try:
        r, body = ask(s, headers={"Range": "bytes=10-19"})
        assert r.status == 206 and body == data[10:20] and r.getheader("Content-Range") == f"bytes 10-19/{len(data)}"
        r, body = ask(s, headers={"Range": "bytes=-3"})
        assert r.status == 206 and body == b"end"
        r, body = ask(s, headers={"Range": f"bytes={len(data)}-"})
        assert r.status == 416 and r.getheader("Content-Range") == f"bytes */{len(data)}"
        r, body = ask(s, "HEAD")
        assert r.status == 200 and body == b"" and r.getheader("Content-Length") == str(len(data))
        r, _ = ask(s, "OPTIONS", headers={"Origin": UI_ORIGIN, "Access-Control-Request-Method": "GET",
                                          "Access-Control-Request-Headers": "range",
                                          "Access-Control-Request-Private-Network": "true"})
        assert r.status == 204 and "Range" in r.getheader("Access-Control-Allow-Headers")
        assert r.getheader("Access-Control-Allow-Private-Network") == "true"
        for path in ("/", "/../etc/passwd", "/%2e%2e/rank%200.json.gz", "/status", "/rank%200.json.gz/x",
                     "/rank+0.json.gz"):
            assert ask(s, path=path)[0].status == 404, path  # only the one file, and no path reaches the disk
        assert ask(s, "POST")[0].status == 405
        assert ask(s, headers={"Host": f"evil.example:{s.port}"})[0].status == 403  # DNS rebinding
        assert not s._done.is_set()  # parts and refusals do not end it
        r, body = ask(s, headers={"Range": "bytes=0-"})  # ranges that together cover the file end it
        assert body == data
        assert s.wait() == "fetched"
    finally:
        s.stop()


def test_timeout_and_stop(trace):
    s = TraceServer(str(trace), port=0, timeout_s=0.2).start()
    assert s.wait() == "timeout"
    s = TraceServer(str(trace), port=0, timeout_s=60).start()
    s.stop("interrupted")
    assert s.wait() == "interrupted"


def test_refuses_what_is_not_one_file(tmp_path, trace):
    with pytest.raises(ValueError, match="not a regular file"):
        TraceServer(str(tmp_path))
    with pytest.raises(ValueError, match="cannot open"):
        TraceServer(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="--origin"):
        TraceServer(str(trace), origin="javascript:alert(1)")


def test_cli_bad_path_and_taken_port_are_one_line(tmp_path, trace):
    code, _, err = cli("open", tmp_path, "--no-browser")
    assert code == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        code, _, err = cli("open", trace, "--no-browser", "--port", taken.getsockname()[1])
    assert code == 2 and "--port" in err and "Traceback" not in err


def test_link_and_command():
    assert ui_link("http://127.0.0.1:9001/a b.json") == \
        "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/a%20b.json&referrer=distprof"
    assert open_command(__file__) == f"distprof open {__file__}"
    cmd = open_command("/runs/exp 1", ranks=[3, 1], steps=[[4, 5], 7], role="actor")
    assert cmd == ("distprof merge '/runs/exp 1' --roles actor --ranks 1,3 --steps 4,5,7 --format perfetto "
                   "-o finding.tar && distprof open finding.tar")


def test_report_findings_carry_the_command_that_opens_their_ranks_and_steps(tmp_path):
    """A finding over several ranks names the archive-and-open command for them; one over a single file names
    ``distprof open FILE``; the page shows it as text (escaped)."""
    from tracekit import DLRM

    from distprof.analysis.analyze import investigate
    from distprof.analysis.diagnose import Finding
    from distprof.analysis.records_diag import FindingEvidence
    from distprof.report import render_report
    from distprof.report.evidence import for_findings

    inv = investigate(DLRM, workers=1)
    many = Finding(id="straggler", claim="rank 3 arrives last", cost_us=2.0, fix="none",
                   evidence=FindingEvidence(ranks=[3, 1], steps=[]))
    one = Finding(id="idle", claim="rank 5 idles", cost_us=1.0, fix="none", evidence=FindingEvidence(ranks=[5]))
    ev = for_findings(inv, [many, one])
    assert ev[0].open_command == (f"distprof merge {DLRM} --ranks 1,3 --format perfetto -o straggler.tar && "
                                  "distprof open straggler.tar")
    assert ev[1].open_command == f"distprof open {ev[1].files[0].path}" and ev[1].files[0].rank == 5
    page = render_report(inv, [many, one])
    assert "distprof open straggler.tar" in page.replace("&amp;", "&")
