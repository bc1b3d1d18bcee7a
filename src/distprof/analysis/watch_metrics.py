"""The watcher's live numbers as Prometheus text (``distprof watch --prometheus PORT``, ``detection.prometheus_port``).

Off by default. :class:`MetricsServer` serves ``GET /metrics`` on 127.0.0.1 only (the standard library's
http.server, in a daemon thread): a scraper on the node reads it, nothing off the node can. Port 0 takes a free
port (:attr:`MetricsServer.port` says which). The metrics, from the last :class:`~.watch.Snapshot`::

    distprof_step_seconds{role="actor",rank="3"} 0.0213   the rank's last step time
    distprof_slowest_rank{role="actor"} 3                  the busiest rank over the steps shown
    distprof_detections_total{rule="slow_rank"} 1          detections per rule (recorded, or seen by this view)
    distprof_captures_total 1                              capture requests the watcher sent
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Callable

from distprof.analysis.watch import Snapshot

logger = logging.getLogger(__name__)

__all__ = ["MetricsServer", "metrics_text"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(v: object) -> str:
    """A label value in the text format: backslash, quote and newline escaped."""
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(s: Snapshot) -> str:
    lines = ["# HELP distprof_step_seconds The rank's last step time (telemetry).",
             "# TYPE distprof_step_seconds gauge"]
    for r in s.roles:
        for row in r.ranks:
            if row.last_us is not None:
                lines.append(f'distprof_step_seconds{{role="{_label(r.role)}",rank="{row.rank}"}} '
                             f"{row.last_us / 1e6:.6f}")
    lines += ["# HELP distprof_slowest_rank The busiest rank of the role over the last steps.",
              "# TYPE distprof_slowest_rank gauge"]
    for r in s.roles:
        if r.slowest_rank is not None:
            lines.append(f'distprof_slowest_rank{{role="{_label(r.role)}"}} {r.slowest_rank}')
    lines += ["# HELP distprof_detections_total Detections per rule.", "# TYPE distprof_detections_total counter"]
    lines += [f'distprof_detections_total{{rule="{_label(k)}"}} {v}' for k, v in s.detections_total.items()]
    lines += ["# HELP distprof_captures_total Capture requests sent on detections.",
              "# TYPE distprof_captures_total counter", f"distprof_captures_total {s.captures_total}"]
    return "\n".join(lines) + "\n"


class MetricsServer:
    """``GET /metrics`` on 127.0.0.1:``port`` answering ``text()`` (the CLI passes the latest snapshot's text)."""

    def __init__(self, port: int, text: Callable[[], str]) -> None:
        source = text

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 10  # a client that sends nothing (or too slowly) is dropped: its thread ends

            def do_GET(self) -> None:  # http.server's name
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                try:
                    body = source().encode()
                except Exception as e:  # a bug in the text must not end the thread
                    logger.debug("distprof: watch: metrics failed", exc_info=True)
                    self.send_error(500, type(e).__name__)
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # http.server's names
                return  # a scrape every few seconds is not news

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="distprof-metrics", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        logger.info("distprof: watch: Prometheus metrics on http://127.0.0.1:%d/metrics", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
