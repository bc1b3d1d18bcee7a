"""``distprof watch RUN_DIR``: the watcher (:mod:`distprof.analysis.watch`) from the command line, live in the
terminal (:mod:`distprof.report.watchview`), as log lines (``--quiet``: what the in-job watcher runs), or as one
snapshot (``--once``, ``--json``). Registered on the CLI's app by :func:`register` (``distprof.cli``).

Exit codes as every verb: 0 (every rank's stream read; also when another watcher already records this run
directory: this one says so and leaves), 1 (some streams could not be read), 2 (no telemetry in RUN_DIR, or bad
arguments: one line naming the path and the fix).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from distprof.analysis.watch import Snapshot, Watcher, options_from_config, options_from_run
from distprof.analysis.watch_metrics import MetricsServer, metrics_text
from distprof.cli_support import BadArgument, print_json
from distprof.report import watchview
from distprof.rundir.layout import TELEMETRY

__all__ = ["register"]

logger = logging.getLogger("distprof.analysis.watch")


def _trigger_send(run_dir: str) -> Callable[[str, list[int], int, int], str]:
    """The watcher's ``send``: a trigger request for ``ranks`` of ``role`` (distprof.capture.trigger)."""
    # Kept here: capture.trigger validates ranks with config.model (pydantic); only a capturing watcher needs it.
    from distprof.capture.trigger import send

    def request(role: str, ranks: list[int], steps: int, lead_steps: int) -> str:
        req, _ = send(run_dir, steps=steps, ranks=ranks, roles=[role], lead_steps=lead_steps, align=1,
                      tag=f"watch {time.time():.6f}")  # a new request each time, never an old one's windows
        return req.id

    return request


def _trigger_answers(run_dir: str) -> Callable[[str], dict[tuple[str, int], str]]:
    from distprof.capture.trigger import status

    def answers(rid: str) -> dict[tuple[str, int], str]:
        got = status(run_dir, rid)
        return {(a["role"], a["rank"]): a["state"] for r in got["requests"] for a in r["acks"]}

    return answers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


class _Stop(Exception):
    """Raised by the SIGTERM handler in the pause between two reads only (never inside a read or a write)."""


class _Term:
    """SIGTERM asks the live loop to stop after one last look (:func:`_live`), in the pause between reads or
    after the read in progress: a detection being written or diagnosed is never cut."""

    def __init__(self) -> None:
        self.asked, self._sleeping, self._raised, self._old = False, False, False, None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handler)
            # the in-job watcher starts with SIGTERM blocked (capture/watchproc.py): one sent while it started
            # is delivered now, to this handler
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def _handler(self, signum: int, frame: Any) -> None:
        self.asked = True
        if self._sleeping and not self._raised:  # once: wherever it lands in sleep(), sleep() catches it
            self._raised = True
            raise _Stop

    def sleep(self, seconds: float) -> None:
        try:
            self._sleeping = True
            try:
                if not self.asked:
                    time.sleep(seconds)
            finally:
                self._sleeping = False
        except _Stop:
            self._sleeping = False

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


def _wait_for_folder(run_dir: str, parent_pid: int, max_seconds: float | None, term: _Term) -> None:
    """While ``parent_pid`` lives (and ``max_seconds`` allow, and no SIGTERM came), wait for ``run_dir`` to exist:
    the job that started this watcher creates it with its first telemetry (a long first step: seconds, minutes)."""
    deadline = time.monotonic() + max_seconds if max_seconds is not None else None
    while not os.path.lexists(run_dir) and _alive(parent_pid) and not term.asked:
        if deadline is not None and time.monotonic() >= deadline:
            return
        term.sleep(0.5)  # the pause between looks for the folder (nothing is waited for)


def _job_options(text: str) -> tuple[Any, dict[str, Any]]:
    """``--job-config``: the detection options and the config they came from."""
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--job-config is not JSON ({e}); the in-job watcher passes the job's settings") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"--job-config is {cfg!r:.80}; it must be a JSON object of the job's settings")
    return options_from_config(cfg, "--job-config"), cfg


def _doc(snap: Snapshot, options: Any) -> dict[str, Any]:
    return {**snap.to_dict(), "options": options.model_dump()}


def _no_telemetry(run_dir: str) -> BadArgument:
    return BadArgument(f"{run_dir}: no telemetry ({'{role}'}/rank*/{TELEMETRY}); set telemetry: true in the job's "
                       "config (and save_path to this folder)")


def register(app: typer.Typer, guarded: Callable[[Callable[..., Any]], Callable[..., Any]], console: Console,
             err: Console) -> None:
    """Add ``watch`` to ``app`` (``guarded``: the CLI's wrapper that turns errors into exit codes)."""

    @app.command()
    @guarded
    def watch(
        run_dir: str = typer.Argument(..., help="The job's save_path (a local or mounted run directory)."),
        interval: float | None = typer.Option(None, "--interval", min=0.05,
                                              help="Seconds between reads (default: the run's detection.poll_s)."),
        once: bool = typer.Option(False, "--once", help="One snapshot, then exit (judges and shows; records "
                                                        "nothing, captures nothing)."),
        as_json: bool = typer.Option(False, "--json", help="One snapshot as one JSON object (implies --once)."),
        capture: bool | None = typer.Option(None, "--capture/--no-capture", help="Capture the slow rank and a peer "
                                            "on a detection (default: the run's detection.capture and trigger)."),
        max_seconds: float | None = typer.Option(None, "--max-seconds", min=0.0, help="Stop after this long."),
        parent_pid: int | None = typer.Option(None, "--parent-pid", help="Stop when this process is gone (the in-job "
                                              "watcher passes the training process)."),
        quiet: bool = typer.Option(False, "--quiet", help="No live view: log lines only."),
        prometheus: int | None = typer.Option(None, "--prometheus", min=0, max=65535, metavar="PORT",
                                              help="Serve Prometheus text on 127.0.0.1:PORT/metrics (0: any free "
                                                   "port; default: the run's detection.prometheus_port)."),
        job_config: str | None = typer.Option(None, "--job-config", hidden=True, help="The job's telemetry, "
                                              "trigger and detection settings as JSON, instead of run.json's (the "
                                              "in-job watcher: a job that only detects writes no run.json)."),
    ) -> None:
        """Watch a running job's step telemetry: the step time per rank, the slowest rank, and the rules'
        detections; on a detection capture the slow rank and a healthy peer and diagnose them (docs/telemetry.md).
        """
        term = _Term() if not (once or as_json) else None  # SIGTERM: stop after one last look (_live)
        try:
            _watch(run_dir, interval, once or as_json, as_json, capture, max_seconds, parent_pid, quiet, prometheus,
                   job_config, term, console, err)
        finally:
            if term is not None:
                term.restore()


def _watch(run_dir: str, interval: float | None, once: bool, as_json: bool, capture: bool | None,
           max_seconds: float | None, parent_pid: int | None, quiet: bool, prometheus: int | None,
           job_config: str | None, term: _Term | None, console: Console, err: Console) -> None:
    if parent_pid is not None and term is not None:  # started with the job: its save_path appears with the
        _wait_for_folder(run_dir, parent_pid, max_seconds, term)  # first flushed steps
    if not os.path.isdir(run_dir):
        raise BadArgument(f"{run_dir}: not a folder; give the job's save_path (a run directory with telemetry)")
    try:
        options, cfg = _job_options(job_config) if job_config is not None else options_from_run(run_dir)
    except ValueError as e:
        raise BadArgument(str(e)) from None
    once = once or as_json
    if capture is None:
        capture = bool(options.capture and cfg.get("trigger"))
    want_capture = capture and not once
    w = Watcher(run_dir, options, send=_trigger_send(run_dir) if want_capture else None,
                answers=_trigger_answers(run_dir) if want_capture else None, capture=want_capture,
                record=not once, job_poll_s=float(cfg.get("trigger_poll_s") or 0.0))
    if once:
        snap = w.poll(final=True)
        if not snap.roles and not snap.errors:
            raise _no_telemetry(run_dir)
        code = (1 if snap.roles else 2) if snap.errors else 0
        if as_json:
            print_json(_doc(snap, options), code)
        console.print(watchview.view(snap))
        raise typer.Exit(code)
    try:
        locked = w.lock()
    except ValueError as e:
        raise BadArgument(str(e)) from None
    if not locked:
        err.print(Text(f"another watcher ({w.lock_holder()}) already records {run_dir}; this one exits"),
                  soft_wrap=True)
        raise typer.Exit(0)
    try:
        code = _live(w, run_dir, cfg, options, interval, max_seconds, parent_pid, quiet, prometheus, console,
                     term)
    finally:
        w.close()
    raise typer.Exit(code)


def _ends(deadline: float | None, parent_pid: int | None, term: _Term) -> bool:
    """The live loop ends now: past the deadline, the parent gone, or SIGTERM."""
    if deadline is not None and time.monotonic() >= deadline:
        return True
    if parent_pid is not None and not _alive(parent_pid):
        logger.info("distprof: watch: process %d is gone; the watcher stops", parent_pid)
        return True
    return term.asked


def _metrics_server(port: int, latest: list[Snapshot]) -> MetricsServer | None:
    """The Prometheus endpoint on the latest snapshot; None (one warning) when the port is in use: the watcher still
    watches (the in-job one must not die of it)."""
    try:
        return MetricsServer(port, lambda: metrics_text(latest[-1]) if latest else "").start()
    except OSError as e:
        logger.warning("distprof: watch: cannot serve Prometheus metrics on 127.0.0.1:%d (%s); watching without "
                       "them", port, e)
        return None


def _live(w: Watcher, run_dir: str, cfg: dict[str, Any], options: Any, interval: float | None,
          max_seconds: float | None, parent_pid: int | None, quiet: bool, prometheus: int | None,
          console: Console, term: _Term | None = None) -> int:
    """Poll until the deadline, the parent's end or Ctrl-C; the exit code of the last snapshot."""
    if logger.getEffectiveLevel() > logging.INFO:  # the watcher's lines (detections, captures, findings) are news
        logger.setLevel(logging.INFO)
        logging.getLogger("distprof.analysis.watch_metrics").setLevel(logging.INFO)
    interval = interval if interval is not None else float(options.poll_s)
    deadline = time.monotonic() + max_seconds if max_seconds is not None else None
    port = prometheus if prometheus is not None else options.prometheus_port
    latest: list[Snapshot] = []
    server = _metrics_server(port, latest) if port is not None else None
    live, snap = None, None
    if not quiet:
        from rich.live import Live

        live = Live(console=console, auto_refresh=False, transient=False)
        live.start()
    term = term or _Term()
    try:
        while True:
            snap = w.poll()
            latest[:] = [snap]
            if not snap.roles and not snap.errors and not cfg.get("telemetry") and parent_pid is None:
                raise _no_telemetry(run_dir)
            if live is not None:
                live.update(watchview.view(snap), refresh=True)
            if _ends(deadline, parent_pid, term):
                break
            wait = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
            term.sleep(wait)  # the pause between reads of the streams (nothing is waited for)
        if term.asked:  # SIGTERM (the profiler's stop()): one last look at what the ranks flushed on their way out
            term.restore()  # a second SIGTERM ends the process at once
            logger.info("distprof: watch: asked to stop; one last look at %s", run_dir)
            snap = w.poll()
            latest[:] = [snap]
    except KeyboardInterrupt:
        pass
    finally:
        term.restore()
        if live is not None:
            live.stop()
        if server is not None:
            server.stop()
    if snap is None:
        return 0
    return (1 if snap.roles else 2) if snap.errors else 0
