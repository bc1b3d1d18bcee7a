"""What the CLI's verbs share besides their tables (:mod:`distprof.report.terminal`): how a verb ends in one JSON object
(its result, or a failure's ``errors``), what counts as the user's error rather than a bug, progress on stderr,
and where an output goes when ``-o`` is left out. Only :mod:`distprof.cli` imports it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from distprof.report import terminal as render

__all__ = ["BadArgument", "default_report_path", "failure_doc", "input_error", "print_json", "progress_bar"]


class BadArgument(Exception):
    """An argument the verb cannot use (a bad selection, a missing option): one line, exit 2."""


def bad_argument_if_invalid(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, its ValueError (an argument the library refuses) turned into :class:`BadArgument`."""
    try:
        return fn(*args)
    except ValueError as e:
        raise BadArgument(str(e)) from None


def input_error(e: Exception) -> bool:
    """Unreadable input or a bad argument (exit 2), as opposed to a bug (exit 3)."""
    from distprof.trace.source import TraceError

    return isinstance(e, (TraceError, BadArgument))


# --json when a verb fails before it has a result: one object all the same, with the keys that make sense for
# the verb (the analysis verbs' shared envelope; check's, validate's and trigger's own).
_ENVELOPE = {"salvaged": [], "conflicts": [], "warnings": [], "skipped": 0, "files_read": 0}
_FAILED = {"check": lambda kw: {"run_dir": kw.get("run_dir"), "ok": False, "roles": [], "items": [], "problems": [],
                                "notes": []},
           "validate": lambda kw: {"file": kw.get("file"), "dialect": kw.get("dialect"), "valid": False,
                                   "warnings": []},
           "trigger": lambda kw: {"run_dir": kw.get("run_dir"), "requests": [], "warnings": []}}
_INPUTS = ("path", "a", "b", "run_dir", "file", "compare", "out")


def failure_doc(verb: str, kwargs: dict[str, Any], e: Exception, internal: bool) -> dict[str, Any]:
    """The one JSON object of a verb that ends without a result: ``errors`` (``[{"path", "message"}]``) and the keys
    every such object of the verb has. An internal error is one entry with ``path`` null, and ``internal_error``."""
    message = render.plain(e)
    if internal:
        text = f"internal error: {type(e).__name__}: {message} (a bug in distprof; run with --debug for the traceback)"
        errors = [{"path": None, "message": text}]
    else:
        errors = [x for x in getattr(e, "errors", None) or [] if isinstance(x, dict)]  # per file, when known
        if not errors:
            # The path the message is about (messages start with it); else the verb's input for unreadable input,
            # none for a bad argument.
            given = [str(kwargs[k]) for k in _INPUTS if kwargs.get(k)]
            path = next((p for p in given if message.startswith((p + ":", p + " "))),
                        None if isinstance(e, BadArgument) or not given else given[0])
            errors = [{"path": path, "message": message}]
    doc = _FAILED[verb](kwargs) if verb in _FAILED else dict(_ENVELOPE)
    doc["errors"] = errors
    if verb == "check":
        doc["error"] = errors[0]["message"]
    if internal:
        doc["internal_error"] = f"{type(e).__name__}: {message}"
    return doc


def print_json(obj, code: int) -> None:
    """--json: one JSON object on stdout, then exit with ``code``."""
    import msgspec

    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    raise typer.Exit(code)


def progress_bar(err: Console):
    """A progress bar on stderr counting bytes read and files finished (so one big file still moves it); drawn only
    once there is a file to read (a run directory with telemetry and no trace draws none)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    bar = Progress(TextColumn("reading {task.fields[files]} traces"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeElapsedColumn(), console=err, transient=True)
    task = bar.add_task("read", total=None, files="", visible=False)

    def show(p) -> None:
        bar.update(task, completed=p.bytes_done, total=p.bytes_total or None, files=f"{p.files_done}/{p.files_total}",
                   visible=p.files_total > 0)

    return bar, show


def default_report_path(path: str) -> str:
    """Where ``report`` writes without ``-o``: ``PATH/report.html`` for a folder (beside the traces, where ``demo``
    puts it), ``NAME.report.html`` beside a single local trace (``rank-0.pt.trace.json.gz`` ->
    ``rank-0.pt.trace.report.html``), ``./report.html`` for a URL (report writes local files only)."""
    from distprof.rundir.layout import is_url

    if is_url(path):
        return "report.html"
    local = path.removeprefix("file://")
    if os.path.isdir(local):
        return os.path.join(local, "report.html")
    folder, name = os.path.split(local)
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
            break
    return os.path.join(folder, f"{name}.report.html")
