"""distprof open's server in a real headless Chromium, fetched by a page of another origin (another loopback port,
as ui.perfetto.dev is to 127.0.0.1:9001; no internet): CORS lets the page read it, a Range request gets 206 with the
right bytes, the whole file comes through, a server allowing another origin is unreadable to the page, and the
server stops by itself once the file has been fetched."""

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_report import browser  # noqa: F401  (the module's Chromium)

from distprof.report.viewer import TraceServer

pytestmark = pytest.mark.xdist_group("browser")

PAGE = b"<!DOCTYPE html><html><head><meta charset='utf-8'><title>ui stand-in</title></head><body>ui</body></html>"

FETCH = """async (url) => {
  const hex = (b) => Array.from(new Uint8Array(b)).map(x => x.toString(16).padStart(2, '0')).join('');
  const part = await fetch(url, {headers: {Range: 'bytes=100-163'}});
  const partBody = hex(await part.arrayBuffer());
  const whole = await fetch(url);
  return {partStatus: part.status, contentRange: part.headers.get('Content-Range'), part: partBody,
          status: whole.status, length: whole.headers.get('Content-Length'), body: hex(await whole.arrayBuffer())};
}"""

BLOCKED = """async (url) => {
  try { await (await fetch(url)).arrayBuffer(); return 'read'; } catch (e) { return 'blocked: ' + e; }
}"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args):
        pass


@pytest.fixture
def page_origin():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_page_of_another_origin_fetches_ranges_and_the_whole_trace(browser, page_origin, tmp_path):  # noqa: F811
    data = os.urandom(64 * 1024)
    trace = tmp_path / "merged.tar"
    trace.write_bytes(data)
    page = browser.new_page()
    page.set_default_timeout(60_000)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_origin + "/", wait_until="load")

    server = TraceServer(str(trace), port=0, origin=page_origin, timeout_s=120).start()
    got = page.evaluate(FETCH, server.url)
    assert got["partStatus"] == 206 and got["contentRange"] == f"bytes 100-163/{len(data)}"
    assert got["part"] == data[100:164].hex()
    assert got["status"] == 200 and got["length"] == str(len(data)) and got["body"] == data.hex()
    assert server.wait() == "fetched" and server.requests >= 2  # stopped by itself, once the file was fetched

    other = TraceServer(str(trace), port=0, timeout_s=120).start()  # allows https://ui.perfetto.dev only
    try:
        assert page.evaluate(BLOCKED, other.url).startswith("blocked: TypeError")
    finally:
        other.stop()
    assert not errors
    page.close()
