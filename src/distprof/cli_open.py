"""``distprof open PATH``: one trace file or a ``merge --format perfetto`` archive, served on loopback for the Perfetto
UI (:class:`distprof.report.viewer.TraceServer`), its link printed (and opened in a browser unless
``--no-browser``). Registered on the CLI's app by :func:`register` (``distprof.cli``).

Exit codes as every verb: 0 (the UI fetched the whole file), 1 (it stopped before that: the timeout or Ctrl-C),
2 (bad arguments: a path that is not a regular file, a port that is taken; one line naming the path and the fix).
"""

from __future__ import annotations

import webbrowser
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from distprof.cli_support import BadArgument, print_json
from distprof.report.viewer import DEFAULT_PORT, UI_ORIGIN, TraceServer

__all__ = ["register"]


def register(app: typer.Typer, guarded: Callable[[Callable[..., Any]], Callable[..., Any]], console: Console,
             err: Console) -> None:
    """Add the ``open`` verb to ``app`` (``guarded``: the CLI's wrapper for exit codes and one-line errors)."""

    @app.command("open")
    @guarded
    def open_(
        path: str = typer.Argument(..., help="One trace file (.json, .json.gz) or a merged archive (merge --format "
                                             "perfetto -o merged.tar)."),
        port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535,
                                 help="Loopback port (ui.perfetto.dev fetches only from 127.0.0.1:9001; 0: any free)."),
        origin: str = typer.Option(UI_ORIGIN, "--origin", help="The Perfetto UI to open it in (a self-hosted one)."),
        no_browser: bool = typer.Option(False, "--no-browser", help="Print the link; do not start a browser."),
        timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Stop after this many seconds if not fetched."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object when done: url, link, reason."),
    ) -> None:
        """Open a trace in the Perfetto UI: serve it on 127.0.0.1 (CORS for the UI, byte ranges), print the link
        that opens it, and stop once the UI has fetched it, after --timeout, or on Ctrl-C."""
        try:
            server = TraceServer(path, port=port, origin=origin, timeout_s=timeout)
        except ValueError as e:
            raise BadArgument(str(e)) from None
        try:
            server.start()
        except OSError as e:
            raise BadArgument(f"--port {port}: cannot listen on 127.0.0.1:{port} ({e.strerror or e}); stop what "
                              "uses it (trace_processor --httpd?) or give another --port") from None
        err.print(Text(f"Serving {server.path} ({server.size:,} bytes) at {server.url} until the UI has fetched "
                       "it (Ctrl-C stops)."), soft_wrap=True)
        (err if as_json else console).print(Text(f"Open in Perfetto: {server.link}"), soft_wrap=True)  # stdout: JSON
        if port != DEFAULT_PORT and origin == UI_ORIGIN:
            err.print(Text(f"note: {UI_ORIGIN} fetches only from 127.0.0.1:{DEFAULT_PORT}; with --port {server.port} "
                           "use a UI that allows it (--origin)"), style="yellow", soft_wrap=True)
        if not no_browser:
            webbrowser.open_new_tab(server.link)
        try:
            reason = server.wait()
        except KeyboardInterrupt:
            server.stop("interrupted")
            reason = "interrupted"
        code = 0 if reason == "fetched" else 1
        err.print(Text({"fetched": "The UI fetched the trace; stopped.",
                        "timeout": f"Nothing fetched the whole trace within {timeout:g} s; stopped.",
                        }.get(reason, "Stopped.")), soft_wrap=True)
        if as_json:
            print_json({"errors": [], "path": server.path, "bytes": server.size, "url": server.url,
                        "link": server.link, "reason": reason, "requests": server.requests}, code)
        raise typer.Exit(code)
